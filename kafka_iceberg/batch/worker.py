"""One worker, many tables: a loop that serves several tables from one process and one Spark session.

Each turn runs one whole micro-batch of one table (:func:`kafka_iceberg.batch.pipeline.run_micro_batch`:
recover, plan, conditional commit, the offsets in the snapshot), so every table keeps its own
exactly-once commits. Tables are served by need and fairly: the table that has waited longest with
records unread goes next, and after its (bounded) micro-batch it goes to the back of the line, so a
busy table never holds the others up. Up to ``threads`` tables' micro-batches run at once (threads of
one process on one Spark session: one table's read, mostly in librdkafka, pyarrow and the JVM, overlaps
another's commit); one table never has two. A table whose micro-batch fails (a missing topic, a blocked
schema change, bad records over its policy, a refused catalog commit) is set aside for the rest of
the run and reported; the others keep committing. Plain Python: the Dagster layer
(:mod:`kafka_iceberg.lake_assets.worker`) supplies the callbacks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from kafka_iceberg.batch.planning import Watermarks
from kafka_iceberg.declaration.spec import TableSpec

POLL_S = 0.25
"""Seconds between watermark polls while no table has records waiting."""


def assign_workers(specs: Sequence[TableSpec], workers: int) -> dict[int, list[TableSpec]]:
    """Tables per worker (0 .. ``workers`` - 1): round robin over the identifiers in sorted order, so the
    workers' shares differ by one table at most. A table added or removed moves others at the next
    reload; two runs serving one table for a while is safe (conditional commits), only slower."""
    groups: dict[int, list[TableSpec]] = {k: [] for k in range(max(1, workers))}
    for i, spec in enumerate(sorted(specs, key=lambda s: s.identifier)):
        groups[i % max(1, workers)].append(spec)
    return groups


def offset_lags(
    specs: Sequence[TableSpec],
    watermarks: dict[str, dict[int, Watermarks] | None],
    committed: dict[str, dict[int, int]],
) -> dict[str, int]:
    """Offset lag (records, summed over partitions) per table identifier, from the topics' watermarks
    (``None`` for a missing topic: lag 0, its micro-batch reports the error) and each table's committed
    offsets (a partition the table never committed counts from its log start offset)."""
    lags = {}
    for spec in specs:
        marks = watermarks.get(spec.topic) or {}
        done = committed.get(spec.identifier, {})
        lags[spec.identifier] = sum(max(0, w.high - done.get(p, w.low)) for p, w in marks.items())
    return lags


@dataclass
class TableServed:
    """What one run of the worker did for one table: its commits and, if it failed, the error."""

    spec: TableSpec
    results: list = field(default_factory=list)  # BatchResult per micro-batch, in commit order
    error: BaseException | None = None
    tried: bool = False  # a micro-batch was attempted (a table whose topic is missing is tried once, to report it)


@dataclass
class Worker:
    """Serves ``specs`` until no records wait for ``idle_s`` seconds, ``budget_s`` seconds pass (no
    micro-batch starts after it), or ``should_stop()`` is true. With ``budget_s`` 0 every table with
    records waiting gets one micro-batch. Past the budget, the run keeps serving while ``hold()`` is true
    (a successor is on its way but not ready to take over), ``grace_s`` seconds at most.

    ``run_batch(spec)`` runs one micro-batch and returns its ``BatchResult`` (``offsets``: the
    committed offsets after it); ``watermarks(topics)`` returns the watermarks of every partition
    of the topics (one batched call; ``None`` for a missing topic); ``committed`` holds each table's
    committed offsets when the run starts; ``on_commit(spec, result)`` and ``on_failure(spec, error)``
    report each micro-batch (they must not raise).

    ``threads``: micro-batches of different tables run at once (1: one at a time, in the calling
    thread). ``run_batch`` must then be safe to call from several threads at once; the callbacks and
    chores are always called from the thread that called :meth:`run`.

    ``chores(idle, busy)`` does one piece of other work (a due maintenance job, a pending check) and
    returns whether there was any (it must not raise); ``idle``: no table has records waiting;
    ``busy``: the identifiers whose micro-batch runs meanwhile (their maintenance must wait). It is
    called while no table has records waiting, and after a micro-batch while chores have taken at most
    ``chore_share`` of the run's time so far, so a backlog of chores slows ingestion by that share at
    most and never stops it. ``paused()``: the identifiers whose micro-batch must not start now (a chore
    runs on them that their commit would conflict with); they keep their place in the line, and the run
    does not count as idle while they have records waiting. ``flush(final)`` is called from the same thread
    between micro-batches and while idle (``final`` False), and once when the run ends normally (``final``
    True): the Dagster layer commits the deferred consumer-group mirrors there
    (:class:`kafka_iceberg.batch.mirror.GroupMirror`); it must not raise."""

    specs: Sequence[TableSpec]
    run_batch: Callable[[TableSpec], object]
    watermarks: Callable[[list[str]], dict[str, dict[int, Watermarks] | None]]
    committed: dict[str, dict[int, int]]
    on_commit: Callable[[TableSpec, object], None]
    on_failure: Callable[[TableSpec, BaseException], None]
    budget_s: float = 0.0
    idle_s: float = 2.0
    should_stop: Callable[[], bool] = lambda: False
    hold: Callable[[], bool] = lambda: False
    grace_s: float = 0.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    chores: Callable[[bool, frozenset], bool] = lambda idle, busy: False
    paused: Callable[[], frozenset] = frozenset
    flush: Callable[[bool], None] = lambda final: None
    chore_share: float = 0.25
    threads: int = 1
    chore_s: float = field(default=0.0, init=False)  # seconds spent in chores this run
    _pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)

    def _run(self) -> dict[str, TableServed]:
        served = {s.identifier: TableServed(s) for s in self.specs}
        self.started = self.clock()
        self.deadline = self.started + self.budget_s
        waiting_since: dict[str, float] = {}
        idle_until = None
        while True:
            self.flush(False)
            live = [s for s in self.specs if served[s.identifier].error is None]
            marks = self.watermarks(sorted({s.topic for s in live}))
            lags = offset_lags(live, marks, self.committed)
            now = self.clock()
            for s in live:
                if lags[s.identifier] > 0 or (marks.get(s.topic) is None and not served[s.identifier].tried):
                    waiting_since.setdefault(s.identifier, now)
                else:
                    waiting_since.pop(s.identifier, None)
            waiting = sorted(
                (s for s in live if s.identifier in waiting_since), key=lambda s: waiting_since[s.identifier]
            )
            paused = self.paused() if waiting else frozenset()
            due = [s for s in waiting if s.identifier not in paused]
            if not due:
                if self._ending():
                    return served
                if not waiting:  # paused tables' records wait for a chore, not for new records: not idle
                    idle_until = idle_until or now + self.idle_s
                    if now >= idle_until:
                        return served
                if not self._chore(idle=not waiting):
                    self.sleep(POLL_S)
                continue
            idle_until = None
            self._serve_round(due, served, waiting_since)
            if self._ending():
                return served

    def run(self) -> dict[str, TableServed]:
        """Serve the tables (see the class docstring). Returns what was done, per table identifier."""
        try:
            served = self._run()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
        self.flush(True)
        return served

    def _serve_round(self, due: list[TableSpec], served: dict[str, TableServed], waiting_since: dict[str, float]):
        """One micro-batch of each due table, longest waiting first and up to :attr:`threads` at once;
        each table goes to the back after its own. With several threads, the next tables' micro-batches
        start before the finished ones are reported (``on_commit``: a write to the Dagster instance),
        unless one crashed. No micro-batch starts past the budget; those running are awaited."""
        queue, running = list(due), {}
        while queue or running:
            self._fill(queue, running, served)
            if not running:
                return
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            finished = [(running.pop(future), future) for future in done]
            if self.threads > 1 and not any(_crashed(f) for _, f in finished):
                self._fill(queue, running, served)  # the next tables read while these are reported
            for spec, future in finished:
                self._finish(spec, future, served, waiting_since)
                self._chore(idle=False, busy=frozenset(s.identifier for s in running.values()))
            self.flush(False)

    def _fill(self, queue: list[TableSpec], running: dict[Future, TableSpec], served: dict[str, TableServed]) -> None:
        """Start the queue's next micro-batches while fewer than :attr:`threads` run, unless stopping. A table
        that a chore paused since the round began is left for a later round (it keeps its place)."""
        while queue and len(running) < max(1, self.threads) and not self._stopping():
            spec = queue.pop(0)
            if spec.identifier in self.paused():
                continue
            served[spec.identifier].tried = True
            running[self._start(spec)] = spec

    def _ending(self) -> bool:
        """Whether the run ends instead of waiting: one micro-batch per table (``budget_s`` 0), the budget
        spent, or asked to stop."""
        return self.budget_s <= 0 or self._spent() or self.should_stop()

    def _stopping(self) -> bool:
        return self.budget_s > 0 and (self._spent() or self.should_stop())

    def _start(self, spec: TableSpec) -> Future:
        """``spec``'s micro-batch: in a thread of the pool, or (one thread) run here, its future already done."""
        if self.threads > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="lake-worker")
            return self._pool.submit(self.run_batch, spec)
        future: Future = Future()
        try:
            future.set_result(self.run_batch(spec))
        except Exception as exc:  # noqa: BLE001 - reported by _finish; a BaseException (a crash) propagates
            future.set_exception(exc)
        return future

    def _finish(self, spec: TableSpec, future: Future, served: dict[str, TableServed], waiting_since: dict) -> None:
        """Report one finished micro-batch: its commit, or its failure (the table is set aside)."""
        waiting_since.pop(spec.identifier, None)
        error = future.exception()
        if _crashed(future):
            raise error  # a crash (SystemExit from a crash hook, a KeyboardInterrupt) ends the run
        if error is not None:
            served[spec.identifier].error = error
            self.on_failure(spec, error)
            return
        result = future.result()
        served[spec.identifier].results.append(result)
        self.committed[spec.identifier] = dict(result.offsets)
        self.on_commit(spec, result)

    def _spent(self) -> bool:
        """Whether the budget is spent: past the deadline, and past the grace or not held (:attr:`hold`)."""
        now = self.clock()
        return now >= self.deadline and (now >= self.deadline + self.grace_s or not self.hold())

    def _chore(self, idle: bool, busy: frozenset = frozenset()) -> bool:
        """One chore when ``idle``, or when chores took at most ``chore_share`` of the run so far; returns whether one ran."""
        if not idle and self.chore_s > self.chore_share * (self.clock() - self.started):
            return False
        t0 = self.clock()
        ran = self.chores(idle, busy)
        if ran:
            self.chore_s += self.clock() - t0
        return ran


def _crashed(future: Future) -> bool:
    """Whether a finished micro-batch ended in a crash (a ``BaseException`` that is not an ``Exception``)."""
    error = future.exception()
    return error is not None and not isinstance(error, Exception)


__all__ = ["POLL_S", "TableServed", "Worker", "assign_workers", "offset_lags"]
