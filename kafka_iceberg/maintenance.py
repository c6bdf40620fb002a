"""Table maintenance through Iceberg's Spark procedures. Plain Python, no Dagster.

* :func:`compact` runs ``rewrite_data_files``: micro-batches leave many small data files.
* :func:`expire` runs ``expire_snapshots``. The ingest state needs only the newest ingest
  snapshot of ``main`` (each one carries every partition's offsets; see
  :mod:`kafka_iceberg.state`); a compaction's ``replace`` snapshot does not carry them, so
  ``retain_last`` is raised as far as needed to keep that ingest snapshot. What expiry does
  remove is history: the duplicate-free check compares offset ranges across the snapshots
  that are left, so ``retain_last`` bounds how far back it can look.
* :func:`remove_orphans` runs ``remove_orphan_files`` with a safety window (``older_than``)
  that must exceed the longest micro-batch, so no in-flight write loses a file. The
  procedure itself refuses windows under 24 hours.

Each returns a :class:`MaintenanceResult` with the table's live data files and bytes before
and after, read from the ``files`` metadata table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kafka_iceberg.catalog import TableMetadataView
from kafka_iceberg.state import ancestors


@dataclass
class MaintenanceResult:
    """Live data files (count) and bytes of the current snapshot before and after, the
    procedure's own output row, and the seconds it took."""

    procedure: str
    files_before: int
    files_after: int
    bytes_before: int
    bytes_after: int
    output: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def live_files(spark, qualified_table: str) -> tuple[int, int]:
    """(data files, bytes) referenced by the table's current snapshot."""
    row = spark.sql(
        f"SELECT count(*) AS n, coalesce(sum(file_size_in_bytes), 0) AS b FROM {qualified_table}.files"
    ).collect()[0]
    return int(row["n"]), int(row["b"])


def _timestamp(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _run(spark, catalog: str, identifier: str, procedure: str, args: str) -> MaintenanceResult:
    qualified_table = f"{catalog}.{identifier}"
    t0 = time.perf_counter()
    files_before, bytes_before = live_files(spark, qualified_table)
    rows = spark.sql(f"CALL {catalog}.system.{procedure}(table => '{identifier}'{args})").collect()
    files_after, bytes_after = live_files(spark, qualified_table)
    if procedure == "remove_orphan_files":  # one row per deleted file
        output = {"orphan_files_deleted": len(rows)}
    else:
        output = rows[0].asDict() if rows else {}
    return MaintenanceResult(procedure, files_before, files_after, bytes_before, bytes_after,
                             {k: (int(v) if isinstance(v, (int, float)) else str(v)) for k, v in output.items()},
                             round(time.perf_counter() - t0, 3))


def compact(spark, catalog: str, identifier: str, target_file_size_bytes: int = 128 * 1024 * 1024,
            min_input_files: int = 5) -> MaintenanceResult:
    """Bin-pack small data files with ``rewrite_data_files`` (a ``replace`` snapshot; the
    ingest state is read through it from the newest ingest ancestor)."""
    options = (f", options => map('target-file-size-bytes', '{int(target_file_size_bytes)}', "
               f"'min-input-files', '{int(min_input_files)}')")
    return _run(spark, catalog, identifier, "rewrite_data_files", options)


INGEST_STATE_MARGIN = 1
"""Extra snapshots kept beyond the newest ingest snapshot, for a commit that lands between
counting and expiring. Maintenance jobs share the table's concurrency pool with its
micro-batches, so at most one such commit is expected."""


def snapshots_to_keep_state(view: TableMetadataView) -> int:
    """How many of ``main``'s newest snapshots must be retained so that the newest ingest
    snapshot (the one holding the committed offsets) survives, plus a margin."""
    for depth, snap in enumerate(ancestors(view.snapshots, view.main), start=1):
        if snap.is_ingest:
            return depth + INGEST_STATE_MARGIN
    return 1


def expire(spark, catalog: str, identifier: str, max_snapshot_age_s: float, retain_last: int,
           view: TableMetadataView | None = None) -> MaintenanceResult:
    """Expire snapshots older than ``max_snapshot_age_s`` seconds, keeping at least the last
    ``retain_last`` (>= 1) of each branch and never the newest ingest snapshot of ``main``
    (``retain_last`` is raised to :func:`snapshots_to_keep_state` of ``view``, the table's
    current metadata); deletes the files only the expired snapshots referenced."""
    if retain_last < 1:
        raise ValueError("retain_last must be at least 1")
    if view is not None:
        retain_last = max(retain_last, snapshots_to_keep_state(view))
    older_than = _timestamp(time.time() * 1000 - max_snapshot_age_s * 1000)
    result = _run(spark, catalog, identifier, "expire_snapshots",
                  f", older_than => TIMESTAMP '{older_than}', retain_last => {int(retain_last)}")
    result.output["retain_last"] = int(retain_last)
    return result


def remove_orphans(spark, catalog: str, identifier: str, older_than_s: float) -> MaintenanceResult:
    """Delete files no snapshot references that are older than ``older_than_s`` seconds
    (the safety window; at least 24 h, which the procedure enforces)."""
    older_than = _timestamp(time.time() * 1000 - older_than_s * 1000)
    return _run(spark, catalog, identifier, "remove_orphan_files", f", older_than => TIMESTAMP '{older_than}'")
