"""kafka_iceberg.config.settings: every variable read in one place, built once per environment, typed groups
(streaming, Slack, Schema Registry) with clear errors for malformed values."""

from __future__ import annotations

import logging

import pytest

from kafka_iceberg.config.settings import (
    debug_enabled,
    expand_env_references,
    load_settings,
    registry_settings,
    run_catalog,
    slack_settings,
)
from kafka_iceberg.errors import ConfigError
from kafka_iceberg.formats import client_config


def test_settings_are_built_once_per_environment_and_anew_when_it_changes(monkeypatch, tmp_path):
    monkeypatch.setenv("LAKE_HOME", str(tmp_path))
    first = load_settings()
    assert load_settings() is first, "every caller of a run shares one Settings"
    monkeypatch.setenv("LAKE_TABLES_FILE", str(tmp_path / "tables.yaml"))
    changed = load_settings()
    assert changed is not first and changed.tables_file == tmp_path / "tables.yaml"
    monkeypatch.delenv("LAKE_TABLES_FILE")
    assert load_settings().tables_file == first.tables_file
    assert load_settings(env={"LAKE_HOME": str(tmp_path)}) is not load_settings(env={"LAKE_HOME": str(tmp_path)})


def test_stream_settings_are_seconds_and_never_negative():
    stream = load_settings(env={"LAKE_STREAM_BUDGET_S": "45", "LAKE_STREAM_IDLE_S": "0.5"}).stream
    assert (stream.budget_s, stream.idle_s) == (45.0, 0.5)
    assert load_settings(env={}).stream.budget_s == 300.0 and load_settings(env={}).stream.idle_s == 2.0
    with pytest.raises(ConfigError, match="LAKE_STREAM_IDLE_S"):
        load_settings(env={"LAKE_STREAM_IDLE_S": "soon"})
    with pytest.raises(ConfigError, match="LAKE_STREAM_BUDGET_S"):
        load_settings(env={"LAKE_STREAM_BUDGET_S": "-5"})
    assert load_settings(env={}).stream.check_niceness == 10
    with pytest.raises(ConfigError, match="LAKE_CHECK_NICENESS"):
        load_settings(env={"LAKE_CHECK_NICENESS": "20"})  # Linux's lowest priority is 19


def test_slack_settings_never_raise_and_hide_the_token(caplog):
    slack = slack_settings({"SLACK_BOT_TOKEN": "xoxb-secret", "SLACK_CHANNEL": "#c", "DAGSTER_UI_URL": "http://ui:1"})
    assert slack.token.get_secret_value() == "xoxb-secret" and "xoxb-secret" not in repr(slack)
    assert (slack.channel, slack.ui_url) == ("#c", "http://ui:1")
    with caplog.at_level(logging.ERROR):
        assert slack_settings({"SLACK_TIMEOUT_S": "0", "SLACK_CHANNEL": "#c"}).timeout_s == 10.0
    assert "SLACK_TIMEOUT_S" in caplog.text
    assert slack_settings({"SLACK_TIMEOUT_S": "0", "SLACK_CHANNEL": "#c"}).channel == "#c"
    assert load_settings(env={"DAGSTER_UI_URL": "http://ui:2"}).dagster_ui_url == "http://ui:2"


def test_registry_credentials_reach_the_client_config():
    bearer = registry_settings(
        {
            "LAKE_SCHEMA_REGISTRY_BEARER_TOKEN": "t0k",
            "LAKE_SCHEMA_REGISTRY_LOGICAL_CLUSTER": "lsrc-1",
            "LAKE_SCHEMA_REGISTRY_CA": "/ca.pem",
        }
    )
    conf = client_config("http://r:1", bearer)
    assert conf["bearer.auth.token"] == "t0k" and conf["bearer.auth.logical.cluster"] == "lsrc-1"
    assert conf["ssl.ca.location"] == "/ca.pem" and "basic.auth.user.info" not in conf
    basic = client_config("http://r:1", registry_settings({"LAKE_SCHEMA_REGISTRY_BASIC_AUTH": "u:p"}))
    assert basic["basic.auth.user.info"] == "u:p" and "bearer.auth.token" not in basic


def test_env_references_debug_and_run_catalog(monkeypatch, tmp_path):
    assert expand_env_references("http://${H}:${P}", "url", {"H": "reg", "P": "8081"}) == "http://reg:8081"
    with pytest.raises(ConfigError, match="environment variable P is not set"):
        expand_env_references("http://${H}:${P}", "url", {"H": "reg", "P": " "})
    assert debug_enabled({"LAKE_DEBUG": "1"}) and not debug_enabled({"LAKE_DEBUG": ""})
    uri = f"sqlite:///{tmp_path / 'catalog.db'}"
    cat = run_catalog("lake", uri, f"file://{tmp_path}/wh")
    assert (
        cat.jdbc_uri == f"jdbc:sqlite:{tmp_path / 'catalog.db'}"
        and run_catalog("lake", uri, f"file://{tmp_path}/wh") is cat
    )
    monkeypatch.setenv(
        "LAKE_CATALOG_PROPERTIES", '{"type": "sql", "uri": "%s"}' % uri
    )  # a changed environment: resolved anew
    assert run_catalog("lake", uri, f"file://{tmp_path}/wh") is not cat


def test_every_variable_is_a_model_field_documented_in_configuration_md():
    """Each settings field is read from the variable its description names, and docs/configuration.md lists it."""
    from pathlib import Path

    from kafka_iceberg.config import models

    docs = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    groups = [models.RuntimeSettings, models.StreamSettings, models.SlackSettings, models.RegistrySettings]
    variables = []
    for group in groups:
        for name, field in group.model_fields.items():
            var = field.validation_alias
            assert field.description and field.description.startswith(f"{var}: "), f"{group.__name__}.{name}"
            variables.append(var)
    assert len(variables) == len(set(variables)) >= 30
    missing = [v for v in variables if f"`{v}`" not in docs]
    assert missing == [], f"docs/configuration.md does not list {missing}"


def test_malformed_values_name_their_variable():
    for env, message in [
        (
            {"LAKE_DAGSTER_EXECUTOR": "fast"},
            "LAKE_DAGSTER_EXECUTOR must be one of 'in_process', 'multiprocess' or 'k8s', got 'fast'",
        ),
        ({"LAKE_MAX_RECORDS_PER_TASK": "many"}, "LAKE_MAX_RECORDS_PER_TASK must be a whole number, got 'many'"),
        ({"LAKE_CATALOG_RETRY_S": "-1"}, "LAKE_CATALOG_RETRY_S must not be negative, got '-1'"),
        ({"LAKE_SPARK_CONF": "{oops"}, "LAKE_SPARK_CONF must be a JSON object: "),
        ({"LAKE_WORKERS": "300"}, "LAKE_WORKERS must be <= 256, got '300'"),
    ]:
        with pytest.raises(ConfigError) as caught:
            load_settings(env=env)
        assert str(caught.value).startswith(message), str(caught.value)
    settings = load_settings(env={"LAKE_SPARK_JARS": "/a.jar, ,/b.jar", "KAFKA_CLIENT_CONFIG": '{"linger.ms": 5}'})
    assert settings.spark_extra_jars == ("/a.jar", "/b.jar") and settings.kafka_client_config == {"linger.ms": "5"}
    assert load_settings(env={"LAKE_STREAM_BUDGET_S": ""}).stream.budget_s == 300.0, "empty means unset"
