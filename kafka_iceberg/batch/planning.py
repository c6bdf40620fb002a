"""Offset planning: which offsets the next micro-batch reads. Pure functions, no I/O.

A micro-batch reads, per partition, the half-open range
``[committed, min(high, committed + bound))``, where ``committed`` comes from the table's
snapshot summary (:mod:`kafka_iceberg.state`) and ``high`` is the partition's high
watermark (the last stable offset under ``read_committed``). ``bound`` is the table's
``max_records_per_partition``; it bounds offsets, so a range with transaction markers or
compacted-away offsets holds fewer records than its width.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kafka_iceberg.errors import DataLossError, OffsetsAheadError


@dataclass(frozen=True)
class Watermarks:
    """Low (log start offset) and high watermark of one partition, in offsets."""

    low: int
    high: int


@dataclass(frozen=True)
class OffsetRange:
    """A half-open offset range ``[start, end)`` of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        """Width of the range in offsets (an upper bound on its records)."""
        return self.end - self.start


SMALL_BATCH_OFFSETS = 20_000
"""A micro-batch of at most this many offsets is read by one Spark task and appended without a
shuffle (docs/benchmark.md, "Quiet machine", change 2): a task reads 20,000 flights records in about
0.1 s, less than starting a task per partition costs."""


@dataclass(frozen=True)
class BatchPlan:
    """What one micro-batch reads and the state it will commit.

    ``base_snapshot_id`` is the ``main`` snapshot the plan was made on; the commit publishes
    only if ``main`` still points there. ``start_offsets`` and ``end_offsets`` cover every
    partition of the topic (equal where there is nothing to read). ``lag_after`` is the
    records-by-offset that will remain after this batch commits (high - end).
    """

    table: str
    topic: str
    base_snapshot_id: int | None
    start_offsets: dict[int, int]
    end_offsets: dict[int, int]
    watermarks: dict[int, Watermarks]
    has_state: bool  # False for a table that has never committed its offsets

    @property
    def ranges(self) -> list[OffsetRange]:
        """Non-empty ranges to read, by partition."""
        return [
            OffsetRange(self.topic, p, self.start_offsets[p], self.end_offsets[p])
            for p in sorted(self.start_offsets)
            if self.end_offsets[p] > self.start_offsets[p]
        ]

    @property
    def is_empty(self) -> bool:
        """True when there is nothing to read."""
        return not self.ranges

    @property
    def needs_commit(self) -> bool:
        """True when the batch changes the table's state: it has records, or it records the
        resolved starting offsets of a table that has none yet (so ``latest`` or a timestamp
        is resolved exactly once)."""
        return not self.is_empty or not self.has_state

    @property
    def offsets_planned(self) -> int:
        """Offsets to read in all (an upper bound on the records: gaps hold none)."""
        return sum(r.size for r in self.ranges)

    def one_read_task(self, max_records_per_task: int) -> bool:
        """Whether one Spark task reads the whole batch: at most :data:`SMALL_BATCH_OFFSETS` offsets and
        at most ``max_records_per_task`` (``LAKE_MAX_RECORDS_PER_TASK``). Then one consumer reads every
        partition's range, and the append needs no shuffle."""
        return self.offsets_planned <= min(SMALL_BATCH_OFFSETS, max_records_per_task)

    @property
    def lag_after(self) -> dict[int, int]:
        """Per-partition offset lag that remains once this batch is committed."""
        return {p: self.watermarks[p].high - self.end_offsets[p] for p in sorted(self.end_offsets)}


def plan_batch(
    *,
    table: str,
    topic: str,
    base_snapshot_id: int | None,
    committed: Mapping[int, int],
    watermarks: Mapping[int, Watermarks],
    initial_offsets: Mapping[int, int],
    bound: int,
    stop_at: Mapping[int, int] | None = None,
) -> BatchPlan:
    """Plan the next micro-batch: the one offset planner of ingestion, replay and backfill.

    Args:
        committed: the table's committed offsets (next offset to read) per partition.
        watermarks: low/high watermarks of every partition of the topic.
        initial_offsets: where partitions absent from ``committed`` start (resolved from the
            table's starting position for a new table, or the log start offset for a
            partition added to the topic later).
        bound: max offsets per partition in this batch (> 0).
        stop_at: per partition, an offset the plan never reads past (a replay's end); None:
            the high watermark. A partition already at its stop needs no readable start.

    Raises:
        DataLossError: a committed offset is below the partition's low watermark (and below its stop).
        OffsetsAheadError: a committed offset is above the high watermark, or a committed
            partition no longer exists (the topic was recreated or shrank).
    """
    if bound <= 0:
        raise ValueError("bound must be positive")
    missing = sorted(set(committed) - set(watermarks))
    if missing:
        raise OffsetsAheadError(
            f"table {table}: committed partitions {missing} do not exist in topic {topic} any more "
            "(was the topic recreated?)"
        )
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    for p, wm in sorted(watermarks.items()):
        s = committed[p] if p in committed else initial_offsets.get(p, wm.low)
        stop = wm.high if stop_at is None else min(wm.high, stop_at[p])
        if s < wm.low and s < stop:
            raise DataLossError(table, topic, p, s, wm.low)
        if s > wm.high:
            raise OffsetsAheadError(
                f"table {table}: committed offset {s} of topic {topic} partition {p} is above its high "
                f"watermark {wm.high} (was the topic recreated or truncated?)"
            )
        start[p] = s
        end[p] = max(s, min(stop, s + bound))
    return BatchPlan(
        table=table,
        topic=topic,
        base_snapshot_id=base_snapshot_id,
        start_offsets=start,
        end_offsets=end,
        watermarks=dict(watermarks),
        has_state=bool(committed),
    )


def offset_lag(watermarks: Mapping[int, Watermarks], committed: Mapping[int, int]) -> dict[int, int]:
    """Per-partition offset lag: high watermark minus committed offset (records by offset, >= 0).
    Partitions without a committed offset count from their log start offset."""
    return {p: max(0, wm.high - committed.get(p, wm.low)) for p, wm in sorted(watermarks.items())}


def split_ranges(ranges: list[OffsetRange], max_records_per_task: int) -> list[OffsetRange]:
    """Split ranges wider than ``max_records_per_task`` offsets into consecutive pieces.

    The pieces of a range are contiguous and together cover it exactly, so each Spark task
    reads one piece and no offset is read twice.
    """
    if max_records_per_task <= 0:
        raise ValueError("max_records_per_task must be positive")
    out = []
    for r in ranges:
        s = r.start
        while s < r.end:
            e = min(r.end, s + max_records_per_task)
            out.append(OffsetRange(r.topic, r.partition, s, e))
            s = e
    return out
