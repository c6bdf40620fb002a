"""``duplicate_free`` over the snapshots one commit id (one run) added, instead of the whole table.

The full check (:func:`kafka_iceberg.ops.checks.duplicate_free`) aggregates every row of the table,
so its cost grows with the table. After a run, only what the run added needs reading:

1. no two snapshots in ``main``'s ancestry cover overlapping ``kafka.batch`` offset ranges
   (snapshot summaries only: cost grows with the snapshot count, not the rows);
2. every row appended since the run's first snapshot's parent (an Iceberg incremental append
   read, ``start-snapshot-id`` exclusive to ``main`` inclusive, by pyiceberg in the calling process: no
   Spark job, about 2 ms per snapshot of small data files on local disk) lies inside the ``kafka.batch``
   ranges of those snapshots, and no ``(partition, offset)`` appears twice among them.

Given 1, and that earlier rows lie inside earlier snapshots' ranges (what earlier checks
verified), 2 means no row the run added repeats any row of the table. What this cannot see
(rows of a run that crashed before its check, a table rewritten outside the write path) the
full scan finds: run the check on its own (no commit by the run), e.g. from a schedule.
"""

from __future__ import annotations

import numpy as np
from pyiceberg.table import Table

from kafka_iceberg.catalog.tables import TableMetadataView
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.state import KEY_COMMIT_ID, SnapshotInfo, ancestors, batch_ranges, overlapping_batches


def run_snapshots(view: TableMetadataView, commit_id: str, after: int | None = None) -> list[SnapshotInfo]:
    """The snapshots in ``main``'s ancestry since the oldest one committed by ``commit_id``, and after
    snapshot ``after`` when it is in that ancestry (oldest first; empty if there are none)."""
    history = list(reversed(ancestors(view.snapshots, view.main)))  # oldest first
    first = next((i for i, s in enumerate(history) if s.summary.get(KEY_COMMIT_ID) == commit_id), None)
    if first is None:
        return []
    scope = history[first:]
    done = next((i for i, s in enumerate(scope) if s.snapshot_id == after), None)
    return scope if done is None else scope[done + 1 :]


def snapshots_to_keep(view: TableMetadataView, commit_id: str, after: int | None = None) -> int:
    """How many of ``main``'s newest snapshots an incremental check of ``commit_id`` after snapshot
    ``after`` reads from: its snapshots (:func:`run_snapshots`) and the parent its read starts after
    (0 when it has none). Snapshot expiry that keeps them leaves the check incremental."""
    scope = run_snapshots(view, commit_id, after)
    if not scope:
        return 0
    newest_first = [s.snapshot_id for s in ancestors(view.snapshots, view.main)]
    return newest_first.index(scope[0].snapshot_id) + 2


def merged_ranges(snapshots: list[SnapshotInfo]) -> dict[int, list[tuple[int, int]]]:
    """The union of the snapshots' ``kafka.batch`` ranges per partition, as sorted disjoint
    half-open ``(start, end)`` offset ranges."""
    by_partition: dict[int, list[tuple[int, int]]] = {}
    for snap in snapshots:
        for p, (start, end) in batch_ranges(snap).items():
            if end > start:
                by_partition.setdefault(p, []).append((start, end))
    out: dict[int, list[tuple[int, int]]] = {}
    for p, ranges in by_partition.items():
        merged: list[tuple[int, int]] = []
        for start, end in sorted(ranges):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        out[p] = merged
    return out


def rows_outside(partitions: np.ndarray, offsets: np.ndarray, ranges: dict[int, list[tuple[int, int]]]) -> int:
    """How many of the rows (``partitions[i]``, ``offsets[i]``; int arrays of one length) lie in none of
    ``ranges`` (:func:`merged_ranges`: per partition, sorted disjoint half-open offset ranges)."""
    outside = 0
    for p in np.unique(partitions):
        offs = offsets[partitions == p]
        spans = ranges.get(int(p), [])
        if not spans:
            outside += len(offs)
            continue
        starts = np.array([s for s, _ in spans], dtype=np.int64)
        ends = np.array([e for _, e in spans], dtype=np.int64)
        at = np.searchsorted(starts, offs, side="right") - 1  # the range starting at or before each offset
        inside = (at >= 0) & (offs < ends[np.maximum(at, 0)])
        outside += int(len(offs) - inside.sum())
    return outside


def duplicate_free_since(
    table: Table, spec: TableSpec, view: TableMetadataView, commit_id: str, after: int | None = None
) -> dict | None:
    """The figures of the incremental check for the snapshots since ``commit_id``'s first one (after
    snapshot ``after``, the last one an earlier check of this commit id covered; see the module
    docstring), or None when it does not apply: ``commit_id`` committed nothing (since ``after``), its
    first snapshot has no parent (then the full check reads no more than this would), or that parent
    was expired (the rows of the expired snapshots can only be verified by the full check).

    ``table``: the pyiceberg table ``view`` was read from. Reads the data files its append snapshots
    added, two columns of them, in this process (pyiceberg's ``incremental_append_scan``, the
    ``start-snapshot-id`` read of Spark; no Spark job); raises what its file IO raises.

    Figures: ``snapshots_examined`` (summaries), ``snapshots_scanned`` and ``rows_scanned`` (the
    incremental read), ``overlapping_snapshot_pairs``, ``duplicate_offsets`` (extra copies among
    the scanned rows), ``rows_outside_batch_ranges``."""
    scope = run_snapshots(view, commit_id, after)
    if not scope or scope[0].parent_id is None or scope[0].parent_id not in view.snapshots:
        return None
    history = ancestors(view.snapshots, view.main)
    overlaps = overlapping_batches(history)
    part, off = spec.kafka_column("partition"), spec.kafka_column("offset")
    rows = table.incremental_append_scan(
        from_snapshot_id_exclusive=scope[0].parent_id, to_snapshot_id_inclusive=view.main, selected_fields=(part, off)
    ).to_arrow()
    partitions = rows.column(part).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = rows.column(off).to_numpy(zero_copy_only=False).astype(np.int64)
    distinct = len(np.unique(np.stack([partitions, offsets], axis=1), axis=0)) if len(offsets) else 0
    return {
        "snapshots_examined": len(history),
        "snapshots_scanned": len(scope),
        "rows_scanned": len(offsets),
        "overlapping_snapshot_pairs": len(overlaps),
        "duplicate_offsets": len(offsets) - distinct,
        "rows_outside_batch_ranges": rows_outside(partitions, offsets, merged_ranges(scope)),
        "overlaps": overlaps,
    }


def overlap_examples(overlaps: list, sample: int) -> list[dict]:
    """Up to ``sample`` overlapping offset ranges of two snapshots, for a check's metadata."""
    return [
        {
            "partition": o.partition,
            "snapshot": o.first[0],
            "range": list(o.first[1]),
            "other_snapshot": o.second[0],
            "other_range": list(o.second[1]),
        }
        for o in overlaps[:sample]
    ]


def outcome_figures(figures: dict, sample: int = 10) -> tuple[bool, str, dict]:
    """(passed, summary, figures for the UI) of :func:`duplicate_free_since`'s figures."""
    overlaps = figures.pop("overlaps")
    figures["overlap_examples"] = overlap_examples(overlaps, sample)
    figures["scope"] = "incremental"
    problems = [
        f"{figures[k]} {what}"
        for k, what in (
            ("overlapping_snapshot_pairs", "overlapping snapshot offset ranges"),
            ("duplicate_offsets", "duplicate (partition, offset) records among the new rows"),
            ("rows_outside_batch_ranges", "new rows outside their snapshots' offset ranges"),
        )
        if figures[k]
    ]
    if problems:
        return False, "duplicates: " + "; ".join(problems), figures
    return (
        True,
        (
            f"no duplicates: {figures['rows_scanned']} new rows of {figures['snapshots_scanned']} snapshots scanned, "
            f"{figures['snapshots_examined']} snapshot summaries"
        ),
        figures,
    )


__all__ = [
    "duplicate_free_since",
    "merged_ranges",
    "outcome_figures",
    "overlap_examples",
    "rows_outside",
    "run_snapshots",
    "snapshots_to_keep",
]
