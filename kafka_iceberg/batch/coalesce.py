"""A bounded event log: a worker's commits of one table reported at most once per interval.

A streaming table commits up to a few times a second; one Dagster event per commit makes the instance's
event log grow by thousands of events per table per hour (docs/operations.md#the-dagster-event-log).
:class:`Coalescer` holds a table's commits and hands them out as one :class:`Coalesced` (the commits
merged into one ``BatchResult``: offset ranges joined, counts summed, the state of the last commit) at
most once per ``every_s`` seconds per table: a table's first commit at once, the next ones when the
interval since its last report passed, at the next commit or the next :meth:`Coalescer.due`. The second
report of a table comes after a fraction of the interval of its own (from its identifier's CRC-32), so
the reports of tables that started together stay spread over the interval instead of coming at once. The Iceberg
snapshots stay the truth; the report carries the first and last snapshot ids it covers. A
:class:`Throttle` does the same for the routine chores' reports (the latest one, with a count). Plain Python.
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from kafka_iceberg.batch.types import BatchResult

MATERIALIZE_EVERY_S = 60.0
"""Seconds between two reports (``AssetMaterialization`` s) of one table's commits by a worker run, at
most; a table whose freshness allows less (``freshness.max_snapshot_age`` under two minutes) is reported
every half of it."""

REPORT_EVERY_S = 300.0
"""Seconds between two reports of one table's routine chores by a worker run, at most: its passing
``duplicate_free`` evaluations and its expiries and compactions by count, whose number follows the commit
rate (a table past ``max_snapshots`` at several commits a second is expired every minute or two). A failed
check is reported at once. With :data:`MATERIALIZE_EVERY_S`, a table adds at most about 110 events an hour."""

T = TypeVar("T")


@dataclass(frozen=True)
class Coalesced:
    """The commits of one table since its last report: ``result`` (the merged ``BatchResult``: ``records``,
    ``kafka_bytes``, ``records_read``, data files and bytes, quarantined records summed; ``ranges`` from the
    first start to the last end per partition; offsets, lag, snapshot id and the rest of the last commit),
    ``commits`` (micro-batches merged) and ``first_snapshot_id`` (the first commit's snapshot)."""

    result: BatchResult
    commits: int
    first_snapshot_id: int | None


def merge(results: list[BatchResult]) -> Coalesced:
    """``results`` (one table's committed micro-batches, in commit order, at least one) as one
    :class:`Coalesced`. Raises ``ValueError`` on an empty list."""
    if not results:
        raise ValueError("nothing to merge")
    first, last = results[0], results[-1]
    ranges: dict[int, tuple[int, int]] = {}
    kinds: dict[str, int] = {}
    by_partition: dict[int, int] = {}
    for r in results:
        for p, n in r.quarantined_by_partition.items():
            by_partition[p] = by_partition.get(p, 0) + n
        for p, (start, end) in r.ranges.items():
            ranges[p] = (ranges[p][0], end) if p in ranges else (start, end)
        for kind, n in r.quarantine_kinds.items():
            kinds[kind] = kinds.get(kind, 0) + n
    merged = dataclasses.replace(
        last,
        records=sum(r.records for r in results),
        kafka_bytes=sum(r.kafka_bytes for r in results),
        records_read=sum(r.records_read for r in results),
        data_files_added=sum(r.data_files_added for r in results),
        data_bytes_added=sum(r.data_bytes_added for r in results),
        quarantined=sum(r.quarantined for r in results),
        quarantine_kinds=kinds,
        quarantined_by_partition=by_partition,
        ranges=ranges,
        schema_changes=[c for r in results for c in r.schema_changes],
    )
    return Coalesced(merged, len(results), first.snapshot_id)


class Coalescer:
    """Per table identifier, the commits not reported yet. ``every_s(identifier)``: its interval in seconds
    (default :data:`MATERIALIZE_EVERY_S`); ``clock``: monotonic seconds. Not thread-safe: call it from one
    thread (the worker's main thread, which reports the commits)."""

    def __init__(
        self,
        every_s: Callable[[str], float] = lambda identifier: MATERIALIZE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.every_s, self.clock = every_s, clock
        self.held: dict[str, list[BatchResult]] = {}
        self.reported: dict[str, float] = {}  # identifier -> clock of its last report

    def add(self, identifier: str, result: BatchResult) -> Coalesced | None:
        """Hold ``result`` (a commit of ``identifier``'s table); returns its commits to report now when its
        interval since the last report passed (always for its first), else None."""
        self.held.setdefault(identifier, []).append(result)
        return self._take(identifier) if self._due(identifier) else None

    def due(self) -> dict[str, Coalesced]:
        """The held commits of every table whose interval passed, to report now."""
        return {i: self._take(i) for i in list(self.held) if self._due(i)}

    def drain(self) -> dict[str, Coalesced]:
        """Every held commit, to report now (the run stops serving)."""
        return {i: self._take(i) for i in list(self.held)}

    def _due(self, identifier: str) -> bool:
        last = self.reported.get(identifier)
        return last is None or self.clock() - last >= self.every_s(identifier)

    def _take(self, identifier: str) -> Coalesced:
        now = self.clock()
        # the first report counts as made a phase of the interval earlier: the table's own place in it
        first = identifier not in self.reported
        self.reported[identifier] = now - phase(identifier) * self.every_s(identifier) if first else now
        return merge(self.held.pop(identifier))


def phase(identifier: str) -> float:
    """A table's place in its report interval, in [0, 1): its identifier's CRC-32 over 2**32 (the same in
    every process)."""
    return zlib.crc32(identifier.encode()) / 2**32


class Throttle(Generic[T]):
    """Per key (say, a table and a chore), the latest item not reported yet and how many items it stands for,
    handed out at most once per ``every_s`` seconds (``clock``: monotonic seconds): a key's first item at
    once, the next when the interval since its last report passed, or at once when it is ``urgent`` (a
    failed check). An item held back is replaced by the next one; :meth:`drain` hands out the held ones
    (the run stops serving). Not thread-safe: call it from one thread."""

    def __init__(self, every_s: float = REPORT_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.every_s, self.clock = every_s, clock
        self.held: dict[Hashable, tuple[T, int]] = {}  # key -> (latest item, items since the last report)
        self.reported: dict[Hashable, float] = {}  # key -> clock of its last report

    def add(self, key: Hashable, item: T, urgent: bool = False) -> tuple[T, int] | None:
        """Hold ``item``; returns (it, how many items it reports, itself included) when it is due, else None."""
        self.held[key] = (item, self.held.get(key, (item, 0))[1] + 1)
        last = self.reported.get(key)
        if urgent or last is None or self.clock() - last >= self.every_s:
            self.reported[key] = self.clock()
            return self.held.pop(key)
        return None

    def discard(self, key: Hashable) -> None:
        """Forget the item held for ``key``, if any (a newer verdict of another kind supersedes it)."""
        self.held.pop(key, None)

    def drain(self) -> dict[Hashable, tuple[T, int]]:
        """Every held item with its count, to report now; nothing is held afterwards."""
        out, self.held = self.held, {}
        now = self.clock()
        self.reported.update({k: now for k in out})
        return out


__all__ = ["MATERIALIZE_EVERY_S", "REPORT_EVERY_S", "Coalesced", "Coalescer", "Throttle", "merge", "phase"]
