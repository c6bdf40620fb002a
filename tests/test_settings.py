"""kafka_iceberg.config.settings: every variable read in one place, built once per environment, typed groups
(streaming, Slack, Schema Registry) with clear errors for malformed values."""

from __future__ import annotations

import logging

import pytest

from kafka_iceberg.config.models import DevHooks
from kafka_iceberg.config.settings import (
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


def test_the_worker_count_is_unset_by_default_and_at_least_one():
    assert load_settings(env={}).stream.workers is None, "derived from the catalog (batch/worker.py worker_count)"
    assert load_settings(env={"LAKE_WORKERS": "3"}).stream.workers == 3
    with pytest.raises(ConfigError, match="LAKE_WORKERS"):
        load_settings(env={"LAKE_WORKERS": "0"})


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
            "LAKE_SCHEMA_REGISTRY_CONFIG": '{"bearer.auth.token": "t0k", "bearer.auth.logical.cluster": "lsrc-1", '
            '"ssl.ca.location": "/ca.pem"}'
        }
    )
    conf = client_config("http://r:1", bearer)
    assert conf["bearer.auth.token"] == "t0k" and conf["bearer.auth.logical.cluster"] == "lsrc-1"
    assert conf["bearer.auth.credentials.source"] == "STATIC_TOKEN"
    assert conf["ssl.ca.location"] == "/ca.pem" and "basic.auth.user.info" not in conf
    assert "t0k" not in repr(bearer), "the properties are a secret"
    basic = client_config(
        "http://r:1", registry_settings({"LAKE_SCHEMA_REGISTRY_CONFIG": '{"basic.auth.user.info": "u:p"}'})
    )
    assert basic["basic.auth.user.info"] == "u:p" and "bearer.auth.token" not in basic
    with pytest.raises(ConfigError, match="^LAKE_SCHEMA_REGISTRY_CONFIG must be a JSON object") as caught:
        registry_settings({"LAKE_SCHEMA_REGISTRY_CONFIG": "u:s3cret"})
    assert "s3cret" not in str(caught.value), "an error never repeats a secret"


def test_env_references_and_run_catalog(monkeypatch, tmp_path):
    assert expand_env_references("http://${H}:${P}", "url", {"H": "reg", "P": "8081"}) == "http://reg:8081"
    with pytest.raises(ConfigError, match="environment variable P is not set"):
        expand_env_references("http://${H}:${P}", "url", {"H": "reg", "P": " "})
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


def _variables() -> dict[str, list[str]]:
    """{settings group name: [its variables]}: every pydantic-settings group of kafka_iceberg.config.models."""
    from kafka_iceberg.config import models

    groups = [g for g in vars(models).values() if isinstance(g, type) and issubclass(g, models.EnvGroup)]
    found = {}
    for group in groups:
        if group is models.EnvGroup:
            continue
        for name, field in group.model_fields.items():
            var = field.validation_alias
            assert field.description and field.description.startswith(f"{var}: "), f"{group.__name__}.{name}"
            found.setdefault(group.__name__, []).append(var)
    return found


def _documented() -> set[str]:
    """The variables of docs/configuration.md's settings tables (first column, in backticks)."""
    import re
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", docs, re.M))


def test_every_variable_is_a_model_field_documented_in_configuration_md():
    """docs/configuration.md lists exactly the variables the models read (the nine removed elsewhere aside)."""
    from pathlib import Path

    groups = _variables()
    hooks = groups.pop("DevSettings")  # LAKE_DEV_HOOKS, the LAKE_DEV-only test hooks: in the text, not the table
    variables = [v for vs in groups.values() for v in vs]
    assert len(variables) == len(set(variables))
    docs = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    assert hooks == ["LAKE_DEV_HOOKS"] and "`LAKE_DEV_HOOKS`" in docs, hooks
    assert all(f"`{key}`" in docs for key in DevHooks.model_fields), "each hook's key is named in the text"
    documented = _documented() - {"LAKE_CRASH_AT"}  # the rehearsal's hook, read by devtools only
    assert set(variables) - documented == set(), "in the code, not in docs/configuration.md"
    assert documented - set(variables) == set(), "in docs/configuration.md, read by no model"


LAKE_SETTINGS = {
    "LAKE_HOME",
    "LAKE_TABLES_FILE",
    "LAKE_DEFS_MODULE",
    "LAKE_DEV",
    "LAKE_CATALOG_NAME",
    "LAKE_CATALOG_URI",
    "LAKE_CATALOG_PROPERTIES",
    "LAKE_CATALOG_SECRETS_DIR",
    "LAKE_WAREHOUSE",
    "LAKE_SPARK_CONF",
    "LAKE_KAFKA_TIMEOUT_S",
    "LAKE_MAX_RECORDS_PER_TASK",
    "LAKE_DAGSTER_EXECUTOR",
    "LAKE_WORKERS",
    "LAKE_METRICS_PORT",
    "LAKE_SCHEMA_REGISTRY_URL",
    "LAKE_SCHEMA_REGISTRY_CONFIG",
    "LAKE_DEV_HOOKS",
}
"""Every LAKE_* variable the product reads (LAKE_CRASH_AT, the rehearsal's, is read by devtools only)."""


def _product_lake_names() -> set[str]:
    """The LAKE_* names in the source of the product packages (string literals and docstrings alike)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    names: set[str] = set()
    for package in ("kafka_iceberg", "lake_assets", "resources", "sensors", "schedules"):
        for path in (root / package).rglob("*.py"):
            names |= set(re.findall(r"\bLAKE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    return names - {"LAKE_CRASH_AT", "LAKE_KEYS"}  # the rehearsal's hook; a Python constant (resource keys)


def test_the_product_has_at_most_twenty_lake_settings():
    """The LAKE_* variables the models read are exactly :data:`LAKE_SETTINGS`, at most 20 (the LAKE_DEV-only
    test hooks are the one LAKE_DEV_HOOKS), and the product's source names no other LAKE_* variable."""
    every = {v for vs in _variables().values() for v in vs if v.startswith("LAKE_")}
    assert every == LAKE_SETTINGS and len(every) <= 20, sorted(every)
    assert _product_lake_names() <= LAKE_SETTINGS, sorted(_product_lake_names() - LAKE_SETTINGS)


def test_dev_hooks_apply_only_under_lake_dev(monkeypatch, tmp_path):
    env = {"LAKE_DEV_HOOKS": "attempt_timeout_s=5, read_timeout_s=30", "LAKE_HOME": str(tmp_path)}
    dev = load_settings(env={**env, "LAKE_DEV": "1"})
    assert (dev.attempt_timeout_s, dev.read_timeout_s, dev.catalog_retry_s) == (5.0, 30.0, 60.0), "unset keys: default"
    assert DevHooks(read_timeout_s=30, catalog_retry_s=1.5).env_value() == "read_timeout_s=30,catalog_retry_s=1.5"
    monkeypatch.delenv("LAKE_DEV", raising=False)
    deployed = {
        **env,
        "KAFKA_BOOTSTRAP_SERVERS": "k:1",
        "LAKE_CATALOG_URI": "postgresql://u@db/c",
        "LAKE_WAREHOUSE": "s3://b",
    }
    settings = load_settings(env=deployed)
    assert (settings.attempt_timeout_s, settings.read_timeout_s, settings.orphan_clock_skew_s) == (3600.0, 120.0, 1.0)


def test_malformed_values_name_their_variable():
    for env, message in [
        (
            {"LAKE_DAGSTER_EXECUTOR": "fast"},
            "LAKE_DAGSTER_EXECUTOR must be one of 'in_process', 'multiprocess' or 'k8s', got 'fast'",
        ),
        ({"LAKE_MAX_RECORDS_PER_TASK": "many"}, "LAKE_MAX_RECORDS_PER_TASK must be a whole number, got 'many'"),
        ({"LAKE_DEV_HOOKS": "catalog_retry_s=-1"}, "LAKE_DEV_HOOKS catalog_retry_s must not be negative, got '-1'"),
        ({"LAKE_DEV_HOOKS": "read_timeout_s=soon"}, "LAKE_DEV_HOOKS read_timeout_s must be a number, got 'soon'"),
        ({"LAKE_DEV_HOOKS": "retry=2"}, "LAKE_DEV_HOOKS has an unknown key 'retry' (known: attempt_timeout_s, "),
        ({"LAKE_DEV_HOOKS": "read_timeout_s"}, "LAKE_DEV_HOOKS has 'read_timeout_s', not key=seconds"),
        ({"LAKE_DEV_HOOKS": "read_timeout_s=1,read_timeout_s=2"}, "LAKE_DEV_HOOKS sets 'read_timeout_s' twice"),
        ({"LAKE_SPARK_CONF": "{oops"}, "LAKE_SPARK_CONF must be a JSON object: "),
        ({"LAKE_WORKERS": "300"}, "LAKE_WORKERS must be <= 256, got '300'"),
    ]:
        with pytest.raises(ConfigError) as caught:
            load_settings(env=env)
        assert str(caught.value).startswith(message), str(caught.value)
    conf = '{"spark.jars": "/a.jar, ,/b.jar", "spark.driver.memory": "3g", "spark.executor.cores": "1"}'
    settings = load_settings(env={"LAKE_SPARK_CONF": conf, "KAFKA_CLIENT_CONFIG": '{"linger.ms": 5}'})
    assert settings.spark_extra_jars == ("/a.jar", "/b.jar") and settings.kafka_client_config == {"linger.ms": "5"}
    assert settings.spark_driver_memory == "3g" and settings.spark_conf == {"spark.executor.cores": "1"}
    assert load_settings(env={}).spark_driver_memory == "2g", "the default driver heap"
    assert load_settings(env={"LAKE_WORKERS": ""}).stream.workers is None, "empty means unset"


def test_outside_lake_dev_the_broker_catalog_and_tables_must_be_set(monkeypatch, tmp_path):
    """No development default in an installed package: each missing choice is one ConfigError naming it."""
    from kafka_iceberg.config.settings import require_declared_tables

    monkeypatch.delenv("LAKE_DEV", raising=False)
    wh = f"file://{tmp_path}/wh"
    full = {
        "LAKE_HOME": str(tmp_path),
        "KAFKA_BOOTSTRAP_SERVERS": "k:9092",
        "LAKE_CATALOG_URI": "postgresql://u@db:5432/ice",
        "LAKE_WAREHOUSE": wh,
    }
    settings = load_settings(env=full)
    assert not settings.dev and not settings.use_dev_broker and not settings.tables_declared
    with pytest.raises(ConfigError, match=r"^LAKE_TABLES_FILE \(or LAKE_DEFS_MODULE\) is not set"):
        require_declared_tables(settings)
    require_declared_tables(load_settings(env={**full, "LAKE_DEFS_MODULE": "team.defs"}))
    for drop, named in [
        ("KAFKA_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS is not set"),
        ("LAKE_CATALOG_URI", r"LAKE_CATALOG_PROPERTIES \(or LAKE_CATALOG_URI\) is not set"),
        ("LAKE_WAREHOUSE", "LAKE_WAREHOUSE is not set"),
    ]:
        with pytest.raises(ConfigError, match=f"^{named}"):
            load_settings(env={k: v for k, v in full.items() if k != drop})
    sqlite_on_s3 = {**full, "LAKE_CATALOG_URI": f"sqlite:///{tmp_path}/c.db", "LAKE_WAREHOUSE": "s3://b/w"}
    with pytest.raises(ConfigError, match="^LAKE_CATALOG_URI names a local SQLite catalog"):
        load_settings(env=sqlite_on_s3)
    assert load_settings(env={**sqlite_on_s3, "LAKE_WAREHOUSE": wh}).catalog.is_sqlite  # a local warehouse is fine
    # LAKE_DEV=1 (the make targets, workspace.yaml, the tests) brings the defaults back
    dev = load_settings(env={"LAKE_HOME": str(tmp_path), "LAKE_DEV": "1"})
    assert dev.use_dev_broker and dev.catalog.is_sqlite and dev.tables_declared
    assert dev.defs_module == "kafka_iceberg.defs"
    assert not (tmp_path / "catalog.db").exists(), "reading settings opens no catalog"
