"""Slack alerts against a local recording HTTP server standing in for the Slack Web API.

Fast: no Spark, no Kafka. The run-failure sensor is evaluated on real failed runs executed
in an ephemeral Dagster instance (its episodes: tests/test_episodes.py).
"""

import json
import logging
import time

import pytest
from dagster import (
    DagsterInstance,
    Definitions,
    asset,
    build_sensor_context,
    define_asset_job,
    job,
    op,
)

from kafka_iceberg.ops.alerts import Alert, AlertSink, alert_on_check, asset_url, pick_measure
from kafka_iceberg.sensors.alerts import alert_on_check as reexported_alert_on_check
from kafka_iceberg.sensors.alerts import run_failure_alert_sensor

TOKEN = "xoxb-test-token"


def _sink(slack, **kw) -> AlertSink:
    env = {
        "SLACK_BOT_TOKEN": TOKEN,
        "SLACK_API_BASE_URL": slack.base_url,
        "SLACK_CHANNEL": "#lake-test",
        "DAGSTER_UI_URL": "http://dagster.example:3000/",
    }
    env.update(kw)
    return AlertSink.from_env(env)


def _alert() -> Alert:
    return Alert(
        table="nyc.flights",
        asset_key_path=["lake", "nyc", "flights"],
        measure="duplicate_offsets",
        value="3",
        severity="ERROR",
        summary="table nyc.flights has duplicates: 3 duplicate (partition, offset) records",
        source="check duplicate_free",
    )


def test_asset_url():
    assert (
        asset_url("http://127.0.0.1:3000/", ["lake", "nyc", "flights"])
        == "http://127.0.0.1:3000/assets/lake/nyc/flights"
    )
    assert asset_url("http://h:3000", ["kafka", "a b"]) == "http://h:3000/assets/kafka/a%20b"
    with pytest.raises(ValueError):
        asset_url("http://h", [])


def test_from_env_defaults():
    sink = AlertSink.from_env({})
    assert sink.token is None and not sink.configured
    assert sink.channel == "#data-platform-alerts"
    assert sink.api_base_url == "https://slack.com/api/"
    assert sink.ui_url == "http://127.0.0.1:3000"
    assert AlertSink.from_env({"SLACK_BOT_TOKEN": "  "}).token is None
    assert AlertSink.from_env({"SLACK_TIMEOUT_S": "nonsense"}).timeout_s == 10.0


def test_sent_alert_names_table_measure_value_and_asset_link(slack):
    assert _sink(slack).send(_alert()) is True

    assert len(slack.messages) == 1
    req = slack.requests[0]
    assert req["authorization"] == f"Bearer {TOKEN}"
    msg = req["body"]
    assert msg["channel"] == "#lake-test"
    text = msg["text"]
    assert "nyc.flights" in text
    assert "duplicate_offsets = 3" in text
    assert "check duplicate_free" in text
    assert "http://dagster.example:3000/assets/lake/nyc/flights" in text
    assert "ERROR" in text
    # the blocks carry the same facts, with a Slack link to the asset page
    blocks = json.dumps(msg["blocks"])
    assert "nyc.flights" in blocks and "duplicate_offsets" in blocks
    assert "<http://dagster.example:3000/assets/lake/nyc/flights|asset lake/nyc/flights>" in blocks


def test_base_url_without_trailing_slash(slack):
    assert _sink(slack, SLACK_API_BASE_URL=slack.base_url.rstrip("/")).send(_alert()) is True
    assert [r["path"] for r in slack.requests] == ["/api/chat.postMessage"]


def test_summary_is_escaped_for_slack(slack):
    alert = Alert("nyc.weather", ["lake", "nyc", "weather"], "m", "<1 & >0", "WARN", "x < y")
    assert _sink(slack).send(alert)
    text = slack.messages[0]["text"]
    assert "m = &lt;1 &amp; &gt;0" in text and "x &lt; y" in text and ":warning: WARN nyc.weather" in text


def test_no_token_logs_a_warning_and_posts_nothing(slack, caplog):
    sink = AlertSink.from_env({"SLACK_API_BASE_URL": slack.base_url})
    with caplog.at_level(logging.WARNING, logger="kafka_iceberg.ops.alerts"):
        assert sink.send(_alert()) is False
    assert slack.requests == []
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "kafka_iceberg.ops.alerts"]
    assert len(warnings) == 1
    logged = warnings[0].getMessage()
    assert "SLACK_BOT_TOKEN" in logged
    assert "nyc.flights" in logged and "duplicate_offsets = 3" in logged


@pytest.mark.parametrize(
    "status, reply, expected_in_log",
    [
        (500, "Internal Server Error", "HTTP 500"),
        (500, {"ok": False, "error": "internal_error"}, "internal_error"),
        (200, {"ok": False, "error": "channel_not_found"}, "channel_not_found"),
    ],
)
def test_slack_errors_return_false_without_raising(slack, caplog, status, reply, expected_in_log):
    slack.status, slack.reply = status, reply
    with caplog.at_level(logging.ERROR, logger="kafka_iceberg.ops.alerts"):
        assert _sink(slack).send(_alert()) is False
    assert len(slack.messages) >= 1  # it did try
    assert "nyc.flights" in slack.messages[0]["text"]
    errors = [
        r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and r.name == "kafka_iceberg.ops.alerts"
    ]
    assert any(expected_in_log in m for m in errors), errors


def test_timeout_returns_false(slack, caplog):
    slack.delay_s = 5.0
    sink = _sink(slack, SLACK_TIMEOUT_S="0.3")
    start = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="kafka_iceberg.ops.alerts"):
        assert sink.send(_alert()) is False
    assert time.monotonic() - start < 4.0
    assert slack.messages, "the request reached the server before timing out"
    assert any("failed" in r.getMessage() and "timed out" in r.getMessage().lower() for r in caplog.records)


def test_unreachable_server_returns_false(caplog):
    from devtools.services.devbroker import free_port

    port = free_port()  # a port with nothing listening
    sink = AlertSink.from_env({"SLACK_BOT_TOKEN": TOKEN, "SLACK_API_BASE_URL": f"http://127.0.0.1:{port}/api/"})
    with caplog.at_level(logging.ERROR, logger="kafka_iceberg.ops.alerts"):
        assert sink.send(_alert()) is False
    assert any("URLError" in r.getMessage() or "Connection" in r.getMessage() for r in caplog.records)


# --- asset checks --------------------------------------------------------------------------


def test_alert_on_check_posts_only_on_failure(slack):
    sink = _sink(slack)
    assert reexported_alert_on_check is alert_on_check
    assert (
        alert_on_check(
            True, "nyc.flights", ["lake", "nyc", "flights"], "freshness", "snapshot_age_s", "1.0 s", "fine", sink=sink
        )
        is False
    )
    assert slack.requests == []

    measure, value = pick_measure(
        "freshness",
        {
            "lag_records": 12,
            "max_snapshot_age_s": 3600.0,
            "max_valid_through_age_s": None,
            "snapshot_age_s": 4210.0,
        },
    )
    assert (measure, value) == ("snapshot_age_s", "4210.0 s (threshold 3600 s, lag 12 records)")
    assert (
        alert_on_check(
            False,
            "nyc.flights",
            ("lake", "nyc", "flights"),
            "freshness",
            measure,
            value,
            "table nyc.flights is stale",
            sink=sink,
            severity="WARN",
        )
        is True
    )
    assert len(slack.messages) == 1
    text = slack.messages[0]["text"]
    assert ":warning: WARN nyc.flights (check freshness)" in text
    assert "snapshot_age_s = 4210.0 s (threshold 3600 s, lag 12 records)" in text
    assert "table nyc.flights is stale" in text
    assert "http://dagster.example:3000/assets/lake/nyc/flights" in text


def test_alert_on_check_reads_env_when_no_sink_given(slack, monkeypatch):
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    monkeypatch.setenv("SLACK_API_BASE_URL", slack.base_url)
    monkeypatch.setenv("DAGSTER_UI_URL", "http://ui.test")
    assert (
        alert_on_check(
            False, "nyc.weather", ["lake", "nyc", "weather"], "duplicate_free", "duplicate_data_files", 2, "dups"
        )
        is True
    )
    text = slack.messages[0]["text"]
    assert "duplicate_data_files = 2" in text and "http://ui.test/assets/lake/nyc/weather" in text


def test_pick_measure():
    dup = {"snapshots_examined": 3, "overlapping_snapshot_pairs": 1, "duplicate_offsets": 0, "duplicate_data_files": 0}
    assert pick_measure("duplicate_free", dup) == ("overlapping_snapshot_pairs", "1")
    assert pick_measure("duplicate_free", {**dup, "duplicate_offsets": 7}) == ("duplicate_offsets", "7")
    assert pick_measure("freshness", {}) == ("table_exists", "false")
    fresh = {
        "lag_records": 0,
        "max_snapshot_age_s": 60.0,
        "max_valid_through_age_s": 120.0,
        "snapshot_age_s": 500.0,
        "valid_through_age_s": 900.5,
    }
    # old but caught up: the snapshot rule passes, the valid-through rule fails
    assert pick_measure("freshness", fresh) == ("valid_through_age_s", "900.5 s (threshold 120 s)")
    no_vt = {k: v for k, v in fresh.items() if k != "valid_through_age_s"}
    assert pick_measure("freshness", no_vt) == ("valid_through_age_s", "none (threshold 120 s)")
    assert pick_measure(
        "freshness", {"lag_records": 5, "max_snapshot_age_s": 60.0, "max_valid_through_age_s": None}
    ) == ("ingest_snapshot", "none yet")


# --- run-failure sensor --------------------------------------------------------------------


def _tick(instance, cursor=None) -> str:
    """One evaluation of the run-failure alert sensor on ``instance``; returns its new cursor."""
    from kafka_iceberg.resources.slack import LakeSlackResource

    context = build_sensor_context(
        instance=instance, cursor=cursor, resources={"lake_slack": LakeSlackResource.from_env()}
    )
    result = run_failure_alert_sensor(context)
    assert result.cursor
    return result.cursor


@pytest.fixture
def slack_env(slack, monkeypatch):
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    monkeypatch.setenv("SLACK_API_BASE_URL", slack.base_url)
    monkeypatch.setenv("SLACK_CHANNEL", "#runs")
    monkeypatch.setenv("DAGSTER_UI_URL", "http://ui.test:3000")
    return slack


def test_run_failure_sensor_posts_job_and_run_id(slack_env):
    @op
    def explode():
        raise RuntimeError("op failed hard\nsecond line of the message")

    @job
    def tiny_failing_job():
        explode()

    with DagsterInstance.ephemeral() as instance:
        result = tiny_failing_job.execute_in_process(instance=instance, raise_on_error=False)
        assert not result.success
        _tick(instance)

    assert len(slack_env.messages) == 1
    msg = slack_env.messages[0]
    assert msg["channel"] == "#runs"
    text = msg["text"]
    assert "tiny_failing_job" in text
    assert result.run_id in text
    assert f"http://ui.test:3000/runs/{result.run_id}" in text
    assert "error: RuntimeError: op failed hard" in text
    assert "second line" not in text
    assert "run_status = FAILURE" in text
    assert "/assets/" not in text  # an op job has no asset to link to


def test_run_failure_sensor_names_failed_assets(slack_env):
    @asset(key=["lake", "t", "upstream_ok"])
    def upstream_ok():
        return 1

    @asset(key=["lake", "t", "boom"], deps=[upstream_ok])
    def boom():
        raise ValueError("kaboom: partition 2 offset 17 is not JSON")

    @asset(key=["lake", "t", "downstream"], deps=[boom])
    def downstream():
        return 1

    defs = Definitions(assets=[upstream_ok, boom, downstream], jobs=[define_asset_job("lake_job")])
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("lake_job").execute_in_process(instance=instance, raise_on_error=False)
        assert not result.success
        _tick(instance)

    assert len(slack_env.messages) == 1
    text = slack_env.messages[0]["text"]
    assert ":rotating_light: ERROR t.boom (run failure)" in text
    assert f"run {result.run_id} of job lake_job failed: ValueError: kaboom: partition 2 offset 17 is not JSON" in text
    assert "failed assets: lake/t/boom" in text
    assert "not materialized: lake/t/downstream" in text
    assert "upstream_ok" not in text
    assert "http://ui.test:3000/assets/lake/t/boom" in text
    assert f"http://ui.test:3000/runs/{result.run_id}" in text


def test_run_failure_sensor_without_token_only_logs(slack, monkeypatch, caplog):
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    monkeypatch.setenv("SLACK_API_BASE_URL", slack.base_url)

    @op
    def explode():
        raise RuntimeError("nobody is listening")

    @job
    def quiet_job():
        explode()

    with DagsterInstance.ephemeral() as instance:
        result = quiet_job.execute_in_process(instance=instance, raise_on_error=False)
        with caplog.at_level(logging.WARNING, logger="kafka_iceberg.ops.alerts"):
            _tick(instance)
    assert slack.requests == []
    logged = [r.getMessage() for r in caplog.records if r.name == "kafka_iceberg.ops.alerts"]
    assert any("quiet_job" in m and result.run_id in m and "nobody is listening" in m for m in logged)


def test_run_failure_sensor_survives_slack_errors(slack_env):
    slack_env.status, slack_env.reply = 500, "Internal Server Error"

    @op
    def explode():
        raise RuntimeError("x")

    @job
    def job_with_broken_slack():
        explode()

    with DagsterInstance.ephemeral() as instance:
        job_with_broken_slack.execute_in_process(instance=instance, raise_on_error=False)
        _tick(instance)  # must not raise
    assert len(slack_env.messages) >= 1 and "job_with_broken_slack" in slack_env.messages[0]["text"]


def test_sensor_definition():
    from dagster import DefaultSensorStatus

    assert run_failure_alert_sensor.name == "run_failure_alert_sensor"
    assert run_failure_alert_sensor.default_status == DefaultSensorStatus.RUNNING
    # it loads in a code location next to asset jobs
    defs = Definitions(assets=[_loadable_asset], jobs=[define_asset_job("j")], sensors=[run_failure_alert_sensor])
    Definitions.validate_loadable(defs)
    assert defs.resolve_sensor_def("run_failure_alert_sensor") is run_failure_alert_sensor


@asset(key=["lake", "t", "loadable"])
def _loadable_asset():
    return 1


def test_slack_resource_has_base_url_timeout_and_token_from_env(slack, monkeypatch):
    from slack_sdk import WebClient

    from kafka_iceberg.resources import default_resources
    from kafka_iceberg.resources.slack import LakeSlackResource

    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    monkeypatch.setenv("SLACK_API_BASE_URL", slack.base_url)
    monkeypatch.setenv("SLACK_TIMEOUT_S", "0.3")
    resource = LakeSlackResource.from_env()
    # what the UI's Resources page shows: the variable's name, not the token
    shown = json.loads(resource.get_resource_definition().config_schema.default_value_as_json_str)
    assert shown["token"] == {"env": "SLACK_BOT_TOKEN"} and TOKEN not in json.dumps(shown)
    assert shown["base_url"] == slack.base_url and shown["timeout_s"] == 0.3
    resolved = resource.process_config_and_initialize()
    assert isinstance(resolved.get_client(), WebClient)  # as dagster-slack's SlackResource.get_client
    assert resolved.get_client().base_url == slack.base_url and resolved.get_client().timeout == 0.3
    assert resolved.sink().send(_alert()) is True
    assert slack.requests[0]["path"] == "/api/chat.postMessage" and "nyc.flights" in slack.messages[0]["text"]
    assert slack.requests[0]["authorization"] == f"Bearer {TOKEN}"
    slack.delay_s = 5.0
    assert resolved.sink().send(_alert()) is False, "the timeout bounds a slow Slack"
    assert isinstance(default_resources()["lake_slack"], LakeSlackResource)


def test_slack_resource_without_token_only_logs(slack, monkeypatch, caplog):
    from kafka_iceberg.resources.slack import LakeSlackResource

    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    resolved = LakeSlackResource.from_env({"SLACK_API_BASE_URL": slack.base_url}).process_config_and_initialize()
    with caplog.at_level(logging.WARNING):
        assert resolved.sink().send(_alert()) is False
    assert slack.requests == [] and "SLACK_BOT_TOKEN is not set" in caplog.text


# --- alerts on a change of a check's status -----------------------------------------------


def test_check_change_alerts_on_transitions_only():
    from kafka_iceberg.ops.alerts import check_change

    assert check_change(False, None) == "failed"  # a first evaluation that fails
    assert check_change(False, True) == "failed"
    assert check_change(False, False) is None  # still failing: already alerted
    assert check_change(True, False) == "recovered"
    assert check_change(True, True) is None
    assert check_change(True, None) is None


def test_alert_on_check_posts_a_failure_once_and_a_recovery_once(slack):
    sink = _sink(slack)
    args = ("nyc.flights", ["lake", "nyc", "flights"], "duplicate_free", "duplicate_offsets", 3, "3 duplicates")
    assert alert_on_check(False, *args, sink=sink, previous_passed=True, run_id="run-1") is True
    assert alert_on_check(False, *args, sink=sink, previous_passed=False, run_id="run-2") is False
    assert alert_on_check(True, *args, sink=sink, previous_passed=False, run_id="run-3") is True
    assert alert_on_check(True, *args, sink=sink, previous_passed=True, run_id="run-4") is False
    failed, recovered = (m["text"] for m in slack.messages)
    assert ":rotating_light: ERROR nyc.flights (check duplicate_free)" in failed
    assert "http://dagster.example:3000/runs/run-1" in failed
    assert ":white_check_mark: OK nyc.flights (check duplicate_free)" in recovered
    assert "check duplicate_free passes again" in recovered
    assert "http://dagster.example:3000/runs/run-3" in recovered


def test_a_dagster_check_alerts_on_status_changes_read_from_the_instance(slack_env):
    """A real asset check in a real (ephemeral) Dagster instance: the previous verdict comes from the
    instance's check history (lake_assets.dagster_internals.completed_check_executions)."""
    from dagster import AssetCheckExecutionContext, AssetCheckKey, AssetCheckResult, asset_check, materialize

    from kafka_iceberg.lake_assets.check_alerts import alert_check, previous_check_passed
    from kafka_iceberg.lake_assets.dagster_internals import completed_check_executions
    from kafka_iceberg.lake_assets.vocabulary import table_key
    from kafka_iceberg.ops.checks import CheckOutcome
    from kafka_iceberg.resources.slack import LakeSlackResource
    from tests.helpers import make_spec

    spec = make_spec("alerted", "alerted_topic")
    verdicts: list[bool] = []

    @asset(key=table_key(spec))
    def table():
        return 1

    @asset_check(asset=table_key(spec), name="duplicate_free")
    def duplicate_free(context: AssetCheckExecutionContext, lake_slack: LakeSlackResource) -> AssetCheckResult:
        passed = verdicts[-1]
        outcome = CheckOutcome(
            passed, "clean" if passed else "3 duplicate offsets", {"duplicate_offsets": 0 if passed else 3}
        )
        alert_check(context, lake_slack, spec, "duplicate_free", outcome, "ERROR")
        return AssetCheckResult(passed=passed)

    check_key = AssetCheckKey(table_key(spec), "duplicate_free")
    runs = []
    with DagsterInstance.ephemeral() as instance:
        for passed in (True, False, False, True, True, False):
            verdicts.append(passed)
            result = materialize(
                [table, duplicate_free], instance=instance, resources={"lake_slack": LakeSlackResource.from_env()}
            )
            assert result.success
            runs.append(result.run_id)
        history = completed_check_executions(instance, check_key, limit=10)
        assert history == [(r, p) for r, p in zip(reversed(runs), reversed(verdicts))]
        assert previous_check_passed(instance, check_key, runs[-1]) is True
        assert previous_check_passed(instance, AssetCheckKey(table_key(spec), "freshness"), runs[-1]) is None

    texts = [m["text"] for m in slack_env.messages]
    # passed (nothing), failed (alert), failed again (nothing), passed (recovery), passed (nothing), failed (alert)
    assert len(texts) == 3, texts
    assert "ERROR" in texts[0] and f"http://ui.test:3000/runs/{runs[1]}" in texts[0]
    assert "duplicate_offsets = 3" in texts[0]
    assert "OK" in texts[1] and f"http://ui.test:3000/runs/{runs[3]}" in texts[1]
    assert "ERROR" in texts[2] and f"http://ui.test:3000/runs/{runs[5]}" in texts[2]
