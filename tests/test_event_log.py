"""A bounded event log: a worker run reports a table's commits as at most one ``AssetMaterialization``
per interval (kafka_iceberg/batch/coalesce.py), and the ``lake_workers`` sensor observes a table only
when its state changes or as a heartbeat. Unit tests with a fake clock, and one worker run committing
many micro-batches on a real Dagster instance, real Spark, the real catalog and broker."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

from dagster import DagsterEventType, DagsterInstance, build_sensor_context

from devtools.demo.data import produce
from kafka_iceberg.batch.coalesce import MATERIALIZE_EVERY_S, REPORT_EVERY_S, Coalescer, Throttle, merge, phase
from kafka_iceberg.batch.types import BatchResult
from kafka_iceberg.catalog.tables import load_catalog
from kafka_iceberg.lake_assets.chore_reports import ChoreReports
from kafka_iceberg.lake_assets.vocabulary import BUDGET_TAG, table_key
from kafka_iceberg.lake_assets.worker import REPORT_GAP_S, report_every_s, worker_job
from kafka_iceberg.ops.checks import CheckOutcome
from kafka_iceberg.resources import default_resources
from kafka_iceberg.sensors.retention import all_tables_retention_sensor
from kafka_iceberg.sensors.workers import OBSERVE_EVERY_S, should_observe
from tests.helpers import event_records, make_spec


def _commit(snapshot: int, start: int, end: int, records: int) -> BatchResult:
    """A committed micro-batch of partition 0, offsets [start, end)."""
    return BatchResult(
        table="t",
        commit_id="run",
        committed=True,
        records=records,
        records_read=records,
        ranges={0: (start, end)},
        offsets={0: end},
        snapshot_id=snapshot,
        data_files_added=1,
    )


def test_a_table_committing_every_second_is_reported_once_a_minute_with_all_its_commits():
    now = [0.0]
    coalescer = Coalescer(clock=lambda: now[0])
    reports = []
    for i in range(600):  # ten minutes, a commit a second
        now[0] = float(i)
        done = coalescer.add("t", _commit(100 + i, 10 * i, 10 * i + 10, 10))
        reports += [done] if done else []
        reports += coalescer.due().values()
    reports += coalescer.drain().values()
    assert 11 <= len(reports) <= 12, (
        "the first commit at once, the second within a minute, then one a minute, the rest at the end"
    )
    assert sum(r.commits for r in reports) == 600 and sum(r.result.records for r in reports) == 6000
    assert reports[0].commits == 1 and reports[1].first_snapshot_id == 101
    second = math.ceil(MATERIALIZE_EVERY_S * (1 - phase("t")))  # the table's own place in the interval
    assert 0 < second < 60
    assert [r.result.ranges[0] for r in reports[1:3]] == [(10, 10 * second + 10), (10 * second + 10, 10 * second + 610)]
    assert reports[-1].result.snapshot_id == 699 and reports[-1].result.offsets == {0: 6000}
    assert coalescer.drain() == {} and coalescer.due() == {}


def test_the_reports_of_tables_that_start_together_are_spread_over_the_interval():
    now, at = [0.0], []
    coalescer = Coalescer(clock=lambda: now[0])
    tables = [f"ns.t{i:03d}" for i in range(100)]
    for second in range(181):  # every table commits every second for three minutes
        now[0] = float(second)
        at += [second for t in tables if coalescer.add(t, _commit(second, second, second + 1, 1))]
    first, later = at[:100], at[100:]
    assert first == [0] * 100, "each table's first commit is reported at once"
    assert len(later) == 300, "then, per table, the second within the first minute and one a minute after it"
    per_window = [sum(w <= s < w + 10 for s in later) for w in range(1, 171, 10)]
    assert max(per_window) <= 35, f"spread: not every table in the same seconds ({per_window})"


def test_merge_sums_counts_joins_ranges_and_keeps_the_last_state():
    merged = merge([_commit(1, 0, 5, 5), _commit(2, 5, 9, 4)])
    assert (merged.commits, merged.first_snapshot_id) == (2, 1)
    assert merged.result.ranges == {0: (0, 9)} and merged.result.records == 9 and merged.result.snapshot_id == 2
    assert merged.result.data_files_added == 2 and merged.result.offsets == {0: 9}


def test_a_fresh_table_is_reported_within_half_its_freshness_age():
    assert report_every_s(make_spec("a", "a", freshness={"max_snapshot_age": "1d"})) == MATERIALIZE_EVERY_S
    assert report_every_s(make_spec("b", "b", freshness={"max_snapshot_age": "60s"})) == 30.0
    # a run serving many tables logs about one materialization per REPORT_GAP_S in all, within the freshness bound
    assert report_every_s(make_spec("a", "a", freshness={"max_snapshot_age": "1d"}), tables=100) == 100 * REPORT_GAP_S
    assert report_every_s(make_spec("b", "b", freshness={"max_snapshot_age": "60s"}), tables=100) == 30.0


def test_the_sensor_observes_a_table_on_a_change_of_state_or_a_heartbeat():
    assert should_observe(None, True, False, 0), "never observed"
    seen = [0, True, False]
    assert not should_observe(seen, True, False, 30_000)
    assert should_observe(seen, True, True, 30_000), "it became due"
    assert should_observe(seen, False, False, 30_000), "its topic vanished"
    assert should_observe(seen, True, False, OBSERVE_EVERY_S * 1000), "the heartbeat"
    assert should_observe([0, True], True, False, 1), "a cursor of an older sensor"
    per_hour = 3600 // OBSERVE_EVERY_S
    assert per_hour <= 6, "a healthy table: at most 6 observations an hour"


def test_a_worker_run_committing_many_micro_batches_writes_a_bounded_number_of_events(
    settings, kafka_config, unique, topic_factory
):
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(600)))
    spec = make_spec(unique, topic, max_records_per_partition=20)  # 30 micro-batches
    instance = DagsterInstance.ephemeral()
    job = worker_job(0, [spec], sqlite_catalog=True, crons={})
    t0 = time.monotonic()
    tags = {"dagster/sensor_name": "lake_workers", BUDGET_TAG: "1800"}  # serves until nothing waits
    resources = default_resources(settings)
    run = job.execute_in_process(instance=instance, resources=resources, tags=tags)
    elapsed = time.monotonic() - t0
    assert run.success
    table = load_catalog(settings.catalog).load_table(spec.identifier)
    mats = [
        e.dagster_event.event_specific_data.materialization
        for e in instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
    ]
    assert all(m.asset_key == table_key(spec) for m in mats)
    # the first commit at once, then at most one a minute, and the rest when the run stops serving; the first
    # minute is shortened by the table's phase (coalesce.phase: 0.9988 for test.t45_4bcb30, a report 0.07 s
    # after the first), so one more may fall in it
    assert 1 <= len(mats) <= 3 + elapsed // MATERIALIZE_EVERY_S, (len(mats), elapsed)
    assert len(mats) < 30 and sum(m.metadata["micro_batches"].value for m in mats) == 30, "600 records, 20 a batch"
    assert sum(m.metadata["records"].value for m in mats) == 600
    assert mats[-1].metadata["snapshot_id"].value == str(table.metadata.current_snapshot_id)
    assert mats[-1].metadata["committed_offsets"].value == {"0": 600}
    assert mats[-1].metadata["lag_after_commit"].value == 0
    others = {
        t: len(instance.all_logs(run.run_id, of_type=t))
        for t in (DagsterEventType.ASSET_OBSERVATION, DagsterEventType.ASSET_CHECK_EVALUATION)
    }
    print(f"\nworker run: 30 commits in {elapsed:.0f} s, {len(mats)} materializations, {others}, ", end="")
    print(f"{len(instance.all_logs(run.run_id))} events in all")
    assert others[DagsterEventType.ASSET_CHECK_EVALUATION] <= 2 and others[DagsterEventType.ASSET_OBSERVATION] <= 2

    # the retention sensor observes the table and its topic once, then on a change of status or a heartbeat
    sensor = all_tables_retention_sensor([spec])
    with build_sensor_context(instance=instance, resources=resources) as context:
        first = sensor(context)
    with build_sensor_context(instance=instance, resources=resources, cursor=first.cursor) as context:
        again = sensor(context)
    assert len(first.asset_events) == 2 and again.asset_events == [], again.asset_events


def test_a_table_that_stops_committing_alerts_once_and_once_more_when_it_recovers():
    """``lake_workers`` judges STOP (lag and no commit for longer than max_interval + grace) per episode."""
    from kafka_iceberg.sensors.workers import STOPPED, report_stops

    class Recorder:
        def __init__(self):
            self.alerts = []

        def send(self, alert) -> bool:
            self.alerts.append(alert)
            return True

    spec = make_spec("stops", "stops.topic", lag={"max_interval": "1m", "grace": "1m"})
    slack, cursor, last_ms = Recorder(), {}, 1_000_000
    ticks = [(30, 5, last_ms), (119, 5, last_ms), (121, 5, last_ms), (200, 9, last_ms), (600, 9, last_ms)]
    changed = [report_stops(cursor, [(spec, lag, at)], at + s * 1000, slack) for s, lag, at in ticks]
    assert changed == [[], [], [spec.identifier], [], []], "STOP after 120 s, and only once"
    assert cursor[STOPPED] == [spec.identifier]
    assert report_stops(cursor, [(spec, 0, last_ms)], last_ms + 700_000, slack) == [spec.identifier], "lag gone"
    assert report_stops(cursor, [(spec, 4, last_ms + 690_000)], last_ms + 700_000, slack) == []
    assert [a.severity for a in slack.alerts] == ["ERROR", "OK"] and cursor[STOPPED] == []
    assert "no commit for 121 s > max_interval + grace = 120 s" in slack.alerts[0].summary
    assert slack.alerts[0].source == "sensor lake_workers"
    assert report_stops({}, [(spec, 5, None)], last_ms, slack) == [], "a table that never committed is not judged"


def test_routine_chore_reports_come_once_per_interval_and_a_failed_check_at_once():
    now = [0.0]
    throttle = Throttle(clock=lambda: now[0])
    out = []
    for i in range(3600):  # an hour of a table expired every 10 s and checked before each expiry
        now[0] = float(i)
        if i % 10 == 0:
            out += [("expire", due) for due in [throttle.add(("t", "expire"), i)] if due]
            out += [("check", due) for due in [throttle.add(("t", "check"), i, urgent=i == 1850)] if due]
    out += [(k[1], due) for k, due in throttle.drain().items()]
    per_kind = {kind: [d for k, d in out if k == kind] for kind in ("expire", "check")}
    assert len(per_kind["expire"]) == 1 + 3600 // REPORT_EVERY_S, "the first at once, then one an interval"
    assert (1850, 5) in per_kind["check"], "a failure at once, standing for the checks since 1800 s"
    assert sum(n for _, n in per_kind["expire"]) == 360 and sum(n for _, n in per_kind["check"]) == 360
    assert per_kind["expire"][-1] == (3590, per_kind["expire"][-1][1]), "the latest job, when the run stops"
    assert throttle.drain() == {}


def test_a_worker_reports_a_failed_check_and_the_recovery_at_once_and_passes_once_per_interval():
    """A failure at once; the incremental passes after it are not reported (they cover only the rows added
    since: the duplicates found are still in the table), the first full-scan pass is, at once."""
    now, events = [0.0], []
    log = SimpleNamespace(info=lambda m: None)
    context = SimpleNamespace(log=log, log_event=events.append)
    reports = ChoreReports(context, None, Throttle(clock=lambda: now[0]), previous=lambda spec: None)
    spec = make_spec("t", "t")

    def check(at: float, passed: bool, scope: str = "incremental") -> None:
        now[0] = at
        reports.check(spec, CheckOutcome(passed, f"at {at}", {"rows": 1, "scope": scope}))

    for at, passed in [(0, True), (10, True), (20, False), (25, True), (29, True)]:
        check(at, passed)
    check(30, True, "full")
    for at in (40, 50):
        check(at, True)
    seen = [(e.passed, e.metadata["checks"].value, e.description) for e in events]
    assert seen == [(True, 1, "at 0"), (False, 2, "at 20"), (True, 1, "at 30")], "a pass held, a failure, the recovery"
    reports.drain()
    assert [(e.passed, e.metadata["checks"].value) for e in events[3:]] == [(True, 2)], "the held passes at the end"
