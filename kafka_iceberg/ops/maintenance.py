"""Table maintenance through Iceberg's Spark procedures and, for expiry, its Java table API. Plain Python, no Dagster.

* :func:`compact` runs ``rewrite_data_files``: micro-batches leave many small data files. On
  upsert tables (``mode: upsert``) every MERGE also leaves position delete files, which every
  reader must merge: compaction rewrites a data file together with its deletes once it has
  ``delete_file_threshold`` (1) delete files or 30% of its rows deleted, drops delete files that no
  longer point at a live data file (``remove-dangling-deletes``), and, when delete files are
  left, runs ``rewrite_position_delete_files`` to combine them (one per partition and group).
  All of these commit ``replace`` snapshots without ``kafka.*`` keys: the ingest state is read
  through them from the newest ingest ancestor, as for any compaction.
* :func:`expire` runs Iceberg's Java ``ExpireSnapshots`` (no Spark job). The ingest state needs
  only the newest ingest snapshot of ``main`` (each one carries every partition's offsets; see
  :mod:`kafka_iceberg.state`); a compaction's ``replace`` snapshot does not carry them, so
  ``retain_last`` is raised as far as needed to keep that ingest snapshot. A table past its
  ``max_snapshots`` ceiling (a streaming table commits up to a few times a second) is cut back to
  ``retain_last`` by count, whatever the snapshots' age. What expiry does
  remove is history: the duplicate-free check compares offset ranges across the snapshots
  that are left, so ``retain_last`` bounds how far back it can look.
* :func:`remove_orphans` runs ``remove_orphan_files`` with a safety window (``older_than``)
  that must exceed the longest micro-batch, so no in-flight write loses a file. The
  procedure itself refuses windows under 24 hours.

Each returns a :class:`MaintenanceResult` with the table's live data files, bytes and delete
files before and after, read from the current snapshot's summary.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kafka_iceberg.catalog.spark import java_table
from kafka_iceberg.catalog.tables import TableMetadataView
from kafka_iceberg.state import ancestors


@dataclass
class MaintenanceResult:
    """The current snapshot's live data files (count), bytes of its live data and delete files, and live
    delete files (count), before and after, from its snapshot summary (``total-data-files``,
    ``total-files-size``, ``total-delete-files``); the job's own output; the seconds it took."""

    procedure: str
    files_before: int
    files_after: int
    bytes_before: int
    bytes_after: int
    output: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    delete_files_before: int = 0
    delete_files_after: int = 0

    def as_metadata(self) -> dict[str, Any]:
        """Observation metadata (plain values; Dagster shows the dict as JSON): live data files,
        bytes and delete files before and after, seconds, the procedure and its output."""
        return {
            "procedure": self.procedure,
            "data_files_before": self.files_before,
            "data_files_after": self.files_after,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "delete_files_before": self.delete_files_before,
            "delete_files_after": self.delete_files_after,
            "seconds": float(self.seconds),
            "procedure_output": dict(self.output),
        }


def _timestamp(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _run(spark, catalog: str, identifier: str, procedure: str, args: str) -> MaintenanceResult:
    def call(_table) -> dict[str, Any]:
        rows = spark.sql(f"CALL {catalog}.system.{procedure}(table => '{identifier}'{args})").collect()
        if procedure == "remove_orphan_files":  # one row per deleted file
            return {"orphan_files_deleted": len(rows)}
        return rows[0].asDict() if rows else {}

    return _measured(spark, catalog, identifier, procedure, call)


def _measured(spark, catalog: str, identifier: str, procedure: str, job) -> MaintenanceResult:
    """Run ``job`` (a function of the table's Java ``Table`` returning its output dict) between two reads of
    the table's summary totals (:func:`_summary_totals`); its output's numbers become ints, the rest strings."""
    table = java_table(spark, f"{catalog}.{identifier}")
    t0 = time.perf_counter()
    table.refresh()
    before = _summary_totals(table)
    output = job(table)
    table.refresh()
    after = _summary_totals(table)
    output = {k: (int(v) if isinstance(v, (int, float)) else str(v)) for k, v in output.items()}
    files, size, deletes = zip(before, after)
    return MaintenanceResult(procedure, *files, *size, output, round(time.perf_counter() - t0, 3), *deletes)


def _summary_totals(table) -> tuple[int, int, int]:
    """(live data files, live bytes, live delete files) of a Java ``Table``: its current snapshot's summary
    totals (0 where the table has no snapshot or no totals)."""
    current = table.currentSnapshot()
    summary = current.summary() if current is not None else {}

    def total(key: str) -> int:
        value = summary.get(key)
        return int(value) if value is not None else 0

    return total("total-data-files"), total("total-files-size"), total("total-delete-files")


def _options(**options) -> str:
    pairs = ", ".join(f"'{k.replace('_', '-')}', '{v}'" for k, v in options.items())
    return f", options => map({pairs})"


DELETE_FILE_THRESHOLD = 1
"""A data file with this many delete files (or with 30% of its rows deleted, Iceberg's
``delete-ratio-threshold``) is rewritten by compaction with its deletes applied, however big it is.
Iceberg 1.10 writes file-scoped position deletes (``write.delete.granularity=file``): each delete file
points at one data file, so only rewriting the data file removes it; 1 leaves no delete file behind."""
DELETE_MIN_INPUT_FILES = 2
"""``rewrite_position_delete_files`` combines a partition's delete files once it has this many."""


def compact(
    spark,
    catalog: str,
    identifier: str,
    target_file_size_bytes: int = 128 * 1024 * 1024,
    min_input_files: int = 5,
    delete_file_threshold: int = DELETE_FILE_THRESHOLD,
) -> MaintenanceResult:
    """Bin-pack small data files with ``rewrite_data_files``; also rewrite data files with at least
    ``delete_file_threshold`` delete files (applying the deletes) and drop dangling delete files.
    When delete files are left, combine them with ``rewrite_position_delete_files`` (the result's
    ``output`` then has its figures prefixed ``deletes_``, and ``delete_files_after`` is after both),
    unless the table has a list or map column (:func:`has_collection_columns`; ``output`` then says so).
    Each procedure commits a ``replace`` snapshot; the ingest state is read through them from the
    newest ingest ancestor. Errors are Spark's (``AnalysisException``, ``Py4JJavaError``)."""
    options = _options(
        target_file_size_bytes=int(target_file_size_bytes),
        min_input_files=int(min_input_files),
        delete_file_threshold=int(delete_file_threshold),
        remove_dangling_deletes="true",
    )
    result = _run(spark, catalog, identifier, "rewrite_data_files", options)
    if result.delete_files_after == 0:
        return result
    if has_collection_columns(spark.table(f"{catalog}.{identifier}").schema):
        result.output["deletes_not_combined"] = (
            "a list or map column (Iceberg 1.10 rewrite_position_delete_files fails on it)"
        )
        return result
    deletes = rewrite_deletes(spark, catalog, identifier)
    result.procedure += "+rewrite_position_delete_files"
    result.output.update({f"deletes_{k}": v for k, v in deletes.output.items()})
    result.delete_files_after = deletes.delete_files_after
    result.seconds = round(result.seconds + deletes.seconds, 3)
    return result


def has_collection_columns(schema) -> bool:
    """True when a Spark ``StructType`` has a list or map at any depth (e.g. ``_kafka_headers``).
    Iceberg 1.10.2's ``position_deletes`` reader, which ``rewrite_position_delete_files`` uses, fails
    on such tables (``ValidationException: Invalid partition field parent: list<...>``)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    def nested(t) -> bool:
        if isinstance(t, (ArrayType, MapType)):
            return True
        return isinstance(t, StructType) and any(nested(f.dataType) for f in t.fields)

    return nested(schema)


def rewrite_deletes(
    spark, catalog: str, identifier: str, min_input_files: int = DELETE_MIN_INPUT_FILES
) -> MaintenanceResult:
    """Combine the position delete files of each partition (``rewrite_position_delete_files``) once it
    has ``min_input_files`` of them, dropping deletes whose data files are gone; a ``replace``
    snapshot. Data files are untouched. Fails (``Py4JJavaError``) on a table with a list or map
    column: see :func:`has_collection_columns`."""
    return _run(
        spark, catalog, identifier, "rewrite_position_delete_files", _options(min_input_files=int(min_input_files))
    )


INGEST_STATE_MARGIN = 1
"""Extra snapshots kept beyond the newest ingest snapshot, for a commit that lands between
counting and expiring. Maintenance jobs share the table's concurrency pool with its
micro-batches, so at most one such commit is expected."""


CONCURRENT_COMMITS = 10
"""Snapshots an expiry by count beside a table that keeps committing (a worker's background expiry, a
streaming run's) keeps beyond what it needs: the commits that land between its reading the table's
metadata and its own commit."""


def snapshots_to_keep_state(view: TableMetadataView) -> int:
    """How many of ``main``'s newest snapshots must be retained so that the newest ingest
    snapshot (the one holding the committed offsets) survives, plus a margin."""
    for depth, snap in enumerate(ancestors(view.snapshots, view.main), start=1):
        if snap.is_ingest:
            return depth + INGEST_STATE_MARGIN
    return 1


def expire(
    spark,
    catalog: str,
    identifier: str,
    max_snapshot_age_s: float,
    retain_last: int,
    view: TableMetadataView | None = None,
    max_snapshots: int | None = None,
    keep: int = 0,
) -> MaintenanceResult:
    """Expire snapshots older than ``max_snapshot_age_s`` seconds, keeping at least the last
    ``retain_last`` (>= 1) of each branch, the newest ``keep`` of ``main`` (e.g. what a pending
    incremental check reads from) and never the newest ingest snapshot of ``main`` (``retain_last``
    is raised to :func:`snapshots_to_keep_state` of ``view``, the table's current metadata); deletes
    the files only the expired snapshots referenced. A ``view`` with more than ``max_snapshots``
    snapshots (every ref's) is cut back by count: every snapshot but those kept goes, however young
    (the result's output then has ``over_max_snapshots``: the count before).

    Runs Iceberg's Java ``ExpireSnapshots`` in the driver's JVM (:func:`~kafka_iceberg.catalog.spark.java_table`),
    which reads the expired snapshots' manifests and deletes their files without a Spark job: under 1 s of
    JVM CPU where the ``expire_snapshots`` procedure and its metadata queries took 5-17 s (docs/benchmark.md).
    A data file is deleted with the expired snapshot that removed it (a compaction's ``replace``, say). The
    output counts ``expired_snapshots``.

    Raises:
        ValueError: ``retain_last`` < 1.
        Py4JJavaError: the table is missing, the catalog failed, or the commit was refused.
    """
    if retain_last < 1:
        raise ValueError("retain_last must be at least 1")
    retain_last = max(retain_last, keep)
    if view is not None:
        retain_last = max(retain_last, snapshots_to_keep_state(view))
    by_count = view is not None and max_snapshots is not None and len(view.snapshots) > max_snapshots
    older_than_ms = int(time.time() * 1000 - (0 if by_count else max_snapshot_age_s * 1000))

    def expire_snapshots(table) -> dict[str, Any]:
        update = table.expireSnapshots().expireOlderThan(older_than_ms).retainLast(int(retain_last))
        output = {"expired_snapshots": len(update.apply()), "retain_last": int(retain_last)}  # apply: what goes
        update.commit()
        if by_count:
            output["over_max_snapshots"] = len(view.snapshots)
        return output

    return _measured(spark, catalog, identifier, "expire_snapshots", expire_snapshots)


def remove_orphans(spark, catalog: str, identifier: str, older_than_s: float) -> MaintenanceResult:
    """Delete files no snapshot references that are older than ``older_than_s`` seconds
    (the safety window; at least 24 h, which the procedure enforces)."""
    older_than = _timestamp(time.time() * 1000 - older_than_s * 1000)
    return _run(spark, catalog, identifier, "remove_orphan_files", f", older_than => TIMESTAMP '{older_than}'")
