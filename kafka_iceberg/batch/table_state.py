"""One table's state in a worker run (:class:`TableState`) and the pure functions that move it: a watermark
poll (:func:`polled`), the end of a micro-batch (:func:`ended`) and which tables rest (:func:`resting`);
:func:`kafka_iceberg.batch.units.next_units` orders what goes next. Plain values: the worker's main thread
replaces them whole (:mod:`kafka_iceberg.batch.worker`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kafka_iceberg.batch.planning import Watermarks, offset_lag
from kafka_iceberg.declaration.spec import TableSpec

REST_S = 1.0
"""Seconds a table rests after a micro-batch that committed nothing while records wait (a consistency
group waiting for the rest of a source transaction): it is not served again before, so the run does not
plan and read the same records in a tight loop."""


def table_lag(marks: Mapping[int, Watermarks] | None, offsets: Mapping[int, int]) -> int:
    """Offset lag of one table (records, summed over partitions) from its topic's watermarks (``None``
    for a missing topic: 0) and its committed offsets (partition -> next offset to read; a partition
    never committed counts from its log start offset; :func:`kafka_iceberg.batch.planning.offset_lag`)."""
    return sum(offset_lag(marks or {}, offsets).values())


def offset_lags(
    specs: Sequence[TableSpec],
    watermarks: Mapping[str, Mapping[int, Watermarks] | None],
    committed: Mapping[str, Mapping[int, int]],
) -> dict[str, int]:
    """Offset lag (records, summed over partitions) per table identifier (:func:`table_lag`), from the
    topics' watermarks and each table's committed offsets (identifier -> partition -> offset)."""
    return {s.identifier: table_lag(watermarks.get(s.topic), committed.get(s.identifier, {})) for s in specs}


@dataclass(frozen=True)
class TableState:
    """One table's state in a worker run; the run's main thread replaces it whole, never changes it.

    ``offsets``: its committed offsets (partition -> next offset to read), from the run's start or
    its last commit in the run; ``lag``: records waiting at the last watermark poll; ``waiting_since``:
    clock seconds (:attr:`Clock.now`) since records have waited (None: none wait); ``tried``: a
    micro-batch was started (a table whose topic is missing is tried once, to report it); ``results``:
    its ``BatchResult`` per micro-batch, in commit order; ``error``: the failure that set it aside;
    ``last_commit_s``: clock seconds of its last micro-batch that ended (None: none yet); ``rest_until``:
    clock seconds before which it is not served (:data:`REST_S`; None: no rest)."""

    spec: TableSpec
    offsets: Mapping[int, int] = field(default_factory=dict)
    lag: int = 0
    waiting_since: float | None = None
    tried: bool = False
    results: tuple = ()
    error: BaseException | None = None
    last_commit_s: float | None = None
    rest_until: float | None = None


def polled(state: TableState, marks: Mapping[int, Watermarks] | None, now_s: float) -> TableState:
    """``state`` after a watermark poll at ``now_s`` (clock s) that found ``marks`` for its topic (None:
    the topic is missing): its lag, and since when records have waited (kept while they wait; a missing
    topic waits until it has been tried once)."""
    lag = table_lag(marks, state.offsets)
    waits = lag > 0 or (marks is None and not state.tried)
    since = (now_s if state.waiting_since is None else state.waiting_since) if waits else None
    return replace(state, lag=lag, waiting_since=since)


def ended(state: TableState, now_s: float, result: Any = None, error: BaseException | None = None) -> TableState:
    """``state`` after a micro-batch that ended at ``now_s`` (clock s) with ``result`` (a ``BatchResult``:
    its ``offsets`` are the table's committed offsets now) or ``error`` (the table is set aside). It
    waits again from the next poll that finds records; after a micro-batch that committed nothing (``result.committed``
    false: a consistency group waiting for the rest of a source transaction) it rests :data:`REST_S` seconds first."""
    if error is not None:
        return replace(state, error=error, waiting_since=None)
    offsets = dict(result.offsets)
    rest = None if getattr(result, "committed", True) else now_s + REST_S
    return replace(
        state,
        offsets=offsets,
        results=(*state.results, result),
        waiting_since=None,
        last_commit_s=now_s,
        rest_until=rest,
    )


def resting(states: Iterable[TableState], now_s: float) -> frozenset[str]:
    """The identifiers of the tables resting at ``now_s`` (clock s) after a micro-batch that committed nothing."""
    return frozenset(s.spec.identifier for s in states if s.rest_until is not None and now_s < s.rest_until)


__all__ = ["REST_S", "TableState", "ended", "offset_lags", "polled", "resting", "table_lag"]
