"""Tables parsed by pyarrow (kafka_iceberg/batch/files.py): the read tasks write the records pyarrow
claimed as data files with pyiceberg's writer, a second job writes the good records only Spark
could classify, and one catalog commit puts them all in one snapshot on ``main``. Real Spark, broker,
catalog and DuckDB: the table must hold exactly what the Spark path (``from_json`` and Spark's writer,
which serves the tables pyarrow cannot parse) makes of the same topic."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from kafka_iceberg.batch import commit as commit_module
from kafka_iceberg.batch import files as files_module
from kafka_iceberg.batch import read as read_module
from kafka_iceberg.batch.pipeline import connect, run_micro_batch, warm_up
from kafka_iceberg.batch.warm import warm_read_job
from kafka_iceberg.catalog.tables import load_table
from tests.helpers import BASE_TS_MS, current_view, data_files_on_disk, event, make_spec, referenced_data_files

GOOD = [json.dumps(event(i)).encode() for i in range(40)]
ONLY_SPARK = [
    json.dumps(event(100), indent=2).encode(),  # good, but several lines: Spark parses it
    json.dumps({**event(101), "amount": 5}).encode()[:-1] + b" }",
]  # good, unusual spacing
BAD = [b"not json", None, json.dumps({**event(102), "id": None}).encode()]


def _produce(kafka_config, topic: str) -> int:
    producer = Producer(kafka_config.client_conf())
    values = GOOD[:20] + ONLY_SPARK + BAD + GOOD[20:]
    for n, value in enumerate(values):
        headers = [("trace", f"t{n}".encode()), ("empty", None)] if n % 3 == 0 else None
        producer.produce(
            topic,
            key=None if n % 5 == 0 else f"k{n}".encode(),
            value=value,
            headers=headers,
            partition=n % 2,
            timestamp=BASE_TS_MS + n,
        )
    assert producer.flush(30) == 0
    return len(values)


def _rows(spark, settings, identifier: str) -> list:
    df = spark.table(f"{settings.catalog.name}.{identifier}")
    return [tuple(r) for r in df.orderBy("_kafka_partition", "_kafka_offset").collect()]


def test_arrow_writer_makes_the_table_spark_writer_makes(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, monkeypatch
):
    """The same declaration through both paths: the Spark path is forced by making the table's
    declaration count as one pyarrow cannot parse (as a ``DECIMAL`` column or ``key_format`` would)."""
    topic = topic_factory(unique, partitions=2)
    produced = _produce(kafka_config, topic)
    results, routed = {}, []
    for path in ("arrow", "spark"):
        spec = make_spec(f"{unique}_{path}", topic)
        if path == "spark":
            monkeypatch.setattr(read_module, "arrow_parsed", lambda spec: routed.append(spec) or False)
        results[path] = (
            spec,
            run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog),
        )
    monkeypatch.undo()
    (arrow_spec, arrow), (spark_spec, by_spark) = results["arrow"], results["spark"]
    assert routed, "the second table went through the Spark path (the check can fail)"
    assert arrow.records_read == produced and arrow.quarantined == len(BAD)
    assert arrow.records == len(GOOD) + len(ONLY_SPARK) == by_spark.records
    assert (
        arrow.quarantine_kinds == by_spark.quarantine_kinds
        and arrow.quarantined_by_partition == by_spark.quarantined_by_partition
    )

    rows = _rows(spark, settings, arrow_spec.identifier)
    assert rows == _rows(spark, settings, spark_spec.identifier), "same rows, values and Kafka columns"
    assert {r[0] for r in rows} == set(range(40)) | {100, 101}
    dlq = [
        (r["partition"], r["offset"], r["error_kind"])
        for r in spark.table(f"{settings.catalog.name}.{arrow_spec.bad_records.dead_letter_identifier}").collect()
    ]
    assert sorted(dlq) == sorted(
        (r["partition"], r["offset"], r["error_kind"])
        for r in spark.table(f"{settings.catalog.name}.{spark_spec.bad_records.dead_letter_identifier}").collect()
    )

    table = load_table(catalog, arrow_spec.identifier)
    snapshot = table.current_snapshot()
    summary = snapshot.summary.additional_properties
    spark_summary = load_table(catalog, spark_spec.identifier).current_snapshot().summary.additional_properties
    state = {
        k: v for k, v in summary.items() if k.startswith("kafka.") and k not in ("kafka.commit-id", "kafka.dead-letter")
    }
    assert state and state == {k: v for k, v in spark_summary.items() if k in state}
    assert int(summary["added-records"]) == arrow.records

    paths = [t.file.file_path for t in table.scan().plan_files()]
    assert len(paths) > 1 and int(summary["added-data-files"]) == len(paths), "every file in one snapshot"
    schema = pq.read_schema(paths[0].removeprefix("file://"))
    field_ids = {f.name: int(f.metadata[b"PARQUET:field_id"]) for f in schema}
    assert field_ids == {f.name: f.field_id for f in table.schema().fields}, "Parquet field ids are the table's"
    assert data_files_on_disk(settings, arrow_spec) == referenced_data_files(spark, settings, arrow_spec)


def test_a_failed_commit_deletes_the_files_its_tasks_wrote(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, monkeypatch
):
    topic = topic_factory(unique, partitions=2)
    _produce(kafka_config, topic)
    spec = make_spec(unique, topic)

    def refuse(*args, **kwargs):
        raise RuntimeError("commit refused (test)")

    monkeypatch.setattr("kafka_iceberg.batch.commit.StagedPublish.commit", refuse)
    try:
        run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
        raise AssertionError("the micro-batch should have failed")
    except RuntimeError as exc:
        assert "commit refused" in str(exc)
    assert current_view(catalog, spec).main is None
    assert not data_files_on_disk(settings, spec), "the tasks' files were deleted with the failed attempt"

    monkeypatch.undo()
    result = run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    assert result.records == len(GOOD) + len(ONLY_SPARK)


def test_data_files_pins_pyiceberg_private_writer(spark, settings, catalog, unique):
    """``files.data_files`` wraps pyiceberg's private ``_dataframe_to_data_files``: partitioned by the
    table's spec, with the record counts and partition values a commit needs. ``commit.stage_publish``
    (through the private ``Transaction._updates``, wrapped in ``staged_updates``) makes one commit
    that appends them on the attempt branch's head, moves ``main`` there and drops the branch, and
    the catalog refuses it unless both refs are where it requires them."""
    from pyiceberg.exceptions import CommitFailedException

    identifier, qualified = f"test.pin_{unique}", f"{settings.catalog.name}.test.pin_{unique}"
    spark.sql(f"CREATE TABLE {qualified} (id BIGINT NOT NULL, day DATE) USING iceberg PARTITIONED BY (day)")
    table = load_table(catalog, identifier)
    rows = pa.table(
        {"id": pa.array([1, 2, 3], pa.int64()), "day": pa.array([19000, 19000, 19001], pa.int32()).cast(pa.date32())},
        schema=pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("day", pa.date32())]),
    )
    written = files_module.data_files(table.metadata, rows, table.io)
    assert sorted(f.record_count for f in written) == [1, 2]
    assert sorted(f.partition[0] for f in written) == [19000, 19001]

    spark.sql(f"ALTER TABLE {qualified} CREATE BRANCH b1")  # an empty table: an empty snapshot
    table = load_table(catalog, identifier)
    b1 = table.metadata.refs["b1"].snapshot_id
    staged = commit_module.stage_publish(
        table, written, {"test.key": "v"}, branch="b1", branch_base=b1, ref="main", ref_base=None
    )
    first = staged.commit()
    assert sorted(r["id"] for r in spark.table(qualified).collect()) == [1, 2, 3]
    assert set(first.metadata.refs) == {"main"}, "the branch went in the same commit"
    head = load_table(catalog, identifier).current_snapshot()
    assert head.snapshot_id == staged.snapshot_id and head.parent_snapshot_id == b1
    assert head.summary.additional_properties["test.key"] == "v"

    spark.sql(f"ALTER TABLE {qualified} CREATE BRANCH b2")  # at main's head
    load_table(catalog, identifier).manage_snapshots().create_branch(  # a retention setting on main
        staged.snapshot_id, "main", min_snapshots_to_keep=5
    ).commit()
    table = load_table(catalog, identifier)
    more = files_module.data_files(table.metadata, rows, table.io)
    for wrong in (dict(branch_base=b1, ref_base=staged.snapshot_id), dict(branch_base=staged.snapshot_id, ref_base=b1)):
        with pytest.raises(CommitFailedException):  # either requirement alone refuses it
            commit_module.stage_publish(table, more, {}, branch="b2", ref="main", **wrong).commit()
    again = commit_module.stage_publish(
        table,
        more,
        {"test.key": "w"},
        branch="b2",
        branch_base=staged.snapshot_id,
        ref="main",
        ref_base=staged.snapshot_id,
    ).commit()
    # the commit is produced without the table's history, but the catalog keeps all of it
    assert len(again.metadata.snapshots) == 3 and set(again.metadata.refs) == {"main"}
    assert again.current_snapshot().parent_snapshot_id == staged.snapshot_id
    assert again.current_snapshot().summary["total-records"] == "6"
    assert again.metadata.refs["main"].min_snapshots_to_keep == 5, "main keeps its retention, as a fast-forward does"
    assert "commit.manifest-merge.enabled" not in again.metadata.properties, (
        "Java's default is not written to the table"
    )


def test_commit_on_metadata_the_table_outgrew_retries_on_a_fresh_load(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, caplog
):
    """The arrow commit starts from the metadata ``prepare`` loaded. A snapshot committed in between (here
    to another branch, so ``main`` does not move) makes the catalog refuse that commit; it is made again on a
    fresh load, and the batch publishes exactly once."""
    topic = topic_factory(unique, partitions=2)
    _produce(kafka_config, topic)
    spec = make_spec(unique, topic)
    first = run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    _produce(kafka_config, topic)
    table = f"{settings.catalog.name}.{spec.identifier}"

    def commit_elsewhere(point: str) -> None:
        if point == "after_read":
            spark.sql(f"ALTER TABLE {table} CREATE BRANCH side")
            spark.sql(f"INSERT INTO {table}.branch_side SELECT * FROM {table} LIMIT 1")

    caplog.set_level("INFO", logger="kafka_iceberg.batch.commit_retry")
    second = run_micro_batch(
        spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog, crash_hook=commit_elsewhere
    )
    assert "on a fresh load" in caplog.text, "the fallback ran (the check can fail)"
    assert second.committed and second.records == first.records
    offsets = [(r[0], r[1]) for r in spark.sql(f"SELECT _kafka_partition, _kafka_offset FROM {table}").collect()]
    assert len(offsets) == 2 * first.records and len(set(offsets)) == len(offsets), "each record once"
    view = current_view(catalog, spec)
    assert set(view.refs) == {"main", "side"}, "the attempt branch went with the publish"


def test_value_columns_from_the_loaded_table_are_those_spark_reports(spark, settings, catalog, unique):
    """The arrow path takes its value columns from the pyiceberg table ``prepare`` loaded, not from a
    Spark table lookup: the same names, Spark SQL types and required flags, Kafka columns left out."""
    from kafka_iceberg.declaration.spec import KAFKA_COLUMNS
    from kafka_iceberg.formats.transform import iceberg_value_columns, value_columns

    qualified = f"{settings.catalog.name}.test.cols_{unique}"
    kafka = ", ".join(f"{name} {typ}" for name, typ in KAFKA_COLUMNS.values())
    spark.sql(
        f"CREATE TABLE {qualified} (i INT NOT NULL, l BIGINT, d DOUBLE, s STRING, b BOOLEAN, t TIMESTAMP, "
        f"{kafka}) USING iceberg"
    )
    from_iceberg = iceberg_value_columns(load_table(catalog, f"test.cols_{unique}").schema())
    assert from_iceberg == value_columns(spark.table(qualified).schema)
    assert [c.name for c in from_iceberg] == ["i", "l", "d", "s", "b", "t"] and from_iceberg[0].required
    spark.sql(f"ALTER TABLE {qualified} ADD COLUMN amount DECIMAL(10, 2)")
    assert iceberg_value_columns(load_table(catalog, f"test.cols_{unique}").schema()) is None, "ask Spark"


def _send(kafka_config, topic: str, values: list) -> None:
    producer = Producer(kafka_config.client_conf())
    for n, value in enumerate(values):
        producer.produce(topic, key=f"k{n}".encode(), value=value, partition=n % 2, timestamp=BASE_TS_MS + n)
    assert producer.flush(30) == 0


def _spark_jobs(spark, settings, spec, kafka, catalog, group: str):
    """One micro-batch of ``spec`` with its Spark jobs tagged ``group``: its result and the jobs' ids."""
    spark.sparkContext.setJobGroup(group, group)
    try:
        result = run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    return result, spark.sparkContext.statusTracker().getJobIdsForGroup(group)


def _cluster(settings):
    """``settings`` as on a cluster master, where the driver reads only small micro-batches (the session
    stays the tests' local one)."""
    return dataclasses.replace(settings, spark_master="spark://cluster:7077")


def test_a_small_batch_is_read_by_the_driver_and_a_bad_record_sends_it_to_spark(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, monkeypatch
):
    """``read.read_by_driver``: a micro-batch of good records runs no Spark job and makes the table the
    Spark job makes (that of a cluster master with ``DRIVER_READ_MAX_RECORDS`` at 0); one with a bad record
    is read again by Spark (the driver's files deleted), quarantines it, and keeps every good record once."""
    topic = topic_factory(unique, partitions=2)
    _send(kafka_config, topic, GOOD[:20])
    driver, by_spark = make_spec(f"{unique}_driver", topic), make_spec(f"{unique}_spark", topic)

    def by_job(spec, group: str):
        with monkeypatch.context() as patched:
            patched.setattr(read_module, "DRIVER_READ_MAX_RECORDS", 0)
            return _spark_jobs(spark, _cluster(settings), spec, kafka, catalog, group)

    _spark_jobs(spark, settings, driver, kafka, catalog, f"{unique}-create")  # the first batch creates the tables
    by_job(by_spark, f"{unique}-create-spark")
    _send(kafka_config, topic, GOOD[20:])
    result, jobs = _spark_jobs(spark, settings, driver, kafka, catalog, f"{unique}-driver")
    assert result.records == 20 and jobs == [], jobs
    result, jobs = by_job(by_spark, f"{unique}-spark")
    assert result.records == 20 and jobs, "the same batch through Spark runs jobs (the check can fail)"
    assert _rows(spark, settings, driver.identifier) == _rows(spark, settings, by_spark.identifier)

    _send(kafka_config, topic, [GOOD[0], BAD[0], GOOD[1]])
    result, jobs = _spark_jobs(spark, settings, driver, kafka, catalog, f"{unique}-fallback")
    assert jobs and result.records == 2 and result.quarantined == 1
    offsets = [
        (r[-2], r[-1])
        for r in spark.sql(
            f"SELECT _kafka_partition, _kafka_offset FROM {settings.catalog.name}.{driver.identifier}"
        ).collect()
    ]
    assert len(offsets) == len(set(offsets)) == 42, "every good record once"
    assert data_files_on_disk(settings, driver) == referenced_data_files(spark, settings, driver)


def test_the_driver_consumes_while_a_pool_parses_and_writes_every_record_once(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, monkeypatch
):
    """``driver_read.read_and_write`` with a parse pool of two threads and 7-record chunks (many chunks in
    flight, the bound on them reached): every offset of every piece lands in exactly one data file, the
    chunk statistics count each record once, and a batch with a bad record reports it as left over. A
    write that fails midway raises, and the data files already written are deleted."""
    from kafka_iceberg.batch import driver_read
    from kafka_iceberg.kafka import reader as reader_module

    topic = topic_factory(unique, partitions=2)
    _send(kafka_config, topic, GOOD)
    spec = make_spec(f"{unique}_pool", topic)
    run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    table = load_table(catalog, spec.identifier)
    columns = tuple(read_module.arrow_columns(None, spec.identifier, table))
    parser, writer = read_module.arrow_parser(spec, columns), files_module.file_writer(table, spec, columns)
    monkeypatch.setattr(reader_module, "CHUNK_RECORDS", 7)
    monkeypatch.setattr(files_module, "FLUSH_ROWS", 9)  # several files per sink
    source = driver_read.Source(dict(kafka_config.client_conf()), spec.identifier, 30.0, kafka.readers)
    ranges = [(topic, p, 0, 20) for p in (0, 1)]  # 20 records per partition, read at once

    done = driver_read.read_and_write(source, ranges, parser, writer, threads=2)
    assert done.leftovers == 0 and sum(s.records for s in done.stats) == len(GOOD)
    assert len(done.stats) >= 2 * len(ranges) and len(done.files) > 2, "chunks of every partition, several files"
    read = pa.concat_tables([pq.read_table(f.file_path.removeprefix("file://")) for f in done.files])
    offsets = sorted(zip(read.column("_kafka_partition").to_pylist(), read.column("_kafka_offset").to_pylist()))
    assert offsets == sorted((p, o) for p in (0, 1) for o in range(20)), "every offset once"
    files_module.discard(writer.io(), done.files)

    _send(kafka_config, topic, [GOOD[0], BAD[0]])  # offset 20 of partitions 0 and 1
    bad = driver_read.read_and_write(source, [(topic, 1, 20, 21)], parser, writer, threads=2)
    assert bad.leftovers == 1 and sum(s.records for s in bad.stats) == 1
    files_module.discard(writer.io(), bad.files)

    written: list = []
    real_write = files_module.FileWriter.write

    def write_then_fail(self, rows):
        if written:
            raise OSError("warehouse full")
        written.extend(real_write(self, rows))
        return written

    monkeypatch.setattr(files_module.FileWriter, "write", write_then_fail)
    with pytest.raises(OSError, match="warehouse full"):
        driver_read.read_and_write(source, ranges, parser, writer, threads=2)
    assert written and not any(Path(f.file_path.removeprefix("file://")).exists() for f in written)


def test_warm_up_runs_the_read_job_for_a_backlog_on_no_records_and_changes_nothing(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, monkeypatch
):
    """A worker's warm-up runs the read phase's Spark job when a table's next micro-batch starts it (on a
    cluster master, an offset lag above ``read.DRIVER_READ_MAX_RECORDS``), over an empty range: no
    record read, no file written, no snapshot. No job runs without such a lag, on a local master (the
    driver reads every micro-batch), or for a table parsed by Spark (``unknown_fields: evolve``), whose
    micro-batches never start that job."""
    topic = topic_factory(unique, partitions=2)
    _send(kafka_config, topic, GOOD[:20])
    spec = make_spec(f"{unique}_warm", topic)
    run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    _send(kafka_config, topic, GOOD[20:30])  # an offset lag of 10
    head, files = current_view(catalog, spec).main, data_files_on_disk(settings, spec)

    def jobs(group: str, threshold: int, table=spec, conf=_cluster(settings)) -> list:
        spark.sparkContext.setJobGroup(group, group)
        try:
            with monkeypatch.context() as patched:
                patched.setattr(read_module, "DRIVER_READ_MAX_RECORDS", threshold)
                assert warm_up(connect(spark, conf, kafka, catalog), [table]) == {table.identifier: "warm"}
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        return spark.sparkContext.statusTracker().getJobIdsForGroup(group)

    assert jobs(f"{unique}-backlog", 9), "a lag of 10 above 9: the read job ran"
    assert jobs(f"{unique}-small", 10) == []
    assert jobs(f"{unique}-local", 0, conf=settings) == [], "a local master: the driver reads any batch"
    assert read_module.read_by_driver(settings, 10**7) and not read_module.read_by_driver(_cluster(settings), 10**7)
    by_spark = make_spec(f"{unique}_evolve", topic, unknown_fields="evolve")
    run_micro_batch(spark, settings, by_spark, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    _send(kafka_config, topic, GOOD[30:40])  # a lag of 10 for it, 20 for spec
    assert jobs(f"{unique}-spark", 0, by_spark) == []
    assert warm_read_job(connect(spark, settings, kafka, catalog), by_spark) is None
    assert current_view(catalog, spec).main == head and data_files_on_disk(settings, spec) == files
    assert len(_rows(spark, settings, spec.identifier)) == 20


def test_staging_transaction_builds_the_metadata_once_per_staged_change(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, monkeypatch
):
    """Pins :class:`kafka_iceberg.batch.commit.StagingTransaction` on pyiceberg: it stages the same
    updates as pyiceberg's ``Transaction``, sees each staged change, and builds the metadata fewer times."""
    import pyiceberg.table
    from pyiceberg.table import Transaction
    from pyiceberg.table.update import AddSnapshotUpdate

    from kafka_iceberg.batch.commit import StagingTransaction, staged_files, staged_updates

    topic = topic_factory(unique, partitions=2)
    _send(kafka_config, topic, GOOD[:10])
    spec = make_spec(f"{unique}_staging", topic)
    run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    table = load_table(catalog, spec.identifier)
    data_file = next(iter(table.scan().plan_files())).file
    builds, real = [], pyiceberg.table.update_table_metadata
    monkeypatch.setattr(pyiceberg.table, "update_table_metadata", lambda *a, **k: builds.append(1) or real(*a, **k))
    staged = {}
    for make in (Transaction, StagingTransaction):
        builds.clear()
        tx = make(table)
        tx.set_properties(staged="yes")
        assert tx.table_metadata.properties["staged"] == "yes", "a staged change is seen"
        with tx.update_snapshot(snapshot_properties={"x": "1"}).merge_append() as append:
            append.append_data_file(data_file)
        assert tx.table_metadata.snapshot_by_id(tx.table_metadata.current_snapshot_id).summary["x"] == "1"
        updates = staged_updates(tx)
        snapshot = next(u.snapshot for u in updates if isinstance(u, AddSnapshotUpdate))
        staged[make] = (len(builds), [type(u).__name__ for u in updates], snapshot.summary.additional_properties)
        for path in staged_files(tx):
            table.io.delete(path)
    assert staged[StagingTransaction][1:] == staged[Transaction][1:]
    assert staged[StagingTransaction][0] < staged[Transaction][0], staged
