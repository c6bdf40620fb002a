"""A streaming table's snapshots stay bounded (``maintenance.max_snapshots``): a worker run checks the
table and then expires it by count, keeping what the ingest state and the next incremental check
need; a worker run compacts a table once its commits added ``compact_after_data_files``
data files. Real Spark, the real catalog, the dev broker."""

from __future__ import annotations

from types import SimpleNamespace

from devtools.demo.data import produce
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.batch.worker import Clock
from kafka_iceberg.catalog.tables import load_table, metadata_view, qualified
from kafka_iceberg.lake_assets.vocabulary import table_key
from kafka_iceberg.lake_assets.worker_chores import CONCURRENT_COMMIT_RETRIES, ChoreEnv, WorkerChores
from kafka_iceberg.ops import checks
from kafka_iceberg.ops.chore_state import EXPIRY_HOLD_S
from kafka_iceberg.ops.maintenance import CONCURRENT_COMMITS
from kafka_iceberg.ops.rota import MaintenanceRota
from kafka_iceberg.state import state_at
from tests.helpers import event_records, make_spec
from tests.test_worker import _rows


def _context(run_id: str, events: list, spec=None):
    log = SimpleNamespace(info=lambda msg: None, error=events.append, warning=events.append)
    key = table_key(spec) if spec is not None else None
    return SimpleNamespace(run_id=run_id, log=log, log_event=events.append, asset_key=key)


def _table(kafka_config, unique, topic_factory, records=200, max_snapshots=6, maintenance=None):
    """A table of 20-record micro-batches on a one-partition topic holding ``records``; ``maintenance``
    (default: ``retain_last`` 2 and ``max_snapshots``) is its declaration's section."""
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(records)))
    maintenance = maintenance or {"retain_last": 2, "max_snapshots": max_snapshots}
    return make_spec(unique, topic, max_records_per_partition=20, maintenance=maintenance)


def _chores(settings, spark, catalog, spec, unique, run="run", clock=None, another_run=lambda: False):
    """(the ``WorkerChores`` of run ``<run>-<unique>`` over ``spec``, the check outcomes it reports, the
    events it logs); ``clock``: default, monotonic seconds stand still."""
    reported, events = [], []

    class Chores(WorkerChores):
        def report(self, spec, outcome):
            reported.append(outcome)

    env = ChoreEnv(spark, settings, catalog, None)
    still = clock or Clock(now=lambda: 1000.0)  # monotonic seconds stand still: the steps decide, not the load
    context = _context(f"{run}-{unique}", events)
    return Chores(context, [spec], MaintenanceRota({}), env, still, another_run), reported, events


def test_a_worker_checks_a_table_past_max_snapshots_then_expires_it_and_the_check_stays_incremental(
    settings, spark, kafka, catalog, kafka_config, unique, topic_factory
):
    spec = _table(kafka_config, unique, topic_factory, records=400, max_snapshots=15)
    chores, reported, events = _chores(settings, spark, catalog, spec, unique)
    context = chores.context

    def commit() -> None:
        result = run_micro_batch(spark, settings, spec, commit_id=context.run_id, kafka=kafka, catalog=catalog)
        chores.committed(spec, result.snapshots)

    for _ in range(14):  # the first commit makes two snapshots (an empty one as the table is created)
        commit()
    assert chores(False) is False, "15 snapshots: at the ceiling (and a busy worker checks later)"
    commit()  # 16 snapshots: past it
    assert chores(False) is True and chores.running.what == "duplicate_free", "its pending check goes first"
    chores.running.future.result(timeout=300)
    assert chores(False) is True and chores.running.what == "expire_snapshots", "then the expiry, in the background"
    assert reported[0].passed and reported[0].figures["scope"] == "incremental"
    commit()  # the worker goes on committing to the table while it is expired
    chores.running.future.result(timeout=300)
    assert chores(False) is False, "the expiry is logged; the count the commit reported is from before it"
    (observation,) = [e for e in events if type(e).__name__ == "AssetObservation"]
    assert observation.metadata["procedure_output"].value["over_max_snapshots"] == 16
    view = metadata_view(load_table(catalog, spec.identifier))
    # what the next check reads and a margin, and the new commit unless it landed before the expiry loaded the table
    assert 1 + CONCURRENT_COMMITS <= len(view.snapshots) <= 2 + CONCURRENT_COMMITS
    assert state_at(view.snapshots, view.main).offsets == {0: 320}, "the ingest state survives"

    for _ in range(4):
        commit()
    chores.finish()  # the next check reads after the snapshot the first one covered, which was kept
    assert reported[1].passed and reported[1].figures["scope"] == "incremental"
    assert reported[1].figures["rows_scanned"] == 100
    assert _rows(settings, spec) == (400, 400)
    # a check whose first snapshots were expired cannot read incrementally: it reads the whole table
    table = load_table(catalog, spec.identifier)
    full = checks.duplicate_free(spark, qualified(settings, spec), spec, table, commit_id=context.run_id)
    assert full.passed and full.figures["scope"] == "full"


def test_at_a_hand_over_the_successor_expires_only_after_its_predecessors_last_checks_read_incrementally(
    settings, spark, kafka, catalog, kafka_config, unique, topic_factory
):
    spec = _table(kafka_config, unique, topic_factory, records=240, max_snapshots=8)
    first, reported, _ = _chores(settings, spark, catalog, spec, unique, run="first")
    for _ in range(3):  # 4 snapshots (the first commit creates the table)
        result = run_micro_batch(spark, settings, spec, commit_id=first.context.run_id, kafka=kafka, catalog=catalog)
        first.committed(spec, result.snapshots)
    pending = first.pending()  # the serving op hands over: its checks wait for its check op
    first.close()
    now, in_progress = [1000.0], [True]
    clock = Clock(now=lambda: now[0])
    second, _, events = _chores(settings, spark, catalog, spec, unique, "second", clock, lambda: in_progress[0])
    for _ in range(6):  # 10 snapshots: past the ceiling
        result = run_micro_batch(spark, settings, spec, commit_id=second.context.run_id, kafka=kafka, catalog=catalog)
        second.committed(spec, result.snapshots)
    assert second(False) is False and second.running is None, "no expiry while the first run is in progress"
    with type(first).resume(first.context, [spec], pending, first.env) as last:  # the first run's check op
        last.finish()
    assert reported[-1].passed and reported[-1].figures["scope"] == "incremental", reported[-1].summary
    assert reported[-1].figures["rows_scanned"] == 180, "to main: its three micro-batches and the six after them"
    now[0] += EXPIRY_HOLD_S  # a run that never ends holds the expiry EXPIRY_HOLD_S at most
    assert second(False) is True and second.running.what == "duplicate_free", "its own check first"
    second.running.future.result(timeout=300)
    assert second(False) is True and second.running.what == "expire_snapshots"
    second.running.future.result(timeout=300)
    assert second(False) is False, "the expiry is logged"
    second.close()
    (observation,) = [e for e in events if type(e).__name__ == "AssetObservation"]
    assert observation.metadata["procedure_output"].value["over_max_snapshots"] == 10


def test_a_worker_compacts_a_table_whose_commits_added_compact_after_data_files_in_the_background(
    settings, spark, kafka, catalog, kafka_config, unique, topic_factory
):
    spec = _table(kafka_config, unique, topic_factory, maintenance={"compact_after_data_files": 15})
    chores, reported, events = _chores(settings, spark, catalog, spec, unique)
    context, added = chores.context, []

    def commit() -> None:
        result = run_micro_batch(spark, settings, spec, commit_id=context.run_id, kafka=kafka, catalog=catalog)
        assert result.data_files_added >= 1, "a micro-batch adds a data file per partition it writes"
        added.append(result.data_files_added)
        chores.committed(spec, result.snapshots, result.data_files_added)

    commit()
    while sum(added) < 15:
        assert chores(False) is False, f"{sum(added)} data files added: below compact_after_data_files"
        commit()
    assert chores(False) is True and chores.running.what == "compact", (
        "15 or more (5 per partition, which rewrite_data_files bin-packs): compacted in the background"
    )
    commit()  # the worker goes on committing to the table while it is compacted
    chores.running.future.result(timeout=300)
    assert chores(False) is False, "the compaction is logged; the count starts again"
    (observation,) = [e for e in events if type(e).__name__ == "AssetObservation"]
    assert observation.metadata["procedure"].value == "rewrite_data_files"
    assert observation.metadata["data_files_before"].value > observation.metadata["data_files_after"].value
    while len(added) < 10:
        commit()
    table = load_table(catalog, spec.identifier)
    assert int(table.current_snapshot().summary["total-data-files"]) < sum(added), "compacted"
    assert table.properties["commit.retry.num-retries"] == str(CONCURRENT_COMMIT_RETRIES), "Iceberg's 4 is too few"
    view = metadata_view(table)
    assert state_at(view.snapshots, view.main).offsets == {0: 200}, "the ingest state reads through the replace"
    chores.finish()
    assert reported[0].passed, reported[0]
    assert _rows(settings, spec) == (200, 200)
