"""The worker's thread contract (kafka_iceberg/batch/worker.py, lake_assets/worker_chores.py,
kafka_iceberg/ops/chore_state.py): with fifty tables, four micro-batch threads and the chore thread, a
run's state is read and changed by its main thread only, the ports other than ``run_batch`` are called
there, and every executor is shut down at the end. The process caches are locked. Plain Python on a fake
clock: no Spark, broker or Dagster instance."""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import replace
from types import SimpleNamespace

from kafka_iceberg.batch import context as batch_context
from kafka_iceberg.batch import worker as worker_module
from kafka_iceberg.batch.planning import Watermarks
from kafka_iceberg.batch.recovery import Attempt
from kafka_iceberg.batch.units import next_units, units_of
from kafka_iceberg.batch.worker import Clock, Latest, RunsInProgress, TableState, Worker, WorkerPorts
from kafka_iceberg.formats import decode
from kafka_iceberg.lake_assets.worker_chores import ChoreEnv, WorkerChores
from kafka_iceberg.ops.chore_state import CHECK_SPACING_S, TRIM_CHECK_S, TableChores, after_commit, next_chore
from kafka_iceberg.ops.maintenance import MaintenanceResult
from kafka_iceberg.ops.rota import MaintenanceRota
from tests.helpers import make_spec

TABLES, RECORDS, PER_BATCH = 50, 30, 10


class Owned(dict):
    """A dict that notes, in ``strays``, every access from a thread other than the one that made it."""

    def __init__(self, data, strays: list):
        super().__init__(data)
        self._owner, self._strays = threading.current_thread(), strays

    def _check(self, what):
        if threading.current_thread() is not self._owner:
            self._strays.append((threading.current_thread().name, what))


_READS = ("__getitem__", "__contains__", "__iter__", "__len__", "get", "items", "values", "keys")
_WRITES = ("__setitem__", "__delitem__", "pop", "setdefault", "update")
for _name in _READS + _WRITES:

    def _guarded(self, *args, _name=_name, **kwargs):
        self._check(_name)
        return getattr(dict, _name)(self, *args, **kwargs)

    setattr(Owned, _name, _guarded)


def _owned_attributes(cls, strays: list, allowed: frozenset = frozenset()):
    """A subclass of ``cls`` whose instances note in ``strays`` every attribute read from a thread other
    than the one that made them, except the ``allowed`` names."""

    class Guarded(cls):
        def __getattribute__(self, name):
            owner = object.__getattribute__(self, "__dict__").get("_owner")
            if owner is not None and name not in allowed and threading.current_thread() is not owner:
                strays.append((threading.current_thread().name, name))
            return object.__getattribute__(self, name)

    return Guarded


class FakeClock:
    """Seconds that move only when the run sleeps or a micro-batch takes its 0.05 s; locked, since the
    pool threads move it too."""

    def __init__(self):
        self._now, self._lock = 1000.0, threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def epoch_ms(self) -> int:
        return int(self.now() * 1000)


def _specs():
    """Fifty tables: every fifth an upsert table, all compacted after two data files, some expired past
    three snapshots."""
    specs = []
    for i in range(TABLES):
        upsert = {"mode": "upsert", "key": ["id"], "cdc": "none"} if i % 5 == 0 else {}
        maintenance = {"compact_after_data_files": 2, "max_snapshots": 3, "retain_last": 2}
        specs.append(make_spec(f"many{i}", f"many_topic{i}", maintenance=maintenance, **upsert))
    return specs


def test_fifty_tables_on_four_threads_touch_the_run_state_only_from_the_main_thread(monkeypatch):
    strays, calls, main = [], [], threading.current_thread()
    clock, lock = FakeClock(), threading.Lock()
    specs = _specs()
    upserts = {s.identifier for s in specs if s.upsert is not None}
    offsets, compacting, overlaps, batch_threads = {s.identifier: 0 for s in specs}, set(), [], set()
    before = set(threading.enumerate())

    class GuardedRun(_owned_attributes(worker_module.RunState, strays)):
        def __post_init__(self):
            self.tables = Owned(self.tables, strays)
            self._owner = threading.current_thread()

    monkeypatch.setattr(worker_module, "RunState", GuardedRun)

    def run_batch(spec):  # a pool thread: the fake table's offsets are the fake catalog's, under its lock
        time.sleep(0.001)
        clock.sleep(0.05)
        with lock:
            batch_threads.add(threading.current_thread().name)
            if spec.identifier in compacting and spec.identifier in upserts:
                overlaps.append(spec.identifier)
            offsets[spec.identifier] = done = min(RECORDS, offsets[spec.identifier] + PER_BATCH)
        return SimpleNamespace(offsets={0: done}, snapshot_id=done, snapshots=done // PER_BATCH + 1, data_files_added=1)

    class Chores(_owned_attributes(WorkerChores, strays, allowed=frozenset({"env"}))):
        def evaluate(self, spec, after, run_id):  # the chore thread
            time.sleep(0.002)
            return (after or 0) + 1, SimpleNamespace(passed=True)

        def job(self, spec, kind, started_ms, *, concurrent=False, after, run_id):
            # only a compaction pauses an upsert table's micro-batches (WorkerChores.paused); an expiry may run
            # beside them, so it is not counted (counting it failed this test once under load)
            mark = kind == "compact"
            with lock:
                if mark:
                    compacting.add(spec.identifier)
            time.sleep(0.003)
            with lock:
                compacting.discard(spec.identifier)
            return MaintenanceResult(kind, 2, 1, 200, 100)

        def report(self, spec, outcome):
            calls.append(("report", threading.current_thread()))
            reported.append(spec.identifier)

    reported, events = [], []
    log = SimpleNamespace(info=lambda m: None, error=lambda m: None, warning=lambda m: None)
    context = SimpleNamespace(run_id="run-many", log=log, log_event=events.append)
    fake = Clock(now=clock.now, sleep=clock.sleep, epoch_ms=clock.epoch_ms)
    chores = Chores(context, specs, MaintenanceRota({}), ChoreEnv(None, None, None, None), fake)
    chores.tables = Owned(chores.tables, strays)
    chores._owner = main

    def on_main(name, fn):
        def port(*args):
            calls.append((name, threading.current_thread()))
            return fn(*args)

        return port

    marks = {s.topic: {0: Watermarks(0, RECORDS)} for s in specs}
    ports = WorkerPorts(
        run_batch,
        on_main("watermarks", lambda topics: {t: marks[t] for t in topics}),
        on_commit=on_main("on_commit", lambda s, r: chores.committed(s, r.snapshots, r.data_files_added)),
        on_failure=on_main("on_failure", lambda s, e: None),
        chores=on_main("chores", chores),
        paused=on_main("paused", chores.paused),
        flush=on_main("flush", lambda final: None),
    )
    with chores:
        served = Worker(specs, ports, budget_s=600, idle_s=1, threads=4, clock=fake).run()
        chores.finish()

    assert strays == [], f"run state touched off the main thread: {strays[:5]}"
    assert {t for _, t in calls} == {main}, "ports other than run_batch are called from the main thread"
    assert len(batch_threads) > 1 and main.name not in batch_threads, batch_threads
    assert all(len(s.results) == RECORDS // PER_BATCH and s.offsets == {0: RECORDS} for s in served.values())
    assert overlaps == [], "an upsert table's micro-batch started while it was compacted"
    compactions = [e for e in events if type(e).__name__ == "AssetObservation"]
    assert compactions and sorted(set(reported)) == sorted(offsets), "every table checked; some compacted"
    left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    assert left == [], f"executor threads left running: {left}"


def test_the_guard_notes_an_access_from_another_thread():
    """The check above can fail: a read of an owned dict, or of a guarded object's attribute, from another
    thread is noted."""
    strays = []
    owned = Owned({"a": 1}, strays)
    chores = _owned_attributes(WorkerChores, strays, allowed=frozenset({"env"}))(
        SimpleNamespace(run_id="r"), [], MaintenanceRota({}), ChoreEnv(None, None, None, None)
    )
    chores._owner = threading.current_thread()
    with chores:
        probe = threading.Thread(target=lambda: (owned.get("a"), chores.env, chores.running), name="probe")
        probe.start()
        probe.join()
    assert strays == [("probe", "get"), ("probe", "running")]


def test_the_next_table_and_the_next_chore_are_pure_functions_of_the_state_and_the_clock():
    a, b, c = (
        make_spec(n, f"{n}_topic", maintenance={"max_snapshots": 3, "retain_last": 2}) for n in ("pa", "pb", "pc")
    )
    states = {
        s.spec.identifier: s
        for s in (TableState(a, waiting_since=5.0), TableState(b, waiting_since=2.0), TableState(c))
    }
    units = units_of([a, b, c])
    assert [u[0].name for u in next_units(states, units)] == ["pb", "pa"]
    assert [u[0].name for u in next_units(states, units, frozenset({b.identifier}))] == ["pa"]
    tables = {s.identifier: TableChores(s) for s in (a, b, c)}
    tables[b.identifier] = after_commit(tables[b.identifier], 1, 100.0)
    tables[a.identifier] = after_commit(tables[a.identifier], 2, 100.0, snapshots=4)  # past max_snapshots
    frozen = copy.deepcopy(tables)
    # the check of a table past its ceiling goes before its expiry; a busy table waits
    assert next_chore(tables, None, 100.0, idle=False) == ("check", a.identifier, "duplicate_free")
    assert next_chore(tables, None, 100.0, idle=True, busy={a.identifier}) == ("check", b.identifier, "duplicate_free")
    assert next_chore(tables, None, 100.0, idle=False, busy={a.identifier}) is None, "pending < CHECK_EVERY_S"
    assert next_chore(tables, ("pc", "compact"), 100.0, idle=False) == ("maintain", "pc", "compact")
    checked = {**tables, a.identifier: replace(tables[a.identifier], checked_s=95.0)}  # its check started at 95 s
    assert next_chore(checked, None, 100.0, idle=False) == ("trim", a.identifier, "expire_snapshots")
    held = ("expire_snapshots",)  # another run of the worker's job is in progress: its last checks read these snapshots
    assert next_chore(checked, None, 100.0, idle=False, held=held) is None, "the expiry waits"
    assert next_chore(tables, None, 100.0, idle=True, held=held) == ("check", b.identifier, "duplicate_free")
    started = {**checked, a.identifier: checked[a.identifier].with_ceiling("expire_snapshots", started_s=99.0)}
    assert next_chore(started, None, 100.0, idle=False) is None, f"one expiry by count per {TRIM_CHECK_S} s"
    later = 99.0 + TRIM_CHECK_S
    assert next_chore(started, None, later, idle=False) == ("check", a.identifier, "duplicate_free"), "check stale"
    # under load, one run starts a check at most every CHECK_SPACING_S, whichever table it was
    spaced = {
        b.identifier: replace(tables[b.identifier], pending_since=0.0),  # pending 400 s, never checked: ready
        c.identifier: replace(tables[c.identifier], checked_s=400.0 - CHECK_SPACING_S + 1),  # c's check just started
    }
    assert next_chore(spaced, None, 400.0, idle=False) is None, "a check started under CHECK_SPACING_S ago"
    assert next_chore(spaced, None, 400.0, idle=True) == ("check", b.identifier, "duplicate_free"), "idle: no spacing"
    assert next_chore(spaced, None, 401.0, idle=False) == ("check", b.identifier, "duplicate_free")
    assert tables == frozen, "the states are values: nothing changed them"


def test_a_pool_thread_judges_liveness_from_the_runs_the_main_thread_listed():
    runs = Latest(RunsInProgress(frozenset({"run_a"}), taken_ms=1_000_000))
    alive = runs.get().is_alive
    assert alive(Attempt("b1", 900_000, "run_a")), "its run was in progress"
    assert not alive(Attempt("b2", 900_000, "run_b")), "its run was not, and it started long before"
    assert alive(Attempt("b3", 999_000, "run_b")), "it started just before the listing: its run may be new"
    runs.set(RunsInProgress(frozenset(), taken_ms=2_000_000))
    assert not runs.get().is_alive(Attempt("b1", 900_000, "run_a"))


def test_the_process_caches_are_locked_and_bounded(monkeypatch):
    ensured = batch_context.EnsuredTables()

    def add(k):
        for i in range(3000):
            ensured.add(("app", "uri", f"t{k}_{i}", None))

    adders = [threading.Thread(target=add, args=(k,)) for k in range(3)]
    for t in adders:
        t.start()
    try:
        for _ in range(50):
            ensured.forget("t0_1")  # iterates the keys while the others add to them
    finally:
        for t in adders:
            t.join()
    ensured.forget("t0_1")
    assert ("app", "uri", "t1_0", None) in ensured and ("app", "uri", "t0_1", None) not in ensured
    monkeypatch.setattr(decode, "_DECODERS", decode.LRUCache(maxsize=4))
    writers = [SimpleNamespace(schema_id=i, schema_str=None) for i in range(20)]
    workers = [threading.Thread(target=lambda: [decode._decoder("json", w, ()) for w in writers]) for _ in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert len(decode._DECODERS) == 4
    assert decode._decoder("json", writers[-1], ()) is decode._decoder("json", writers[-1], ())
