"""The write path's commits against real Spark, the real JDBC catalog (SQLite) and the dev broker: old
metadata files are deleted after each commit, a refused publish leaves none of its files, a publish
survives several concurrent commits in a row (retried as the table's ``commit.retry.*`` say), and a
concurrent partition-spec change fails the publish cleanly instead of mislabelling its files."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from devtools.demo.data import produce
from kafka_iceberg.batch import commit as commit_module
from kafka_iceberg.batch.pipeline import connect, prepare, run_micro_batch
from kafka_iceberg.batch.plan import plan_ingest
from kafka_iceberg.batch.publish import publish
from kafka_iceberg.batch.read import read_batch
from kafka_iceberg.batch.recovery import attempt_branch
from kafka_iceberg.batch.write import create_branch, write_attempt
from kafka_iceberg.catalog.tables import load_catalog, load_table
from kafka_iceberg.errors import CommitConflictError
from tests.helpers import data_files_on_disk, event_records, make_spec, referenced_data_files, table_rows


def _local(location: str) -> Path:
    return Path("/" + location.removeprefix("file:").lstrip("/"))


def _metadata_dir(catalog, spec) -> Path:
    return _local(load_table(catalog, spec.identifier).location()) / "metadata"


def _set_properties(catalog, spec, **properties) -> None:
    tx = load_table(catalog, spec.identifier).transaction()
    tx.set_properties(**properties)
    tx.commit_transaction()


def _referenced_metadata_files(catalog, spec) -> set[Path]:
    """The manifest lists and manifests every snapshot of the table references."""
    table = load_table(catalog, spec.identifier)
    out = set()
    for snapshot in table.snapshots():
        out.add(_local(snapshot.manifest_list))
        out.update(_local(m.manifest_path) for m in snapshot.manifests(table.io))
    return out


def _run(spark, settings, spec, kafka, catalog, **kw):
    return run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog, **kw)


def test_metadata_files_off_the_log_are_deleted_after_every_micro_batch(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    keep, batches = 2, 15
    topic = topic_factory(unique, partitions=1)
    spec = make_spec(unique, topic, max_records_per_partition=4)
    produce(kafka_config, topic, event_records(range(4 * (batches + 1))))
    assert _run(spark, settings, spec, kafka, catalog).records == 4
    _set_properties(catalog, spec, **{"write.metadata.previous-versions-max": str(keep)})
    for _ in range(batches):
        assert _run(spark, settings, spec, kafka, catalog).records == 4
    files = sorted(_metadata_dir(catalog, spec).glob("*.metadata.json"))
    # each micro-batch made two commits (its branch, its publish): 30 metadata files were written
    assert len(files) <= keep + 1, [f.name for f in files]
    table = load_table(catalog, spec.identifier)
    logged = {_local(e.metadata_file) for e in table.metadata.metadata_log} | {_local(table.metadata_location)}
    assert set(files) == logged, "exactly the current metadata.json and those its log keeps remain"
    assert sorted(r["id"] for r in table_rows(spark, settings, spec)) == list(range(4 * (batches + 1)))


def _written_attempt(lake, spec, commit_id):
    """Plan, branch, read and write one micro-batch; not published. Returns (plan, attempt, batch)."""
    _, history = prepare(lake, spec)
    plan = plan_ingest(lake, spec, history)
    branch = create_branch(
        lake, spec.identifier, attempt_branch(commit_id, int(time.time() * 1000)), plan.base_snapshot_id, plan.table
    )
    batch = read_batch(lake, spec, plan, commit_id, branch.table)
    return plan, write_attempt(lake, spec, plan, batch, branch, commit_id), batch


def test_a_refused_publish_leaves_no_manifest_manifest_list_or_data_file(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    topic = topic_factory(unique, partitions=2)
    spec = make_spec(unique, topic)
    produce(kafka_config, topic, event_records(range(100)))
    assert _run(spark, settings, spec, kafka, catalog).records == 100
    produce(kafka_config, topic, event_records(range(100, 200)))
    lake = connect(spark, settings, kafka, catalog)
    plan, attempt, batch = _written_attempt(lake, spec, f"refused-{unique}")
    try:
        assert attempt.files and not data_files_on_disk(settings, spec) <= referenced_data_files(spark, settings, spec)
        qualified = f"{settings.catalog.name}.{spec.identifier}"
        spark.sql(f"INSERT INTO {qualified} SELECT * FROM {qualified} LIMIT 1")  # main moves under the attempt
        with pytest.raises(CommitConflictError, match="moved from snapshot"):
            publish(lake, plan, attempt)
    finally:
        batch.classified.unpersist()
    assert data_files_on_disk(settings, spec) == referenced_data_files(spark, settings, spec)
    on_disk = set(_metadata_dir(catalog, spec).glob("*.avro"))
    assert on_disk == _referenced_metadata_files(catalog, spec), "the refused publish's manifests were deleted"


def test_a_publish_survives_concurrent_commits_in_a_row_and_stays_exactly_once(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, monkeypatch, caplog
):
    """Three commits by another writer land between each publish try's base and its compare-and-swap
    (the table moves, neither ref does): the publish tries again on a fresh load each time."""
    topic = topic_factory(unique, partitions=2)
    spec = make_spec(unique, topic)
    produce(kafka_config, topic, event_records(range(50)))
    assert _run(spark, settings, spec, kafka, catalog).records == 50
    _set_properties(catalog, spec, **{"commit.retry.min-wait-ms": "10"})
    produce(kafka_config, topic, event_records(range(50, 120)))
    other = load_catalog(settings.catalog)  # another writer: its own catalog client
    publishing, moved = [], []
    real_write = commit_module._write

    def write_after_another_commit(catalog_, metadata, base_location):
        if publishing and len(moved) < 3:
            tx = other.load_table(spec.identifier).transaction()
            tx.set_properties(**{"test.concurrent": str(len(moved))})
            tx.commit_transaction()
            moved.append(base_location)
        return real_write(catalog_, metadata, base_location)

    monkeypatch.setattr(commit_module, "_write", write_after_another_commit)
    caplog.set_level("INFO", logger="kafka_iceberg.batch.commit_retry")
    result = _run(
        spark, settings, spec, kafka, catalog, crash_hook=lambda p: p == "after_write" and publishing.append(p)
    )
    assert result.committed and result.records == 70
    assert len(moved) == 3 and caplog.text.count("on a fresh load") >= 3, "three tries were refused"
    rows = table_rows(spark, settings, spec)
    assert sorted(r["id"] for r in rows) == list(range(120))
    assert len({(r["_kafka_partition"], r["_kafka_offset"]) for r in rows}) == 120
    assert data_files_on_disk(settings, spec) == referenced_data_files(spark, settings, spec)


def test_micro_batches_publish_while_another_writer_commits_in_a_loop(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    """Property updates by another writer in a thread, a few a second, while the next micro-batches (8 or more) run: none
    fails, and every record is in the table once. Records keep coming until the other writer committed 9 times."""
    topic = topic_factory(unique, partitions=2)
    spec = make_spec(unique, topic, max_records_per_partition=10)
    produced = 180
    produce(kafka_config, topic, event_records(range(produced)))
    assert _run(spark, settings, spec, kafka, catalog).committed
    _set_properties(catalog, spec, **{"commit.retry.min-wait-ms": "20"})
    other, stop, commits = load_catalog(settings.catalog), threading.Event(), []

    def other_writer():
        while not stop.is_set():
            try:
                tx = other.load_table(spec.identifier).transaction()
                tx.set_properties(**{"test.concurrent": str(len(commits))})
                tx.commit_transaction()
                commits.append(1)
            except Exception:  # noqa: BLE001 - a refused or locked commit of the other writer is its own affair
                pass
            time.sleep(0.2)

    thread = threading.Thread(target=other_writer, daemon=True)
    thread.start()
    try:
        results = [_run(spark, settings, spec, kafka, catalog)]
        while results[-1].committed and len(results) < 60:  # no micro-batch may fail
            if results[-1].total_lag == 0 and len(commits) > 8:
                break
            if results[-1].total_lag == 0:
                produce(kafka_config, topic, event_records(range(produced, produced + 20)))
                produced += 20
            results.append(_run(spark, settings, spec, kafka, catalog))
    finally:
        stop.set()
        thread.join()
    assert len(results) >= 8 and results[-1].committed and results[-1].total_lag == 0
    assert len(commits) > 8, "the other writer committed throughout (the test can fail)"
    rows = table_rows(spark, settings, spec)
    assert sorted(r["id"] for r in rows) == list(range(produced))
    assert len({(r["_kafka_partition"], r["_kafka_offset"]) for r in rows}) == produced


def test_a_concurrent_partition_spec_change_fails_the_publish_cleanly(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    topic = topic_factory(unique, partitions=2)
    spec = make_spec(unique, topic)
    produce(kafka_config, topic, event_records(range(60)))
    assert _run(spark, settings, spec, kafka, catalog).records == 60
    produce(kafka_config, topic, event_records(range(60, 100)))
    lake = connect(spark, settings, kafka, catalog)
    plan, attempt, batch = _written_attempt(lake, spec, f"respec-{unique}")
    qualified = f"{settings.catalog.name}.{spec.identifier}"
    try:
        spark.sql(f"ALTER TABLE {qualified} ADD PARTITION FIELD bucket(4, id)")  # neither ref moves
        with pytest.raises(CommitConflictError, match="partition spec"):
            publish(lake, plan, attempt)
    finally:
        batch.classified.unpersist()
    assert data_files_on_disk(settings, spec) == referenced_data_files(spark, settings, spec)
    assert set(_metadata_dir(catalog, spec).glob("*.avro")) == _referenced_metadata_files(catalog, spec)
    # the next micro-batch writes its files for the new spec and publishes
    result = _run(spark, settings, spec, kafka, catalog, is_alive=lambda attempt: False)
    assert result.records == 40
    table = load_table(catalog, spec.identifier)
    head_files = table.inspect.files().to_pylist()
    assert {f["spec_id"] for f in head_files if f["record_count"]} >= {table.metadata.default_spec_id}
    assert sorted(r["id"] for r in table_rows(spark, settings, spec)) == list(range(100))
