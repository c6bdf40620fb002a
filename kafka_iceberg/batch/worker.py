"""One worker, many tables: a loop that serves several tables from one process and one Spark session.

Each turn runs one whole micro-batch of one unit (:mod:`kafka_iceberg.batch.units`): a table alone
(:func:`kafka_iceberg.batch.pipeline.run_micro_batch`: recover, plan, conditional commit, the offsets in
the snapshot), or a consistency group's tables together
(:func:`kafka_iceberg.batch.group_batch.run_group_batch`: one catalog transaction for all of them), so
every table keeps its exactly-once commits. Tables are served by need and fairly: the table that has waited longest with
records unread goes next, and after its (bounded) micro-batch it goes to the back of the line, so a
busy table never holds the others up. Up to ``threads`` tables' micro-batches run at once (threads of
one process on one Spark session: one table's read, mostly in librdkafka, pyarrow and the JVM, overlaps
another's commit); one table never has two. A table whose micro-batch fails (a missing topic, a blocked
schema change, bad records over its policy, a refused catalog commit) is set aside for the rest of
the run and reported; the others keep committing. Plain Python: the Dagster layer
(:mod:`kafka_iceberg.lake_assets.worker`) supplies the ports (:class:`WorkerPorts`).

Thread contract: a run's state (:class:`RunState`, one :class:`TableState` per table) is read and
replaced only by the thread that called :meth:`Worker.run`, its main thread. A pool thread runs
``run_batch(spec)`` or ``run_group(specs)`` and nothing else: it gets the declarations and returns that
micro-batch's outcome through its future, which the main thread reports. Every other port is called from the main
thread. What a pool thread must read of the main thread's world it reads from a :class:`Latest` (under
its lock), holding an immutable value such as :class:`RunsInProgress`. The pool is shut down when the
run ends, however it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

from kafka_iceberg.batch.assign import MAX_DEFAULT_WORKERS, assign_workers, worker_count
from kafka_iceberg.batch.planning import Watermarks
from kafka_iceberg.batch.shared import LIVENESS_MARGIN_MS, Latest, RunsInProgress
from kafka_iceberg.batch.table_state import (
    REST_S,
    TableState,
    ended,
    offset_lags,
    polled,
    resting,
    table_lag,
)
from kafka_iceberg.batch.units import Unit, identifiers, is_group, next_units, units_of
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.errors import ConfigError

POLL_S = 0.25
"""Seconds between watermark polls while no table has records waiting."""


def chore_allowed(idle: bool, chore_s: float, elapsed_s: float, share: float) -> bool:
    """Whether a chore may run now: always while ``idle``, else while chores took at most ``share`` of the
    ``elapsed_s`` seconds of the run (``chore_s`` of them)."""
    return idle or chore_s <= share * elapsed_s


@dataclass(frozen=True)
class Budget:
    """How long a run starts micro-batches: until ``budget_s`` seconds after ``started`` (clock s), and
    past that while a successor is on its way, ``grace_s`` seconds at most."""

    started: float
    budget_s: float
    grace_s: float = 0.0

    def spent(self, now_s: float, held: Callable[[], bool]) -> bool:
        """Whether the budget is spent at ``now_s``: past the deadline, and past the grace or not ``held()``
        (asked only past the deadline)."""
        deadline = self.started + self.budget_s
        return now_s >= deadline and (now_s >= deadline + self.grace_s or not held())


@dataclass(frozen=True)
class Clock:
    """The clocks of a run: ``now`` (seconds, monotonic: durations and order), ``sleep`` (seconds) and
    ``epoch_ms`` (ms since epoch: cron ticks and recorded times). Tests pass fake ones."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    epoch_ms: Callable[[], int] = lambda: int(time.time() * 1000)


def _no_group_runner(specs: Sequence[TableSpec]) -> Mapping[str, Any]:
    raise ConfigError(f"no group micro-batch runner for {[s.identifier for s in specs]}")


@dataclass(frozen=True)
class WorkerPorts:
    """What a :class:`Worker` calls. ``run_batch(spec)`` runs one micro-batch and returns its
    ``BatchResult`` (``offsets``: the committed offsets after it); with ``threads`` > 1 it runs in pool
    threads, several at once, and must touch no state of the run; so does ``run_group(specs)``, one
    micro-batch of a consistency group's members (identifier -> each one's ``BatchResult``). Every other port is called from the
    run's main thread only, and must not raise: ``watermarks(topics)`` returns the watermarks of every
    partition of the topics (one batched call; ``None`` for a missing topic); ``on_commit(spec, result)``
    and ``on_failure(spec, error)`` report each micro-batch; ``should_stop()``: stop starting
    micro-batches; ``hold()``: a successor is on its way (serve on past the budget, within the grace);
    ``chores(idle, busy)`` does one piece of other work and returns whether there was any (``idle``: no
    table has records waiting; ``busy``: the identifiers whose micro-batch runs meanwhile);
    ``paused()``: the identifiers whose micro-batch must not start now (a chore runs on them);
    ``working()``: a chore runs in the background (the run does not end idle meanwhile);
    ``flush(final)``: between micro-batches and while idle (``final`` False), once at a normal end."""

    run_batch: Callable[[TableSpec], Any]
    watermarks: Callable[[list[str]], Mapping[str, Mapping[int, Watermarks] | None]]
    on_commit: Callable[[TableSpec, Any], None] = lambda spec, result: None
    on_failure: Callable[[TableSpec, BaseException], None] = lambda spec, error: None
    should_stop: Callable[[], bool] = lambda: False
    hold: Callable[[], bool] = lambda: False
    chores: Callable[[bool, frozenset], bool] = lambda idle, busy: False
    paused: Callable[[], frozenset] = frozenset
    working: Callable[[], bool] = lambda: False
    flush: Callable[[bool], None] = lambda final: None
    run_group: Callable[[Sequence[TableSpec]], Mapping[str, Any]] = _no_group_runner


@dataclass
class RunState:
    """What one run of a :class:`Worker` keeps; read and changed only by the run's main thread. ``tables``:
    identifier -> :class:`TableState` (replaced whole); ``chore_s``: seconds its chores took;
    ``idle_until``: clock seconds at which the run ends idle (None while records wait); ``units``: what
    is served as one (:func:`~kafka_iceberg.batch.units.units_of`)."""

    tables: dict[str, TableState]
    budget: Budget
    units: tuple = ()
    chore_s: float = 0.0
    idle_until: float | None = None


@dataclass
class Worker:
    """Serves ``specs`` until no records wait for ``idle_s`` seconds, ``budget_s`` seconds pass (no
    micro-batch starts after it), or ``ports.should_stop()`` is true. With ``budget_s`` 0 every table
    with records waiting gets one micro-batch. Past the budget, the run keeps serving while
    ``ports.hold()`` is true (a successor is on its way but not ready to take over), ``grace_s`` seconds
    at most. ``committed``: each table's committed offsets when the run starts (identifier -> partition
    -> next offset to read; read, never changed). ``threads``: micro-batches of different tables run at
    once (1: one at a time, in the calling thread). Chores run while no table has records waiting, and
    after a micro-batch while they have taken at most ``chore_share`` of the run's time so far, so a
    backlog of chores slows ingestion by that share at most and never stops it. A paused table keeps its
    place in the line, and the run does not count as idle while it has records waiting. ``last_run``:
    the state of the latest run (see the module docstring for the thread contract)."""

    specs: Sequence[TableSpec]
    ports: WorkerPorts
    committed: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    budget_s: float = 0.0
    idle_s: float = 2.0
    grace_s: float = 0.0
    chore_share: float = 0.25
    threads: int = 1
    clock: Clock = field(default_factory=Clock)
    last_run: RunState | None = field(default=None, init=False, repr=False)

    def run(self) -> dict[str, TableState]:
        """Serve the tables (see the class docstring). Returns each table's state at the end, per table
        identifier. Raises what a micro-batch raised that is not an ``Exception`` (a crash hook's exit)."""
        tables = {s.identifier: TableState(s, dict(self.committed.get(s.identifier, {}))) for s in self.specs}
        budget = Budget(self.clock.now(), self.budget_s, self.grace_s)
        run = self.last_run = RunState(tables, budget, units=tuple(units_of(self.specs)))
        many = self.threads > 1
        with ThreadPoolExecutor(self.threads, thread_name_prefix="lake-worker") if many else nullcontext() as pool:
            self._loop(run, pool)
        self.ports.flush(True)
        return dict(run.tables)

    def _loop(self, run: RunState, pool: ThreadPoolExecutor | None) -> None:
        """Poll, serve a round of the tables due, or do a chore or sleep, until the run ends."""
        while True:
            self.ports.flush(False)
            now, waiting, due = self._poll(run)
            if not due:
                if self._ending(run):
                    return
                if not waiting:  # paused or resting tables' records wait for a chore or the source: not idle
                    run.idle_until = now + self.idle_s if run.idle_until is None else run.idle_until
                    if now >= run.idle_until and not self.ports.working():
                        return
                if not self._chore(run, idle=not waiting):
                    self.clock.sleep(POLL_S)
                continue
            run.idle_until = None
            self._serve_round(run, pool, due)
            if self._ending(run):
                return

    def _poll(self, run: RunState) -> tuple[float, list[Unit], list[Unit]]:
        """Poll the live tables' watermarks into their states; returns (the clock, the units with records
        waiting, those of them due now: not paused by a chore nor resting), longest waiting first."""
        live = [t for t in run.tables.values() if t.error is None]
        marks = self.ports.watermarks(sorted({t.spec.topic for t in live}))
        now = self.clock.now()
        for t in live:
            run.tables[t.spec.identifier] = polled(t, marks.get(t.spec.topic), now)
        waiting = next_units(run.tables, run.units)
        held = self.ports.paused() | resting(run.tables.values(), now)
        return now, waiting, next_units(run.tables, run.units, held) if waiting else []

    def _serve_round(self, run: RunState, pool: ThreadPoolExecutor | None, due: list[Unit]) -> None:
        """One micro-batch of each due unit, longest waiting first and up to :attr:`threads` at once;
        each unit goes to the back after its own. With several threads, the next units' micro-batches
        start before the finished ones are reported (``on_commit``: a write to the Dagster instance),
        unless one crashed. No micro-batch starts past the budget; those running are awaited."""
        queue, running = list(due), {}
        while queue or running:
            self._fill(run, pool, queue, running)
            if not running:
                return
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            finished = [(running.pop(future), future) for future in done]
            if self.threads > 1 and not any(_crashed(f) for _, f in finished):
                self._fill(run, pool, queue, running)  # the next units read while these are reported
            for unit, future in finished:
                self._finish(run, unit, future)
                self._chore(run, idle=False, busy=identifiers(running.values()))
            self.ports.flush(False)

    def _fill(self, run: RunState, pool, queue: list[Unit], running: dict[Future, Unit]) -> None:
        """Start the queue's next micro-batches while fewer than :attr:`threads` run, unless stopping. A unit
        with a table that a chore paused since the round began is left for a later round (it keeps its place)."""
        while queue and len(running) < max(1, self.threads) and not self._stopping(run):
            unit = queue.pop(0)
            if identifiers([unit]) & self.ports.paused():
                continue
            for spec in unit:
                run.tables[spec.identifier] = replace(run.tables[spec.identifier], tried=True)
            running[self._start(pool, unit)] = unit

    def _run_unit(self, unit: Unit) -> Mapping[str, Any]:
        """One micro-batch of ``unit`` (in a pool thread: no state of the run): identifier -> its result."""
        if is_group(unit):
            return dict(self.ports.run_group(unit))
        return {unit[0].identifier: self.ports.run_batch(unit[0])}

    def _start(self, pool: ThreadPoolExecutor | None, unit: Unit) -> Future:
        """``unit``'s micro-batch: in a thread of the pool, or (one thread) run here, its future already done."""
        if pool is not None:
            return pool.submit(self._run_unit, unit)
        future: Future = Future()
        try:
            future.set_result(self._run_unit(unit))
        except Exception as exc:  # noqa: BLE001 - reported by _finish; a BaseException (a crash) propagates
            future.set_exception(exc)
        return future

    def _finish(self, run: RunState, unit: Unit, future: Future) -> None:
        """Report one finished micro-batch, per table of the unit: its commit, or its failure (every table
        of the unit is set aside)."""
        error = future.exception()
        if _crashed(future):
            raise error  # a crash (SystemExit from a crash hook, a KeyboardInterrupt) ends the run
        now = self.clock.now()
        results = future.result() if error is None else {}
        for spec in unit:
            state = run.tables[spec.identifier]
            if error is not None:
                run.tables[spec.identifier] = ended(state, now, error=error)
                self.ports.on_failure(spec, error)
                continue
            result = results[spec.identifier]
            run.tables[spec.identifier] = ended(state, now, result=result)
            self.ports.on_commit(spec, result)

    def _ending(self, run: RunState) -> bool:
        """Whether the run ends instead of waiting: one micro-batch per table (``budget_s`` 0), the budget
        spent, or asked to stop."""
        return self.budget_s <= 0 or self._spent(run) or self.ports.should_stop()

    def _stopping(self, run: RunState) -> bool:
        return self.budget_s > 0 and (self._spent(run) or self.ports.should_stop())

    def _spent(self, run: RunState) -> bool:
        return run.budget.spent(self.clock.now(), self.ports.hold)

    def _chore(self, run: RunState, idle: bool, busy: frozenset = frozenset()) -> bool:
        """One chore if :func:`chore_allowed`; returns whether one ran (its seconds count in ``chore_s``)."""
        if not chore_allowed(idle, run.chore_s, self.clock.now() - run.budget.started, self.chore_share):
            return False
        t0 = self.clock.now()
        ran = self.ports.chores(idle, busy)
        if ran:
            run.chore_s += self.clock.now() - t0
        return ran


def _crashed(future: Future) -> bool:
    """Whether a finished micro-batch ended in a crash (a ``BaseException`` that is not an ``Exception``)."""
    error = future.exception()
    return error is not None and not isinstance(error, Exception)


__all__ = [
    "LIVENESS_MARGIN_MS",
    "MAX_DEFAULT_WORKERS",
    "POLL_S",
    "REST_S",
    "Budget",
    "Clock",
    "Latest",
    "RunState",
    "RunsInProgress",
    "TableState",
    "Worker",
    "WorkerPorts",
    "assign_workers",
    "chore_allowed",
    "ended",
    "offset_lags",
    "polled",
    "resting",
    "table_lag",
    "worker_count",
]
