"""Lag evaluation (Burrow's rules, time-lag interpolation) and the lag sensor on the real broker."""

from __future__ import annotations

import uuid

from dagster import DagsterInstance, build_sensor_context
from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus

from devtools.demo_data import produce
from kafka_iceberg.lag import LagSample, LagWindow, evaluate, partition_status, time_lag_s
from kafka_iceberg.pipeline import run_micro_batch
from lake_assets.backfill import submit_backfill
from lake_assets.tables import MICRO_BATCHES, table_key
from resources import default_resources
from sensors.lag import TABLE_TAG, lag_sensor
from tests.helpers import event_records, make_spec


def window(*rows, last_commit_ms=None):
    """rows: (observed s, committed, high) for partition 0."""
    w = LagWindow(size=10)
    for t, c, h in rows:
        w.add(LagSample(t * 1000, {0: c}, {0: h}, last_commit_ms if last_commit_ms is not None else t * 1000))
    return w


def test_burrow_rules():
    # lag reached zero inside the window
    assert partition_status(window((0, 10, 20), (10, 20, 20), (20, 25, 30)).samples, 0) == "OK"
    # committed offset not moving while lag stays above zero
    assert partition_status(window((0, 10, 20), (10, 10, 25), (20, 10, 30), last_commit_ms=15_000).samples, 0) == "STALL"
    # committed moves but lag grows in every interval
    assert partition_status(window((0, 10, 20), (10, 15, 30), (20, 20, 45)).samples, 0) == "WARN"
    # committed moves and lag shrinks
    assert partition_status(window((0, 10, 50), (10, 30, 55), (20, 50, 60)).samples, 0) == "OK"
    # no commit for longer than the window spans
    stopped = window((100, 10, 20), (110, 10, 25), (120, 10, 30), last_commit_ms=0)
    assert partition_status(stopped.samples, 0) == "STOP"
    assert evaluate(stopped).status == "STOP" and evaluate(stopped).total_offset_lag == 20


def test_time_lag_is_interpolated_from_high_watermark_history():
    w = window((0, 0, 100), (10, 0, 200), (20, 150, 300))
    # offset 150 became the high watermark halfway between t=0 (100) and t=10 (200): 15 s ago
    assert time_lag_s(w.samples, 0) == 15.0
    assert time_lag_s(window((0, 300, 300)).samples, 0) == 0.0
    # older than the window: a lower bound, the window's age
    assert time_lag_s(window((0, 0, 100), (30, 50, 200)).samples, 0) == 30.0


def test_window_round_trips_through_the_cursor_and_stays_bounded():
    w = LagWindow(size=3)
    for i in range(5):
        w.add(LagSample(i, {0: i}, {0: i + 1}, None))
    restored = LagWindow.from_json(w.to_json(), size=3)
    assert [s.observed_ms for s in restored.samples] == [2, 3, 4]
    assert LagWindow.from_json("not json", size=3).samples == []


def _tick(sensor_def, instance, resources, cursor):
    context = build_sensor_context(instance=instance, cursor=cursor, resources=resources)
    return sensor_def(context)


def test_lag_spike_triggers_exactly_one_run_per_table(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, slack, slack_alerts
):
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(100)))
    # two tables on one topic; a micro-batch holds 1000 records per partition, so a spike of 500 fits in one
    specs = [make_spec(name, topic, lag={"max_offset_lag": 300, "max_interval": "1h"}) for name in (unique, f"{unique}_b")]
    for spec in specs:
        run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    resources = {k: v for k, v in default_resources(settings).items() if k in ("kafka", "catalog")}
    instance = DagsterInstance.ephemeral()
    sensors = [lag_sensor(spec) for spec in specs]

    quiet = [_tick(s, instance, resources, None) for s in sensors]
    for result in quiet:
        assert result.run_requests == [] and not result.dynamic_partitions_requests
        (obs,) = result.asset_events
        assert obs.metadata["offset_lag"].value == 0 and obs.metadata["status"].value == "OK"

    produce(kafka_config, topic, event_records(range(100, 600)))  # the spike
    spikes = [_tick(s, instance, resources, q.cursor) for s, q in zip(sensors, quiet)]
    for spec, spike in zip(specs, spikes):
        (request,) = spike.run_requests
        (added,) = spike.dynamic_partitions_requests
        assert added.partitions_def_name == MICRO_BATCHES.name and list(added.partition_keys) == [request.partition_key]
        assert request.asset_selection == [table_key(spec)] and not request.requires_backfill_daemon()
        assert request.tags[TABLE_TAG] == spec.identifier and "offset lag 500" in request.tags["lake/trigger"]
        assert spike.asset_events[0].metadata["offset_lag"].value == 500
    assert len(slack.messages) == 2, "one message per table"
    for spec, message in zip(specs, slack.messages):
        text = message["text"]
        assert f"WARN {spec.identifier} (sensor {spec.name}_lag)" in text
        assert "offset_lag = 500 records (threshold 300)" in text and "lag spike" in text
        assert f"/assets/lake/test/{spec.name}" in text

    # the first table's requested run is in progress (as the daemon launches it: tagged);
    # the second table's is a backfill launched from the UI (no tags): neither asks again
    first, second = specs
    instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id=str(uuid.uuid4()), tags=spikes[0].run_requests[0].tags,
                                status=DagsterRunStatus.STARTED))
    instance.add_dynamic_partitions(MICRO_BATCHES.name, ["ui-1", "ui-2"])
    submit_backfill(instance, second, ["ui-1", "ui-2"], tags={})
    busy = [_tick(s, instance, resources, spike.cursor) for s, spike in zip(sensors, spikes)]
    assert [b.run_requests for b in busy] == [[], []]
    assert len(slack.messages) == 2

    run_micro_batch(spark, settings, first, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    (running,) = instance.get_runs()
    instance.report_run_canceled(running)
    caught_up = _tick(sensors[0], instance, resources, busy[0].cursor)
    assert caught_up.run_requests == [] and caught_up.asset_events[0].metadata["offset_lag"].value == 0

    # with no run in progress, the next spike triggers again: one request per spike
    produce(kafka_config, topic, event_records(range(600, 1000)))
    again = _tick(sensors[0], instance, resources, caught_up.cursor)
    assert len(again.run_requests) == 1 and "offset lag 400" in again.run_requests[0].tags["lake/trigger"]
    assert again.run_requests[0].partition_key != spikes[0].run_requests[0].partition_key, "a new slot"
    assert len(slack.messages) == 3 and "offset_lag = 400 records" in slack.messages[-1]["text"]


def test_lag_status_change_to_error_posts_one_slack_alert(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, slack, slack_alerts
):
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(50)))
    spec = make_spec(unique, topic, lag={"max_offset_lag": 10_000, "max_interval": "1h"})
    run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    produce(kafka_config, topic, event_records(range(50, 80)))  # lag the table does not ingest
    resources = {k: v for k, v in default_resources(settings).items() if k in ("kafka", "catalog")}
    instance = DagsterInstance.ephemeral()
    sensor_def = lag_sensor(spec)
    first = _tick(sensor_def, instance, resources, None)
    assert first.asset_events[0].metadata["status"].value == "OK", "one sample cannot show a trend"
    assert slack.messages == []
    second = _tick(sensor_def, instance, resources, first.cursor)
    status = second.asset_events[0].metadata["status"].value
    assert status in ("STALL", "STOP"), status
    (message,) = slack.messages
    text = message["text"]
    assert spec.identifier in text and "lag_status" in text and status in text
    assert f"/assets/lake/test/{unique}" in text
    third = _tick(sensor_def, instance, resources, second.cursor)
    assert third.asset_events[0].metadata["status"].value == status
    assert len(slack.messages) == 1, "only a change of status alerts"
