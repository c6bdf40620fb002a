"""The full-scan ``duplicate_free`` check: a worker run runs it by the table's spread ``maintenance.full_check``
cron in its chore thread, on its own Spark session (no run of its own, no JVM of its own), reports it at once,
and an incremental pass after it does not hide its failure; the asset check run on its own (the UI's Execute)
scans the whole table too. Real Spark, catalog and broker."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from dagster import AssetCheckKey, AssetSelection, DagsterInstance, Definitions, define_asset_job

from devtools.demo.data import produce
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.batch.planning import Watermarks
from kafka_iceberg.batch.worker import Clock
from kafka_iceberg.catalog.tables import load_table, qualified
from kafka_iceberg.lake_assets.tables import table_asset, table_checks, topic_asset
from kafka_iceberg.lake_assets.vocabulary import table_key
from kafka_iceberg.lake_assets.worker_chores import ChoreEnv, WorkerChores
from kafka_iceberg.ops.rota import FULL_CHECK, LAST_RUN_PROPERTY, rota_for
from kafka_iceberg.resources import default_resources
from kafka_iceberg.schedules.spread import maintenance_crons, spread_cron, spread_slots
from tests.helpers import event_records, make_spec
from tests.test_worker import _clocked_worker

MINUTE_MS = 60_000


def test_the_full_check_is_a_job_of_the_worker_rota_by_its_spread_cron(unique):
    spec = make_spec(unique, "t")
    spread = spread_cron("0 5 * * *", spread_slots([spec.identifier])[spec.identifier])  # the default, spread
    assert maintenance_crons([spec])[spec.identifier][FULL_CHECK] == spread
    hourly = make_spec(unique, "t", maintenance={"full_check": "15 * * * *"})  # declared on the table: pinned
    crons = maintenance_crons([hourly])
    assert crons[hourly.identifier][FULL_CHECK] == "15 * * * *"
    table = SimpleNamespace(properties={}, metadata=SimpleNamespace(snapshots=[SimpleNamespace(timestamp_ms=0)]))
    rota = rota_for({hourly.identifier: table}, crons)
    assert rota.next_due(14 * MINUTE_MS) is None and rota.next_due(15 * MINUTE_MS) == (hourly.identifier, FULL_CHECK)
    assert rota.due(14 * MINUTE_MS) == set() and rota.due(15 * MINUTE_MS) == {hourly.identifier}


def test_a_run_idle_with_a_chore_in_the_background_ends_when_the_chore_was_collected():
    """Fake clock: the worker's tables have nothing waiting; a chore (a full scan, say) runs for 30 s in the
    background. The run ends idle only after the chore ended and the next chore call collected it."""
    spec = make_spec("quiet", "quiet_topic")
    now, started, calls = [0.0], [None], []

    def chores(idle, busy):
        calls.append(now[0])
        if started[0] is None:
            started[0] = now[0]  # starts it
            return True
        return False

    def working():
        return started[0] is not None and now[0] < started[0] + 30.0 or calls[-1] < started[0] + 30.0

    marks = {spec.topic: {0: Watermarks(0, 0)}}
    worker = _clocked_worker(
        [spec], lambda s: None, marks, now, chores=chores, working=working, idle_s=1.0, budget_s=60
    )
    worker.run()
    assert now[0] >= 30.0, "the run waited for its chore"
    assert calls[-1] >= 30.0, "and called the chores once more after it ended, which collects it"


def _evaluations(events: list) -> list:
    return [e for e in events if type(e).__name__ == "AssetCheckEvaluation"]


def test_a_worker_runs_the_full_check_by_its_cron_and_an_incremental_pass_keeps_its_failure(
    spark, settings, kafka, catalog, kafka_config, writer_factory, unique, topic_factory
):
    topic = topic_factory(unique, partitions=2)
    spec = make_spec(unique, topic, max_records_per_partition=1000, maintenance={"full_check": "* * * * *"})
    writer = writer_factory(spec)
    produce(kafka_config, topic, event_records(range(200)))
    writer.execute(writer.plan(), "run-a")
    table = load_table(catalog, spec.identifier)
    first_ms = min(s.timestamp_ms for s in table.metadata.snapshots)
    epoch = [first_ms + 2 * MINUTE_MS]
    events: list = []
    log = SimpleNamespace(info=lambda m: None, error=events.append, warning=events.append)
    run = SimpleNamespace(run_id=f"worker-{unique}")
    context = SimpleNamespace(run=run, run_id=run.run_id, instance=DagsterInstance.ephemeral(), log=log)
    context.log_event = events.append
    rota = rota_for({spec.identifier: table}, maintenance_crons([spec]))
    env = ChoreEnv(spark, settings, catalog, None)
    chores = WorkerChores(context, [spec], rota, env, Clock(epoch_ms=lambda: epoch[0]))

    assert chores(True) is True and chores.running.what == FULL_CHECK, "a tick passed since the first snapshot"
    chores.running.future.result(timeout=300)
    assert chores(True) is False and chores.running is None, "collected; not due again before the next tick"
    (clean,) = _evaluations(events)
    assert clean.passed and clean.metadata["scope"].value == "full"
    assert clean.asset_key == table_key(spec) and clean.check_name == "duplicate_free"
    recorded = load_table(catalog, spec.identifier).properties[LAST_RUN_PROPERTY.format(kind=FULL_CHECK)]
    assert recorded == str(first_ms + 2 * MINUTE_MS), "the next worker run knows when it ran"

    # a copy of an old row appended outside the write path (no commit id, no offset range): only a full scan sees it
    qualified_table = qualified(settings, spec)
    spark.table(qualified_table).orderBy("_kafka_offset").limit(1).writeTo(qualified_table).append()
    epoch[0] += MINUTE_MS
    assert chores(True) is True and chores.running.what == FULL_CHECK
    chores.running.future.result(timeout=300)
    chores(True)
    dirty = _evaluations(events)[-1]
    assert not dirty.passed and dirty.metadata["duplicate_offsets"].value == 1

    # the run commits more rows; their incremental check passes, but covers only them: the check stays failed
    produce(kafka_config, topic, event_records(range(200, 240)))
    result = run_micro_batch(spark, settings, spec, commit_id=context.run_id, kafka=kafka, catalog=catalog)
    chores.committed(spec, result.snapshots)
    chores.finish()
    assert _evaluations(events)[-1] is dirty, "no pass reported after the failed full scan"


def test_the_asset_check_run_on_its_own_scans_the_whole_table(
    spark, settings, kafka_config, writer_factory, unique, topic_factory
):
    topic = topic_factory(unique, partitions=2)
    spec = make_spec(unique, topic, max_records_per_partition=1000)
    writer = writer_factory(spec)
    produce(kafka_config, topic, event_records(range(100)))
    writer.execute(writer.plan(), "run-a")
    qualified_table = qualified(settings, spec)
    spark.table(qualified_table).orderBy("_kafka_offset").limit(1).writeTo(qualified_table).append()
    check = AssetSelection.checks(AssetCheckKey(table_key(spec), "duplicate_free"))
    defs = Definitions(
        assets=[topic_asset(spec), table_asset(spec)],
        asset_checks=table_checks(spec),
        jobs=[define_asset_job("execute_check", selection=check)],  # what the UI's Execute launches
        resources=default_resources(settings),
    )
    result = defs.resolve_job_def("execute_check").execute_in_process(instance=DagsterInstance.ephemeral())
    (evaluation,) = result.get_asset_check_evaluations()
    assert not evaluation.passed and evaluation.metadata["scope"].value == "full"
    assert evaluation.metadata["duplicate_offsets"].value == 1


def test_a_full_scan_failing_again_in_one_worker_run_posts_once_and_its_pass_posts_the_recovery(slack_alerts):
    from kafka_iceberg.batch.coalesce import Throttle
    from kafka_iceberg.lake_assets.chore_reports import ChoreReports
    from kafka_iceberg.ops.checks import CheckOutcome
    from kafka_iceberg.resources import LakeSlackResource

    spec = make_spec("audited", "topic_audited")
    events: list = []
    log = SimpleNamespace(info=lambda m: None, error=events.append, warning=events.append)
    run = SimpleNamespace(run_id="worker-run")
    context = SimpleNamespace(run=run, run_id=run.run_id, instance=DagsterInstance.ephemeral(), log=log)
    context.log_event = events.append
    reports = ChoreReports(context, LakeSlackResource.from_env(), Throttle(clock=lambda: 0.0))
    dirty = CheckOutcome(False, "1 duplicate (partition, offset) records", {"scope": "full", "duplicate_offsets": 1})
    reports.full_check(spec, dirty)
    assert len(slack_alerts.messages) == 1 and "duplicate_free" in str(slack_alerts.messages[0])
    reports.check(spec, CheckOutcome(True, "no duplicates", {"scope": "incremental"}))  # the new rows only
    reports.full_check(spec, dirty)
    assert len(slack_alerts.messages) == 1, "the same run's second failure is no change of status"
    assert [e.passed for e in _evaluations(events)] == [False, False], "the incremental pass is not reported"
    reports.full_check(spec, CheckOutcome(True, "no duplicates", {"scope": "full"}))
    assert len(slack_alerts.messages) == 2 and "passes again" in str(slack_alerts.messages[1])


def test_a_failure_found_by_an_earlier_run_holds_in_the_next_worker_run_until_a_full_scan_passes(slack_alerts):
    """The predecessor's evaluation failed (here a run of the asset check on its own); the successor worker
    run's incremental passes cover only its own rows, so they are not reported and post nothing; its first
    full-scan pass is reported and posts the recovery."""
    from dagster import AssetCheckResult, asset_check

    from kafka_iceberg.batch.coalesce import Throttle
    from kafka_iceberg.lake_assets.chore_reports import ChoreReports
    from kafka_iceberg.ops.checks import CheckOutcome
    from kafka_iceberg.resources import LakeSlackResource

    spec = make_spec("inherited", "topic_inherited")

    @asset_check(asset=table_key(spec), name="duplicate_free")
    def earlier_run():
        return AssetCheckResult(passed=False, metadata={"scope": "full", "duplicate_offsets": 1})

    instance = DagsterInstance.ephemeral()
    check = AssetSelection.checks(AssetCheckKey(table_key(spec), "duplicate_free"))
    defs = Definitions(asset_checks=[earlier_run], jobs=[define_asset_job("earlier", selection=check)])
    (found,) = defs.resolve_job_def("earlier").execute_in_process(instance=instance).get_asset_check_evaluations()
    assert not found.passed
    events: list = []
    log = SimpleNamespace(info=lambda m: None, error=events.append, warning=events.append)
    run = SimpleNamespace(run_id="successor-run")
    context = SimpleNamespace(run=run, run_id=run.run_id, instance=instance, log=log, log_event=events.append)
    reports = ChoreReports(context, LakeSlackResource.from_env(), Throttle(clock=lambda: 0.0))
    reports.check(spec, CheckOutcome(True, "no duplicates", {"scope": "incremental"}))
    assert _evaluations(events) == [] and slack_alerts.messages == [], "the successor's own rows only: not reported"
    reports.full_check(spec, CheckOutcome(True, "no duplicates", {"scope": "full"}))
    assert [e.passed for e in _evaluations(events)] == [True]
    assert len(slack_alerts.messages) == 1 and "passes again" in str(slack_alerts.messages[0])
    reports.check(spec, CheckOutcome(True, "no duplicates", {"scope": "incremental"}))
    reports.drain()
    assert [e.passed for e in _evaluations(events)] == [True, True], "after the full pass, incremental passes count"


def test_the_sensor_launches_an_idle_tables_worker_when_its_full_check_is_due(
    settings, kafka_config, writer_factory, catalog, unique, topic_factory
):
    """No records wait (lag 0), so only a due job of the rota launches the worker: an idle table is still checked."""
    from dagster import build_sensor_context

    from kafka_iceberg.lake_assets.worker import worker_job
    from kafka_iceberg.ops.rota import set_table_property
    from kafka_iceberg.sensors.workers import workers_sensor

    topic = topic_factory(unique, partitions=1)
    spec = make_spec(unique, topic, maintenance={"full_check": "0 0 1 1 *"})  # pinned: once a year
    writer = writer_factory(spec)
    produce(kafka_config, topic, event_records(range(50)))
    writer.execute(writer.plan(), "run-a")
    crons = maintenance_crons([spec])
    job = worker_job(0, [spec], sqlite_catalog=True, crons=crons)
    instance, resources = DagsterInstance.ephemeral(), default_resources(settings)

    def launched(last_run_ms: int) -> list[str]:
        set_table_property(catalog, spec.identifier, LAST_RUN_PROPERTY.format(kind=FULL_CHECK), str(last_run_ms))
        with build_sensor_context(instance=instance, resources=resources) as context:
            return [r.job_name for r in workers_sensor({0: [spec]}, [job], crons=crons)(context).run_requests]

    assert launched(int(time.time() * 1000)) == [], "checked this year, nothing waiting: no run"
    assert launched(1) == ["lake_worker_0"], "a tick passed since its last full check: the worker is launched"


def test_a_full_check_that_raises_waits_for_its_next_tick(
    settings, catalog, writer_factory, kafka_config, unique, topic_factory
):
    """A check that fails (here: no Spark session) is recorded as attempted, so neither a worker run nor the
    sensor tries it again before its cron's next tick; the error is the check's own."""
    from kafka_iceberg.lake_assets.chore_jobs import full_check

    topic = topic_factory(unique, partitions=1)
    spec = make_spec(unique, topic)
    writer = writer_factory(spec)
    produce(kafka_config, topic, event_records(range(10)))
    writer.execute(writer.plan(), "run-a")
    with pytest.raises(AttributeError):
        full_check(ChoreEnv(None, settings, catalog, None), spec, 12345)
    assert load_table(catalog, spec.identifier).properties[LAST_RUN_PROPERTY.format(kind=FULL_CHECK)] == "12345"
