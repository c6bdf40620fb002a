"""The read phase: the plan's offset ranges from Kafka into one classified, persisted Spark
DataFrame with per-partition statistics (:class:`ReadBatch`). Schema evolution (``unknown_fields:
evolve``) happens here, so the batch is classified against the columns it will be written with.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re

from kafka_iceberg.batch.context import Lake
from kafka_iceberg.batch.driver_read import Source, read_and_write
from kafka_iceberg.batch.evolve import evolve_schema, table_value_columns
from kafka_iceberg.batch.files import discard, file_writer
from kafka_iceberg.batch.formats import classify_registry
from kafka_iceberg.batch.keys import parse_keys, with_key_problem
from kafka_iceberg.batch.planning import BatchPlan, split_ranges
from kafka_iceberg.batch.read_stats import check_read, first_bad_record, partition_stats, piece_totals, quarantine_kinds
from kafka_iceberg.batch.types import ReadBatch, WritePlan
from kafka_iceberg.cdc.changes import parse_changes
from kafka_iceberg.config.settings import Settings
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.formats import arrow_json
from kafka_iceberg.formats.transform import (
    classify,
    classify_parsed,
    iceberg_value_columns,
)
from kafka_iceberg.kafka.reader import make_task_reader, stats_accumulator
from kafka_iceberg.kafka.records import RAW_SCHEMA_DDL

RANGE_DDL = "topic STRING, partition INT, start BIGINT, end BIGINT"
"""A Spark read task's input: one row per range piece."""

DRIVER_READ_MAX_RECORDS = 20_000
"""On a cluster master, micro-batches of pyarrow-parsed tables of at most this many offsets are read by
the driver, without a Spark job: 20 records in 0.15 s instead of 0.95 s (3447000), and 60 tables of
10,000 records in 6.9 s instead of 29.2 s (280d083; docs/architecture.md#the-read-and-write-paths).
Above it the executors' cores and memory win. On a local master the driver reads every such
micro-batch (:func:`read_by_driver`)."""

log = logging.getLogger(__name__)


def read_batch(lake: Lake, spec: TableSpec, plan: WritePlan, commit_id: str, table) -> ReadBatch:
    """Read, evolve the schema if declared, classify and count the planned records. ``table``: the
    pyiceberg ``Table`` the attempt's branch commit returned (its columns; the arrow writer's files).

    JSON tables whose columns pyarrow can parse (:func:`kafka_iceberg.formats.arrow_json.supported`),
    without schema evolution, upserts or a ``key_format``, are parsed and written in the read task
    (:func:`_read_parsed`); the others with Spark's ``from_json`` or the registry decoders. The
    classification is the same.
    The returned ``classified`` frame is persisted; the caller unpersists it.

    Raises:
        MalformedRecordError: a bad record under ``bad_records.policy: fail``.
        LakeError: a record outside its planned range (a reader bug).
        DataLossError, ReadTimeoutError (wrapped in a Spark error; see ``errors.from_task_exception``).
    """
    if arrow_parsed(spec):
        columns = tuple(arrow_columns(lake, plan.target.identifier, table))
        if arrow_json.supported(columns):
            return _read_parsed(lake, spec, plan, columns, table)
    records = raw = raw_records(lake, spec.identifier, plan.offsets).persist()
    classified = keyed = None
    try:
        if spec.key_format is not None:  # the key first: docs/tables.md#parsed-keys
            keyed = raw = parse_keys(lake, spec, records).persist()
        schema_ids = {}
        if spec.format.uses_registry:
            classified, changes, schema_ids = classify_registry(lake, spec, raw, commit_id)
            columns = tuple(table_value_columns(lake, plan.target.identifier))
        else:
            changes = evolve_schema(lake, spec, raw, commit_id) if spec.unknown_fields == "evolve" else ()
            columns = tuple(table_value_columns(lake, plan.target.identifier))
            classified = _classify(raw, spec, list(columns))
        if keyed is not None:
            classified = with_key_problem(classified)
        classified = classified.persist()
        return _counted(spec, plan, classified, columns, tuple(changes), schema_ids)
    except BaseException:
        if classified is not None:
            classified.unpersist()
        raise
    finally:
        records.unpersist()
        if keyed is not None:
            keyed.unpersist()


def _read_parsed(lake: Lake, spec: TableSpec, plan: WritePlan, columns: tuple, table) -> ReadBatch:
    """The pyarrow path: one Spark job (a ``noop`` write) reads, parses and caches the records;
    the read tasks report per-piece statistics through an accumulator. Only when some record was
    not parsed good by pyarrow does a second job over the cache count the bad ones per partition.
    The tasks write the records pyarrow claimed as data files (:mod:`kafka_iceberg.batch.files`) and
    only the others are cached. The driver reads the batch instead (:func:`read_by_driver`,
    :func:`_read_in_driver`) unless a record is left unclaimed."""
    parser = arrow_parser(spec, columns)
    if read_by_driver(lake.settings, plan.offsets.offsets_planned):
        in_driver = _read_in_driver(lake, spec, plan, columns, parser, file_writer(table, spec, columns))
        if in_driver is not None:
            return in_driver
    rows, one_task = _task_input(lake, plan.offsets)
    classified, stats, writer, written = parsed_records(lake, spec, columns, table, parser, rows, one_task)
    classified = classified.persist()
    try:
        classified.write.format("noop").mode("overwrite").save()
        pieces = list(stats.value.values())
        files = tuple(f for task_files in written.value.values() for f in task_files)
        left = sum(p.records - p.arrow_good for p in pieces)
        return _with_leftovers(spec, plan, classified, columns, piece_totals(pieces), files, left)
    except BaseException as exc:
        classified.unpersist()
        if isinstance(exc, Exception):  # a crash leaves them to recovery
            discard(writer.io(), [f for task_files in written.value.values() for f in task_files])
        raise


def _read_in_driver(lake: Lake, spec: TableSpec, plan: WritePlan, columns: tuple, parser, writer) -> ReadBatch | None:
    """A micro-batch read by the driver (:func:`read_by_driver`), without a Spark job (about 0.5 s less
    on a warm session): one thread consumes while one per local core parses and writes
    (:func:`kafka_iceberg.batch.driver_read.read_and_write`), or the calling thread does it all for a small
    batch (:meth:`~kafka_iceberg.batch.planning.BatchPlan.one_read_task`), which then writes one data file
    per table partition as its one Spark task would.
    When pyarrow claims every record as good, returns the batch with its data files and an empty
    ``classified`` frame; otherwise deletes the files it wrote and returns None, and the Spark job
    reads the batch again and classifies the rest.

    Raises:
        DataLossError, ReadTimeoutError, BrokerUnavailableError: as the read task would.
    """
    ranges = [(r.topic, r.partition, r.start, r.end) for r in plan.offsets.ranges]
    source = Source(
        dict(lake.kafka.config.client_conf()), spec.identifier, lake.settings.read_timeout_s, lake.kafka.readers
    )
    one_task = plan.offsets.one_read_task(lake.settings.max_records_per_task)
    done = read_and_write(source, ranges, parser, writer, 1 if one_task else local_cores(lake.settings.spark_master))
    if done.leftovers:
        discard(writer.io(), done.files)
        return None
    empty = _empty_frame(lake.spark, f"{RAW_SCHEMA_DDL}, {arrow_json.j_ddl(parser.columns)}")
    return _with_leftovers(spec, plan, empty, columns, piece_totals(done.stats), done.files, 0)


@functools.lru_cache(maxsize=256)
def _empty_frame(spark, ddl: str):
    """An empty DataFrame of schema ``ddl`` (Spark DDL), made once per session and schema (35 ms each)."""
    return spark.createDataFrame([], ddl)


def _with_leftovers(
    spec: TableSpec, plan: WritePlan, leftovers, columns: tuple, totals, files: tuple, left: int
) -> ReadBatch:
    """The read batch when the tasks wrote ``files``: ``totals`` count every record, and the
    cached ``leftovers`` (the ``left`` records pyarrow did not claim, classified by Spark) give
    the bad ones."""
    kinds = {}
    if left:
        bad = {s.partition: s.quarantined for s in partition_stats(leftovers)}
        totals = tuple(dataclasses.replace(t, quarantined=bad.get(t.partition, 0)) for t in totals)
        kinds = quarantine_kinds(leftovers) if any(bad.values()) else {}
        if kinds and spec.bad_records.policy == "fail":
            raise first_bad_record(spec, leftovers)
    check_read(plan.offsets, totals)
    return ReadBatch(leftovers, columns, totals, kinds, (), {}, data_files=files)


def _counted(spec: TableSpec, plan: WritePlan, classified, columns: tuple, changes: tuple, schema_ids) -> ReadBatch:
    """The read batch of ``classified`` with its statistics, checked against the plan."""
    stats = partition_stats(classified)
    check_read(plan.offsets, stats)
    kinds = quarantine_kinds(classified) if any(s.quarantined for s in stats) else {}
    if kinds and spec.bad_records.policy == "fail":
        raise first_bad_record(spec, classified)
    return ReadBatch(classified, columns, stats, kinds, changes, schema_ids)


def _classify(raw, spec: TableSpec, columns: list):
    """Append tables: :func:`~kafka_iceberg.formats.transform.classify`. Upsert tables: the records as
    change events (:func:`kafka_iceberg.cdc.changes.parse_changes`), with the same ``_problem`` column."""
    if spec.upsert is None:
        return classify(raw, spec, columns)
    return parse_changes(
        raw, columns, list(spec.upsert.key), spec.upsert.cdc, reject_unknown=spec.unknown_fields != "ignore"
    )


def raw_records(
    lake: Lake,
    table: str,
    offsets: BatchPlan,
    parser: arrow_json.Parser | None = None,
    stats=None,
    writer=None,
    written=None,
):
    """The planned ranges as a Spark DataFrame of :data:`~kafka_iceberg.kafka.records.RAW_SCHEMA_DDL` (plus
    ``j`` and ``_arrow`` with a ``parser``), one task per range piece of at most ``max_records_per_task``
    offsets (one Spark partition per piece, without a shuffle; one partition for all of a small batch,
    :meth:`~kafka_iceberg.batch.planning.BatchPlan.one_read_task`). ``stats``, ``writer``, ``written``: see
    :func:`~kafka_iceberg.kafka.reader.make_task_reader`."""
    rows, one_task = _task_input(lake, offsets)
    return _records_frame(lake, table, rows, one_task, parser, stats, writer, written)


def _task_input(lake: Lake, offsets: BatchPlan) -> tuple[list, bool]:
    """The read tasks' input rows (topic, partition, start, end: one per range piece) and whether one task
    reads them all (:meth:`~kafka_iceberg.batch.planning.BatchPlan.one_read_task`)."""
    return _range_pieces(lake, offsets), offsets.one_read_task(lake.settings.max_records_per_task)


def read_by_driver(settings: Settings, offsets: int) -> bool:
    """Whether a micro-batch of a pyarrow-parsed table with ``offsets`` planned offsets is read by the driver
    rather than by a Spark job: on a local master (``SPARK_MASTER`` ``local``, ``local[N]``), always, since
    the read tasks would share the driver's cores and the job only adds its own cost (one thread of the
    driver against the job's 4 tasks on 2 cores, under load: 1.7-3.4x the records/s for 200,000 records,
    1.13x for 1,000,000; docs/architecture.md#the-read-and-write-paths); elsewhere, at most
    :data:`DRIVER_READ_MAX_RECORDS` offsets."""
    return offsets <= DRIVER_READ_MAX_RECORDS or settings.spark_master.split("[")[0] == "local"


def local_cores(master: str) -> int:
    """The cores of a local Spark master: N of ``local[N]``, the machine's for ``local[*]``, 1 for ``local``
    and any other master."""
    m = re.fullmatch(r"local\[(\d+|\*)\]", master.strip())
    if m is None:
        return 1
    return (os.cpu_count() or 1) if m[1] == "*" else max(1, int(m[1]))


def arrow_parser(spec: TableSpec, columns: tuple) -> arrow_json.Parser:
    """The read task's pyarrow parser of ``spec``'s records for the table's value ``columns``."""
    return arrow_json.Parser(columns, spec.bad_records.max_record_bytes, spec.unknown_fields == "reject")


def parsed_records(lake: Lake, spec: TableSpec, columns: tuple, table, parser, rows: list, one_task: bool) -> tuple:
    """The pyarrow path's read job over ``rows`` (topic, partition, start, end; see :func:`raw_records`),
    classified (:func:`~kafka_iceberg.formats.transform.classify_parsed`), neither persisted nor run.
    Returns (frame, the ``stats`` accumulator, the ``FileWriter``, the ``written`` accumulator): the tasks
    write what pyarrow claimed through ``table``'s writer."""
    stats, written = stats_accumulator(lake.spark), stats_accumulator(lake.spark)
    writer = file_writer(table, spec, columns)
    read = _records_frame(lake, spec.identifier, rows, one_task, parser, stats, writer, written)
    return classify_parsed(read, spec, list(columns)), stats, writer, written


def _records_frame(lake: Lake, table: str, rows: list, one_task: bool, parser, stats, writer, written):
    """:func:`raw_records` over the read task's input ``rows``."""
    ranges = lake.spark.sparkContext.parallelize(rows, 1 if one_task else max(1, len(rows)))
    ranges_df = lake.spark.createDataFrame(ranges, RANGE_DDL)
    reader = _task_reader(lake, table, parser, stats, writer, written)
    ddl = RAW_SCHEMA_DDL if parser is None else f"{RAW_SCHEMA_DDL}, {arrow_json.j_ddl(parser.columns)}"
    return ranges_df.mapInArrow(reader, ddl)


def _range_pieces(lake: Lake, offsets: BatchPlan) -> list[tuple[str, int, int, int]]:
    """The read task's input rows (topic, partition, start, end): the planned ranges cut into pieces of
    at most ``LAKE_MAX_RECORDS_PER_TASK`` offsets."""
    return [
        (r.topic, r.partition, r.start, r.end) for r in split_ranges(offsets.ranges, lake.settings.max_records_per_task)
    ]


def _task_reader(lake: Lake, table: str, parser, stats, writer, written):
    """:func:`make_task_reader` with this lake's Kafka client configuration and read timeout."""
    return make_task_reader(
        lake.kafka.config.client_conf(), table, lake.settings.read_timeout_s, parser, stats, writer, written
    )


def arrow_parsed(spec: TableSpec) -> bool:
    """Whether ``spec``'s records may be parsed by pyarrow in the read task (if its columns allow,
    :func:`kafka_iceberg.formats.arrow_json.supported`): JSON without schema evolution, upserts or a
    ``key_format``."""
    return (
        spec.upsert is None
        and spec.unknown_fields != "evolve"
        and not spec.format.uses_registry
        and spec.key_format is None
    )


def arrow_columns(lake: Lake, identifier: str, table):
    """The value columns of ``table`` (a pyiceberg ``Table``), else from Spark's catalog
    (:func:`kafka_iceberg.batch.evolve.table_value_columns`): a Spark table lookup would make Iceberg
    re-read the metadata the branch commit just wrote."""
    columns = iceberg_value_columns(table.schema()) if table is not None else None
    return columns if columns is not None else table_value_columns(lake, identifier)
