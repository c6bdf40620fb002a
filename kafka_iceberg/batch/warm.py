"""Warming the read phase's Spark job before a worker's first large micro-batch.

On a cluster master, a micro-batch of more than :data:`~kafka_iceberg.batch.read.DRIVER_READ_MAX_RECORDS`
offsets is read by a Spark job (:func:`kafka_iceberg.batch.read.read_batch`), as is one whose records
pyarrow leaves unclaimed. The first such job of a process pays, on the driver,
for what the JVM has not done yet: loading the classes of ``mapInArrow``, the cache and the ``noop``
write, parsing the schemas, and compiling the hot paths. On a 2-core machine that JVM work competes
with the read tasks: a fresh process read its first 1,000,000-record micro-batch in 9.4-10.4 s and the
next one in 4.9-5.9 s (docs/benchmark.md). Small micro-batches, read by the driver, never start that
job, so a worker that starts on a large backlog paid this cost in its first micro-batch.

:func:`warm_read_job` runs that Spark job once, over one empty offset range of a table's own
topic: the same reader, parser, file writer and classification, no record read and no file written.
A worker's ``warm`` op runs it (:func:`warm_for_backlog`) only when a table's next micro-batch will
start that job: a successor warming beside a current predecessor does not spend the CPU.
"""

from __future__ import annotations

import logging
import time

from kafka_iceberg.batch.context import Lake
from kafka_iceberg.batch.read import arrow_columns, arrow_parsed, arrow_parser, parsed_records, read_by_driver
from kafka_iceberg.batch.worker import offset_lags
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.formats import arrow_json
from kafka_iceberg.state import state_at

log = logging.getLogger(__name__)


def warm_for_backlog(lake: Lake, specs: list[TableSpec], views: dict) -> str | None:
    """:func:`warm_read_job` for the first of ``specs`` (existing tables; ``views``: identifier -> the
    ``TableMetadataView`` of the loaded table) whose next micro-batch starts the job (its offset lag, one
    batched watermark call, is above :data:`~kafka_iceberg.batch.read.DRIVER_READ_MAX_RECORDS` on a
    cluster master; :func:`~kafka_iceberg.batch.read.read_by_driver`), and that the job reads.
    Returns that table's identifier, or None when no job ran. Nothing is raised: a failure is logged
    (a warm-up; the micro-batches report their own errors)."""
    try:
        lags = offset_lags(
            specs,
            lake.kafka.watermarks_many(sorted({s.topic for s in specs})),
            {i: state_at(v.snapshots, v.main).offsets for i, v in views.items()},
        )
        for spec in specs:
            lag = lags[spec.identifier]
            if lag > 0 and not read_by_driver(lake.settings, lag):
                if warm_read_job(lake, spec, views[spec.identifier].table) is not None:
                    return spec.identifier
    except Exception as exc:  # noqa: BLE001 - see the docstring
        log.warning("the read job was not warmed: %s: %s", type(exc).__name__, exc)
    return None


def warm_read_job(lake: Lake, spec: TableSpec, table=None) -> float | None:
    """Run the read phase's Spark job of ``spec``'s table once over the empty range
    [0, 0) of its topic's partition 0 (nothing is read from Kafka, nothing written to the table).
    ``spec``'s table must exist; ``table``: its loaded pyiceberg ``Table`` (default: loaded here).

    Returns the job's seconds, or None when the table's micro-batches never start this job (a
    table not parsed by pyarrow in the read task: registry formats, upserts, ``unknown_fields:
    evolve``, a ``key_format``).

    Raises:
        CatalogUnavailableError: the catalog did not answer within ``catalog_retry_s`` (60 s; ``LAKE_DEV_HOOKS``).
        Py4JJavaError (Spark's own): the job failed; the caller decides whether that matters.
    """
    if not arrow_parsed(spec):
        return None
    table = table if table is not None else lake.load(spec.identifier)
    columns = tuple(arrow_columns(lake, spec.identifier, table))
    if not arrow_json.supported(columns):
        return None
    t0 = time.perf_counter()
    rows = [(spec.topic, 0, 0, 0)]
    classified = parsed_records(lake, spec, columns, table, arrow_parser(spec, columns), rows, True)[0].persist()
    try:
        classified.write.format("noop").mode("overwrite").save()
    finally:
        classified.unpersist()
    seconds = time.perf_counter() - t0
    log.info("table %s: read job warmed in %.2f s", spec.identifier, seconds)
    return seconds
