"""Lag evaluation (Burrow's rules, time-lag interpolation) and the lag sensor on the real broker."""

from __future__ import annotations

import uuid

from dagster import DagsterInstance, build_sensor_context
from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus

from devtools.demo.data import produce
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.lake_assets.backfill import submit_backfill
from kafka_iceberg.lake_assets.tables import MICRO_BATCHES, table_key
from kafka_iceberg.ops.lag import MAX_POINTS, LagHistory, LagRules, observation, time_lag_s
from kafka_iceberg.resources import default_resources
from kafka_iceberg.sensors.lag import TABLE_TAG, lag_sensor, should_trigger
from tests.helpers import BASE_TS_MS, event_records, make_spec


def simulate(spec, hours, rate_per_s, run_s, stop=(None, None), stuck_from=None):
    """Drive the lag rules and the trigger with a simulated clock (seconds), one partition.

    A producer writes ``rate_per_s`` records per second; the sensor ticks every ``lag.interval``;
    a triggered run takes ``run_s`` and commits up to ``max_records_per_partition`` records of
    what was there when it started, or fails (counted as a failed attempt) from ``stuck_from``.
    No run starts while ``stop[0] <= t < stop[1]``. The cursor round-trips through JSON each tick,
    as in the sensor. Returns the timeline, the alerts (level changes), the number of runs and
    the final evaluation and history."""
    rules, interval = LagRules.of(spec.lag), spec.lag.interval_s
    committed, last_commit_ms, failed, run, runs = 0, None, 0, None, 0
    cursor, timeline, alerts, t = None, [], [], 0.0
    while t < hours * 3600:
        high = int(rate_per_s * t)
        if run and t >= run[0]:
            if stuck_from is not None and run[0] >= stuck_from:
                failed += 1
            else:
                committed, last_commit_ms, failed = run[1], int(run[0] * 1000), 0
            run = None
        history = LagHistory.from_json(cursor)
        evaluation = history.observe(
            observation(int(t * 1000), {0: committed}, {0: high}, last_commit_ms, failed), rules
        )
        cursor = history.to_json()
        timeline.append((t, evaluation.status))
        if evaluation.level_changed:
            alerts.append((t, evaluation.status))
        stopped = stop[0] is not None and stop[0] <= t < (stop[1] or float("inf"))
        if run is None and not stopped and should_trigger(spec, evaluation, last_commit_ms, int(t * 1000)):
            run, runs = (t + run_s, min(high, committed + spec.max_records_per_partition)), runs + 1
        t += interval
    return timeline, alerts, runs, evaluation, history


def first(timeline, status, after=0.0):
    return next((t for t, s in timeline if s == status and t >= after), None)


LOW_TRAFFIC = {"max_offset_lag": 10_000, "max_interval": "15m", "interval": "30s", "grace": "5m"}


def test_low_traffic_table_stays_ok_for_a_day_and_posts_nothing():
    spec = make_spec("low", "t.low", lag=LOW_TRAFFIC)
    timeline, alerts, runs, last, history = simulate(spec, 24, rate_per_s=1 / 60, run_s=60)
    assert {s for _, s in timeline} == {"OK"} and alerts == []
    assert runs >= 24 * 60 / 16, "one micro-batch per max_interval, every one of them silent"
    assert last.total_offset_lag <= 17 and len(history.points) <= MAX_POINTS


def test_stopped_sink_reaches_stop_within_max_interval_plus_grace_and_recovers():
    spec = make_spec("stopped", "t.stopped", lag=LOW_TRAFFIC)
    rules = LagRules.of(spec.lag)
    timeline, alerts, _, _, _ = simulate(spec, 6, rate_per_s=1 / 60, run_s=60, stop=(2 * 3600, 4 * 3600))
    last_commit = max(t for t, s in timeline if t < 2 * 3600) - rules.max_interval_s  # no later than this
    stop_at = first(timeline, "STOP")
    assert 2 * 3600 < stop_at <= 2 * 3600 + rules.max_interval_s + rules.grace_s + spec.lag.interval_s
    assert stop_at > last_commit
    assert [s for _, s in alerts] == ["STOP", "OK"], "one ERROR when it stops, one recovery; nothing in between"
    assert alerts[1][0] < 4 * 3600 + 300


def test_time_lag_is_not_capped_by_any_window_and_history_stays_bounded():
    spec = make_spec("capped", "t.capped", lag=LOW_TRAFFIC)
    _, _, _, last, history = simulate(spec, 12, rate_per_s=1, run_s=60, stop=(3600, None))
    # at 1 record/s the oldest unread record arrived offset-lag seconds ago: about 11 hours
    assert last.max_time_lag_s > 11 * 3600
    assert abs(last.max_time_lag_s - last.total_offset_lag) <= spec.lag.interval_s
    assert len(history.points) <= MAX_POINTS and len(history.to_json()) < 5000


def test_sink_that_cannot_keep_up_reaches_warn_not_error():
    spec = make_spec(
        "slow",
        "t.slow",
        max_records_per_partition=5000,
        lag={"max_offset_lag": 1000, "max_interval": "15m", "interval": "5s", "window": 5},
    )
    timeline, alerts, runs, last, _ = simulate(spec, 1, rate_per_s=100, run_s=60)  # 5000 per 65 s < 6500
    assert first(timeline, "WARN") is not None and first(timeline, "WARN") < 10 * 65
    assert {s for _, s in timeline} == {"OK", "WARN"}
    assert [s for _, s in alerts] == ["WARN"], "one WARN while it holds"
    assert "grew across the last 5 commits" in last.reason


def test_sink_stuck_on_one_batch_reaches_stall():
    spec = make_spec("stuck", "t.stuck", lag={"max_offset_lag": 1000, "max_interval": "15m", "interval": "5s"})
    timeline, alerts, _, last, _ = simulate(spec, 3, rate_per_s=10, run_s=60, stuck_from=3600)
    stall_at = first(timeline, "STALL")
    assert 3600 < stall_at <= 3600 + 3 * 70
    assert first(timeline, "STOP") is None and last.status == "STALL"
    assert [s for _, s in alerts] == ["STALL"]


def test_steady_load_with_runs_longer_than_any_window_stays_ok():
    spec = make_spec(
        "steady",
        "t.steady",
        max_records_per_partition=100_000,
        lag={"max_offset_lag": 1000, "max_interval": "15m", "interval": "5s", "window": 5},
    )
    timeline, alerts, runs, _, _ = simulate(spec, 6, rate_per_s=100, run_s=120)  # 12,000 records per run
    assert {s for _, s in timeline} == {"OK"} and alerts == []
    assert runs >= 6 * 3600 / 130, "a micro-batch at the normal cadence is no alert"


def test_unbounded_retention_never_warns():
    from kafka_iceberg.batch.planning import Watermarks
    from kafka_iceberg.declaration.models import RetentionDecl
    from kafka_iceberg.declaration.spec import retention_policy
    from kafka_iceberg.ops.retention import evaluate as retention_status

    policy, statuses = retention_policy(RetentionDecl(), "t"), set()
    for hour in range(48):  # a table 99% behind, its oldest unread record ever older
        now_ms = BASE_TS_MS + hour * 3_600_000
        status, parts = retention_status({0: Watermarks(0, 10_000 + hour)}, {0: 1}, -1, {0: BASE_TS_MS}, now_ms, policy)
        statuses.add(status)
        assert parts[0].headroom_s is None
    assert statuses == {"OK"}
    bounded, _ = retention_status(
        {0: Watermarks(0, 10_000)}, {0: 1}, 7 * 86_400_000, {0: BASE_TS_MS}, BASE_TS_MS, policy
    )
    assert bounded == "ERROR", "with bounded retention the same table is about to lose data"


def test_time_lag_is_interpolated_from_high_watermark_history():
    points = [(0, {0: 100}), (10_000, {0: 200}), (20_000, {0: 300})]
    # offset 150 became the high watermark halfway between t=0 (100) and t=10 (200): 15 s ago
    assert time_lag_s(points, 0, 150, 20_000) == 15.0
    assert time_lag_s(points, 0, 300, 20_000) == 0.0
    # older than the first point: a lower bound, that point's age
    assert time_lag_s(points, 0, 50, 30_000) == 30.0


def test_unreadable_cursor_starts_an_empty_history():
    assert LagHistory.from_json("not json").points == [] and LagHistory.from_json(None).status == "OK"


def _tick(sensor_def, instance, resources, cursor):
    context = build_sensor_context(instance=instance, cursor=cursor, resources=resources)
    return sensor_def(context)


def test_lag_spike_triggers_exactly_one_run_per_table(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, slack, slack_alerts
):
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(100)))
    # two tables on one topic; a micro-batch holds 1000 records per partition, so a spike of 500 fits in one
    specs = [
        make_spec(name, topic, lag={"max_offset_lag": 300, "max_interval": "1h"}) for name in (unique, f"{unique}_b")
    ]
    for spec in specs:
        run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    resources = {
        k: v for k, v in default_resources(settings).items() if k in ("lake_kafka", "lake_catalog", "lake_slack")
    }
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
    assert slack.messages == [], "a run at the normal cadence is no alert"

    # the first table's requested run is in progress (as the daemon launches it: tagged);
    # the second table's is a backfill launched from the UI (no tags): neither asks again
    first, second = specs
    instance.add_run(
        DagsterRun(
            job_name="__ASSET_JOB",
            run_id=str(uuid.uuid4()),
            tags=spikes[0].run_requests[0].tags,
            status=DagsterRunStatus.STARTED,
        )
    )
    instance.add_dynamic_partitions(MICRO_BATCHES.name, ["ui-1", "ui-2"])
    submit_backfill(instance, second, ["ui-1", "ui-2"], tags={})
    busy = [_tick(s, instance, resources, spike.cursor) for s, spike in zip(sensors, spikes)]
    assert [b.run_requests for b in busy] == [[], []]

    run_micro_batch(spark, settings, first, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    (running,) = instance.get_runs()
    instance.report_run_canceled(running)
    caught_up = _tick(sensors[0], instance, resources, busy[0].cursor)
    assert caught_up.run_requests == [] and caught_up.asset_events[0].metadata["offset_lag"].value == 0

    # with no run in progress, the next spike triggers again: one request per spike
    produce(kafka_config, topic, event_records(range(600, 1000)))
    again = _tick(sensors[0], instance, resources, caught_up.cursor)
    assert len(again.run_requests) == 1 and "offset lag 400" in again.run_requests[0].tags["lake/trigger"]
    assert slack.messages == [] and all(b.asset_events[0].metadata["status"].value == "OK" for b in busy + [again])


def test_lag_level_changes_post_one_slack_alert_each(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, slack, slack_alerts
):
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(50)))
    spec = make_spec(unique, topic, lag={"max_offset_lag": 10_000, "max_interval": "1h"})
    run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    produce(kafka_config, topic, event_records(range(50, 80)))  # lag the table does not ingest
    resources = {
        k: v for k, v in default_resources(settings).items() if k in ("lake_kafka", "lake_catalog", "lake_slack")
    }
    instance = DagsterInstance.ephemeral()
    sensor_def = lag_sensor(spec)
    first = _tick(sensor_def, instance, resources, None)
    assert first.asset_events[0].metadata["status"].value == "OK", "fresh lag within the cadence is normal"
    for _ in range(2):  # two runs of the table fail on the same batch after its last commit
        instance.add_run(
            DagsterRun(
                job_name="__ASSET_JOB",
                run_id=str(uuid.uuid4()),
                tags={TABLE_TAG: spec.identifier},
                status=DagsterRunStatus.FAILURE,
            )
        )
    second = _tick(sensor_def, instance, resources, first.cursor)
    assert second.asset_events[0].metadata["status"].value == "STALL"
    (message,) = slack.messages
    text = message["text"]
    assert f"ERROR {spec.identifier}" in text and "lag_status = STALL (was OK)" in text and "2 runs failed" in text
    assert f"/assets/lake/test/{unique}" in text
    third = _tick(sensor_def, instance, resources, second.cursor)
    assert third.asset_events[0].metadata["status"].value == "STALL"
    assert len(slack.messages) == 1, "a status that holds posts nothing"
    run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    recovered = _tick(sensor_def, instance, resources, third.cursor)
    assert recovered.asset_events[0].metadata["status"].value == "OK"
    assert len(slack.messages) == 2 and "OK " + spec.identifier in slack.messages[-1]["text"]
    assert "lag_status = OK (was STALL)" in slack.messages[-1]["text"]
