"""One worker, many tables (kafka_iceberg/batch/worker.py, lake_assets/worker.py, sensors/workers.py):
one process and Spark session serve several tables fairly, each commit the table's own, and a
poisoned table fails alone. Real Spark, real catalog, the dev broker, an ephemeral Dagster instance."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import Future
from dataclasses import replace
from types import SimpleNamespace

from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, build_sensor_context

from devtools import duck
from devtools.demo.data import produce
from kafka_iceberg.batch.mirror import GroupMirror
from kafka_iceberg.batch.pipeline import connect, run_micro_batch, warm_up
from kafka_iceberg.batch.planning import Watermarks
from kafka_iceberg.batch.units import next_units, units_of
from kafka_iceberg.batch.worker import (
    MAX_DEFAULT_WORKERS,
    Clock,
    TableState,
    Worker,
    WorkerPorts,
    assign_workers,
    offset_lags,
    worker_count,
)
from kafka_iceberg.catalog.tables import load_catalog, read_state
from kafka_iceberg.config.settings import load_settings
from kafka_iceberg.lake_assets.definitions import build_definitions
from kafka_iceberg.lake_assets.vocabulary import table_key
from kafka_iceberg.lake_assets.worker import BUDGET_S, BUDGET_TAG, POOL_CHECK_S, at_most_every, run_budget_s, worker_job
from kafka_iceberg.lake_assets.worker_chores import CHECK_EVERY_S, Chore, ChoreEnv, WorkerChores
from kafka_iceberg.ops.rota import LAST_RUN_PROPERTY, MaintenanceRota, last_runs, next_tick_ms
from kafka_iceberg.resources import default_resources
from kafka_iceberg.schedules.spread import maintenance_crons
from kafka_iceberg.sensors.retention import all_tables_retention_sensor
from kafka_iceberg.sensors.workers import HANDOVER_S, OBSERVE_EVERY_S, handover_due, is_due, workers_sensor
from tests.helpers import event_records, make_spec

NO_ENV = ChoreEnv(spark=None, settings=None, catalog=None, slack=None)
"""The environment of chores whose reads a test replaces."""


def _rows(settings, spec) -> tuple[int, int]:
    table = load_catalog(settings.catalog).load_table(spec.identifier)
    sql = f"SELECT count(*), count(DISTINCT (_kafka_partition, _kafka_offset)) FROM {duck.scan_sql(table.metadata_location)}"
    return duck.connect().execute(sql).fetchone()


def _three_tables(kafka_config, unique, topic_factory, counts=(300, 120, 40)):
    """Three tables on topics of their own, the last one poisoned (a malformed record under
    ``bad_records.policy: fail``); returns their specs."""
    specs = []
    for i, n in enumerate(counts):
        topic = topic_factory(f"{unique}_{i}", partitions=2)
        produce(kafka_config, topic, event_records(range(n)))
        extra = {"bad_records": {"policy": "fail"}} if i == 2 else {}
        specs.append(make_spec(f"{unique}_{i}", topic, max_records_per_partition=40, **extra))
    produce(kafka_config, specs[2].topic, [(b"x", b"{not json", 1_700_000_000_000)])
    return specs


def test_the_order_is_by_waiting_time_and_fair():
    specs = [make_spec(f"t{i}", f"topic{i}") for i in range(3)]
    marks = {s.topic: {0: Watermarks(0, 10)} for s in specs}
    committed = {s.identifier: {} for s in specs}
    order, done = [], {s.identifier: 0 for s in specs}

    def run_batch(spec):
        order.append(spec.name)
        done[spec.identifier] = min(10, done[spec.identifier] + (10 if spec.name == "t0" else 5))
        return type("R", (), {"offsets": {0: done[spec.identifier]}, "snapshot_id": 1})()

    flushes = []

    def flush(final):
        flushes.append((final, len(order)))

    ports = WorkerPorts(run_batch, lambda topics: marks, flush=flush)
    served = Worker(specs, ports, committed, budget_s=60, idle_s=0).run()
    assert committed == {s.identifier: {} for s in specs}, "the caller's offsets are read, never changed"
    committed = {k: dict(v.offsets) for k, v in served.items()}
    # every table once per round, longest waiting first; t0 (one batch) drops out, t1 and t2 take a second turn
    assert order == ["t0", "t1", "t2", "t1", "t2"]
    # the group mirror is flushed between rounds and once, final, at the end
    assert [f for f, _ in flushes].count(True) == 1 and flushes[-1] == (True, 5)
    assert (False, 3) in flushes, flushes
    assert offset_lags(specs, {**marks, "topic1": None}, committed) == {"test.t0": 0, "test.t1": 0, "test.t2": 0}
    # a table whose topic is missing is tried once, so its error is reported, then set aside
    failed = []

    def gone(spec):
        raise RuntimeError(f"topic {spec.topic} does not exist")

    ports = WorkerPorts(gone, lambda topics: {t: None for t in topics}, on_failure=lambda s, e: failed.append(s.name))
    Worker([specs[0]], ports, budget_s=60, idle_s=0).run()
    assert failed == ["t0"]
    groups = assign_workers([make_spec(f"g{i}", "x") for i in range(10)], 3)
    assert sorted(len(g) for g in groups.values()) == [3, 3, 4]


def test_tables_one_poll_finds_waiting_go_by_their_last_micro_batch():
    """Tables a poll finds waiting together are served least recently served first, whatever their names, so
    the last tables in name order are not pushed back by every poll (docs/benchmark.md, goal 7)."""
    a, b, c = (make_spec(n, f"topic_{n}") for n in ("a", "b", "c"))
    units = units_of([a, b, c])
    states = {
        a.identifier: TableState(a, waiting_since=10.0, last_commit_s=9.0),
        b.identifier: TableState(b, waiting_since=10.0),  # never served
        c.identifier: TableState(c, waiting_since=10.0, last_commit_s=4.0),
    }
    assert [u[0].name for u in next_units(states, units)] == ["b", "c", "a"]
    states[a.identifier] = replace(states[a.identifier], waiting_since=8.0)
    assert [u[0].name for u in next_units(states, units)] == ["a", "b", "c"], "the longest waiting still first"


def _clocked_worker(specs, run_batch, marks, now: list, **options) -> Worker:
    """A ``Worker`` over ``specs`` on the fake clock ``now[0]`` (seconds; sleeping moves it on), with the
    watermarks ``marks`` (topic -> partition -> ``Watermarks``), nothing committed and callbacks that
    do nothing; ``options``: the rest of its fields."""
    ports = {k: options.pop(k) for k in ("chores", "paused", "hold", "flush", "working") if k in options}
    clock = Clock(now=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    return Worker(list(specs), WorkerPorts(run_batch, lambda topics: marks, **ports), clock=clock, **options)


def test_chores_run_while_idle_and_within_their_share_while_tables_wait():
    """A fake clock: each micro-batch takes 1 s and each chore 1 s. With a share of 0.25 a chore
    follows a micro-batch only while chores took at most a quarter of the run; idle time takes them all."""
    spec = make_spec("busy", "busy_topic")
    now, log = [0.0], []

    def run_batch(s):
        now[0] += 1
        log.append("batch")
        done = len([e for e in log if e == "batch"])
        return type("R", (), {"offsets": {0: min(done, 12)}, "snapshot_id": 1})()

    pending = [f"chore{i}" for i in range(6)]

    def chores(idle, busy):
        assert busy == frozenset(), "one thread: nothing else runs while a chore does"
        if not pending:
            return False
        now[0] += 1
        log.append(pending.pop(0))
        return True

    marks = {"busy_topic": {0: Watermarks(0, 12)}}
    worker = _clocked_worker([spec], run_batch, marks, now, budget_s=600, idle_s=1, chores=chores, chore_share=0.25)
    worker.run()
    busy = log[: len(log) - log[::-1].index("batch")]  # up to the last micro-batch
    chores_while_busy = [e for e in busy if e != "batch"]
    assert busy.count("batch") == 12 and 2 <= len(chores_while_busy) <= 4, log
    assert not pending, "the rest ran once no table had records waiting"
    assert log[0] == "batch" and worker.last_run.chore_s == 6


def test_a_paused_table_keeps_its_place_and_the_run_does_not_end_idle_while_it_waits():
    """A fake clock: table pa is paused (its compaction runs) until second 5; pb is served meanwhile,
    and with only pa's record left the run waits past ``idle_s`` for it instead of ending."""
    a, b = make_spec("pa", "pa_topic"), make_spec("pb", "pb_topic")
    now, order, done = [0.0], [], {a.identifier: 0, b.identifier: 0}

    def run_batch(s):
        now[0] += 1
        order.append((s.name, now[0]))
        done[s.identifier] += 1
        return type("R", (), {"offsets": {0: done[s.identifier]}, "snapshot_id": 1})()

    marks = {"pa_topic": {0: Watermarks(0, 1)}, "pb_topic": {0: Watermarks(0, 2)}}
    until_5 = frozenset({a.identifier})
    _clocked_worker(
        [a, b], run_batch, marks, now, budget_s=60, idle_s=1, paused=lambda: until_5 if now[0] < 5 else frozenset()
    ).run()
    assert order == [("pb", 1.0), ("pb", 2.0), ("pa", 6.0)]


def test_a_table_a_chore_pauses_during_a_round_is_not_started_in_that_round():
    """A fake clock: after qa's micro-batch a chore starts a background job on qb (paused until second 5),
    while qb still waits in the same round behind qa. qb's micro-batch does not start while it is
    paused; it keeps its place and runs once the job ends."""
    a, b, c = make_spec("qa", "qa_topic"), make_spec("qb", "qb_topic"), make_spec("qc", "qc_topic")
    now, order, done, paused, held = [0.0], [], {s.identifier: 0 for s in (a, b, c)}, [frozenset()], []

    def run_batch(s):
        if s.identifier in paused[0]:
            held.append(s.name)  # started while the chore's job held it (its commit would conflict)
        now[0] += 1
        order.append((s.name, now[0]))
        done[s.identifier] += 1
        return type("R", (), {"offsets": {0: done[s.identifier]}, "snapshot_id": 1})()

    def chores(idle, busy):
        if order == [("qa", 1.0)] and not paused[0]:
            paused[0] = frozenset({b.identifier})  # e.g. a compaction of upsert table qb, in the background
            return True
        return False

    def current():
        if now[0] >= 5:
            paused[0] = frozenset()
        return paused[0]

    marks = {s.topic: {0: Watermarks(0, 1)} for s in (a, b, c)}
    _clocked_worker([a, b, c], run_batch, marks, now, budget_s=60, idle_s=1, chores=chores, paused=current).run()
    assert held == [] and [name for name, _ in order] == ["qa", "qc", "qb"] and order[-1][1] > 5, (held, order)


def test_with_two_threads_two_tables_commit_at_once_and_one_table_never_twice():
    """Four tables with records waiting and ``threads=2``: two micro-batches run at once (each waits until
    the other has started), a table never has two, and the callbacks and chores run in the calling thread
    with the in-flight table as ``busy``."""
    import threading

    specs = [make_spec(f"p{i}", f"ptopic{i}") for i in range(4)]
    marks = {s.topic: {0: Watermarks(0, 20)} for s in specs}
    committed = {s.identifier: {} for s in specs}
    lock, in_flight, most, both = threading.Lock(), set(), [0], threading.Barrier(2, timeout=10)
    main, callbacks, busy_seen, offsets = threading.current_thread(), [], [], {}

    def run_batch(spec):
        with lock:
            assert spec.identifier not in in_flight, "one table's micro-batches never overlap"
            in_flight.add(spec.identifier)
            most[0] = max(most[0], len(in_flight))
        if spec.identifier not in offsets and spec.name in ("p0", "p1"):
            both.wait()  # p0 and p1 start together: the second starts while the first runs
        with lock:
            offsets[spec.identifier] = offsets.get(spec.identifier, 0) + 10
            in_flight.discard(spec.identifier)
            return type("R", (), {"offsets": {0: offsets[spec.identifier]}, "snapshot_id": 1})()

    def chores(idle, busy):
        busy_seen.append(busy)
        callbacks.append(threading.current_thread())
        return False

    ports = WorkerPorts(
        run_batch,
        lambda topics: {t: marks[t] for t in topics},
        on_commit=lambda s, r: callbacks.append(threading.current_thread()),
        on_failure=lambda s, e: callbacks.append(threading.current_thread()),
        chores=chores,
    )
    served = Worker(specs, ports, committed, budget_s=60, idle_s=0, threads=2).run()
    assert most[0] == 2, "two micro-batches ran at once"
    assert all(len(v.results) == 2 for v in served.values()), {k: len(v.results) for k, v in served.items()}
    assert {k: v.offsets for k, v in served.items()} == {s.identifier: {0: 20} for s in specs}
    assert set(callbacks) == {main}, "callbacks and chores run in the calling thread"
    assert any(busy_seen), "a chore after one micro-batch sees those still running as busy"


def test_with_two_threads_the_next_table_starts_before_a_finished_one_is_reported():
    """``threads=2``: when one micro-batch finishes, the next table's starts before ``on_commit`` reports the
    finished one (in the worker a write to the Dagster instance), so the report overlaps the reads."""
    import threading

    specs = [make_spec(f"q{i}", f"qtopic{i}") for i in range(3)]
    marks = {s.topic: {0: Watermarks(0, 10)} for s in specs}
    committed = {s.identifier: {} for s in specs}
    started = {s.identifier: threading.Event() for s in specs}
    third = started[specs[2].identifier]
    reported = {}

    def run_batch(spec):
        started[spec.identifier].set()
        if spec is specs[1]:
            third.wait(10)  # q1 runs on until q2 has started
        return type("R", (), {"offsets": {0: 10}, "snapshot_id": 1})()

    def on_commit(spec, _result):
        reported[spec.identifier] = third.wait(5) if spec is specs[0] else None

    ports = WorkerPorts(run_batch, lambda topics: {t: marks[t] for t in topics}, on_commit=on_commit)
    served = Worker(specs, ports, committed, budget_s=0, threads=2).run()
    assert reported[specs[0].identifier] is True, "q2 started before q0's commit was reported"
    assert all(len(v.results) == 1 for v in served.values())
    assert {k: v.offsets for k, v in served.items()} == {s.identifier: {0: 10} for s in specs}


def test_a_check_waits_while_tables_have_records_waiting_until_it_is_overdue():
    """While some table has records waiting a pending check does not start, until it has been pending
    for ``CHECK_EVERY_S``; while idle it starts at once. Maintenance of a busy table waits."""
    spec = make_spec("c0", "topic_c0")
    now = [1000.0]
    started = []

    class Recording(WorkerChores):
        def _start_check(self, identifier):
            started.append(identifier)
            self.tables[identifier] = replace(self.tables[identifier], pending_since=None)

    clock = Clock(now=lambda: now[0])
    chores = Recording(SimpleNamespace(run_id="r"), [spec], MaintenanceRota({}), NO_ENV, clock)
    chores.committed(spec)
    now[0] += CHECK_EVERY_S - 1
    chores.committed(spec)  # a later commit does not postpone it
    assert chores(idle=False) is False and started == []
    now[0] += 1
    assert chores(idle=False) is True and started == [spec.identifier], "overdue: it starts while busy"
    chores.committed(spec)
    now[0] += CHECK_EVERY_S
    assert chores(idle=True) is True and started == [spec.identifier] * 2, "idle: it starts at once"
    rota = MaintenanceRota({"n.a": {"compact": "0 * * * *"}}, {("n.a", "compact"): 0})
    assert rota.next_due(61 * 60_000, skip={"n.a"}) is None and rota.next_due(61 * 60_000) == ("n.a", "compact")


def test_past_its_budget_a_worker_serves_on_while_its_successor_starts_within_the_grace():
    """A fake clock: each micro-batch takes 1 s and records always wait. Past the 10 s budget the run keeps
    serving while ``hold()`` says a successor is on its way, until the successor is ready (the hold ends)
    or the grace runs out; without a hold it stops at the budget."""
    spec = make_spec("busy", "busy_topic")

    def serve(hold, grace_s):
        now, batches = [0.0], []

        def run_batch(s):
            now[0] += 1
            batches.append(now[0])
            return type("R", (), {"offsets": {0: len(batches)}, "snapshot_id": 1})()

        marks = {"busy_topic": {0: Watermarks(0, 10**6)}}
        _clocked_worker(
            [spec], run_batch, marks, now, budget_s=10, idle_s=1, hold=lambda: hold(now[0]), grace_s=grace_s
        ).run()
        return batches[-1]

    assert serve(lambda t: False, 120) == 10, "no successor on its way: stops at the budget"
    assert serve(lambda t: t < 25, 120) == 25, "serves until the successor is ready"
    assert serve(lambda t: True, 30) == 40, "a successor that never gets ready: the grace bounds the run"


def test_the_pool_is_looked_at_once_per_pool_check_at_most():
    """The worker asks Dagster whether another run waits for its pool at most once per POOL_CHECK_S."""
    now, asked = [0.0], []
    waiting = at_most_every(POOL_CHECK_S, lambda: asked.append(now[0]) or len(asked) > 2, clock=lambda: now[0])
    answers = []
    for t in (0.0, 0.3, 0.9, 1.0, 1.5, 2.2, 2.4):
        now[0] = t * POOL_CHECK_S
        answers.append(waiting())
    assert asked == [0.0, 1.0 * POOL_CHECK_S, 2.2 * POOL_CHECK_S]
    assert answers == [False, False, False, False, False, True, True]


def test_a_successor_is_launched_only_near_the_end_of_the_budget():
    """The sensor starts a worker's next run HANDOVER_S before the budget of its one started run ends."""
    start, budget = 1_000.0, 300.0
    assert handover_due([start], budget, start + budget - HANDOVER_S)
    assert not handover_due([start], budget, start + budget - HANDOVER_S - 1)
    assert not handover_due([None], budget, 10**9), "a queued or starting run is no predecessor"
    assert not handover_due([start, start + 260], budget, 10**9), "its successor is already there"
    assert not handover_due([start], 0, 10**9), "a run of one round ends by itself"


def test_the_rota_finds_the_oldest_missed_tick_and_reads_last_runs_from_properties():
    minute = 60_000
    assert next_tick_ms("*/15 * * * *", 16 * minute + 5) == 30 * minute
    assert next_tick_ms("*/15 * * * *", 15 * minute) == 30 * minute  # strictly after
    assert last_runs({LAST_RUN_PROPERTY.format(kind="compact"): "123"}, 7) == {
        "compact": 123,
        "expire_snapshots": 7,
        "remove_orphan_files": 7,
        "full_check": 7,
    }
    assert last_runs({}, None)["compact"] is None
    crons = {"n.a": {"compact": "0 * * * *", "expire_snapshots": "30 * * * *"}, "n.b": {"compact": "10 * * * *"}}
    rota = MaintenanceRota(crons, {("n.a", "compact"): 0, ("n.a", "expire_snapshots"): 0, ("n.b", "compact"): None})
    assert rota.next_due(29 * minute) is None  # no tick after 0 yet (n.b never snapshotted)
    assert rota.next_due(61 * minute) == ("n.a", "expire_snapshots")  # its tick 30 is older than compact's 60
    assert rota.next_due(61 * minute, held={"expire_snapshots"}) == ("n.a", "compact"), "a held job waits alone"
    rota.mark("n.a", "expire_snapshots", 61 * minute)
    assert rota.next_due(61 * minute) == ("n.a", "compact")
    rota.mark("n.a", "compact", 61 * minute)
    assert rota.next_due(89 * minute) is None and rota.next_due(90 * minute) == ("n.a", "expire_snapshots")


def test_a_failing_check_chore_is_logged_and_alerted_and_the_worker_goes_on():
    """A chore must not raise: a check whose catalog is unreachable is logged and alerted, and the
    next chore call finds nothing pending."""
    from types import SimpleNamespace

    spec = make_spec("c1", "topic_c1")
    logged, sent = [], []

    class Unreachable:
        name = "lake"

        def load_table(self, identifier):
            raise ConnectionError("catalog down")

    context = SimpleNamespace(log=SimpleNamespace(error=logged.append), run_id="run-1")
    slack = SimpleNamespace(sink=lambda: SimpleNamespace(send=sent.append))
    env = ChoreEnv(None, None, Unreachable(), slack)
    chores = WorkerChores(context, [spec], MaintenanceRota({}), env)
    chores.committed(spec)
    assert chores() is True, "the check started"
    chores.finish()  # waits for it
    assert chores() is False
    assert "catalog down" in logged[0] and [a.measure for a in sent] == ["duplicate_free"]
    chores.committed(spec)
    assert chores() is False, f"a failed check is tried again after {CHECK_EVERY_S} s, not at every commit"


def test_a_check_reads_in_the_background_while_the_worker_goes_on():
    """A check chore returns at once; its evaluation is logged by the first chore call after it
    ends, and the next check of the table starts from the snapshot it covered."""
    import threading
    from types import SimpleNamespace

    spec = make_spec("c2", "topic_c2")
    release, calls, reported = threading.Event(), [], []

    class SlowChores(WorkerChores):
        def evaluate(self, spec, after, run_id):
            calls.append((after, run_id))
            assert release.wait(10), "the check was awaited instead of running in the background"
            return 42, "outcome"

        def report(self, spec, outcome):
            reported.append((spec.identifier, outcome))

    context = SimpleNamespace(run_id="run-2")
    chores = SlowChores(context, [spec], MaintenanceRota({}), NO_ENV)
    chores.committed(spec)
    assert chores() is True and chores() is False and reported == [], "the check runs on; nothing logged yet"
    release.set()
    chores.running.future.result(timeout=10)
    assert chores() is False and reported == [(spec.identifier, "outcome")]
    chores.committed(spec)
    assert chores.pending() == {spec.identifier: 42}, "the next check reads after the snapshot this one covered"
    chores.finish()
    assert calls == [(None, "run-2"), (42, "run-2")]


def test_the_serving_op_does_not_wait_for_a_running_check_at_its_end():
    """``pending()`` (the serving op's end, in the pool) returns at once while a check runs: its table
    is pending again from the snapshot that check started after, for the ``check`` op outside the pool."""
    import threading
    from types import SimpleNamespace

    spec = make_spec("c3", "topic_c3")
    release, reported = threading.Event(), []

    class SlowChores(WorkerChores):
        def evaluate(self, spec, after, run_id):
            assert release.wait(10)
            return 7, "outcome"

        def report(self, spec, outcome):
            reported.append(outcome)

    chores = SlowChores(SimpleNamespace(run_id="run-3"), [spec], MaintenanceRota({}), NO_ENV)
    chores.committed(spec)
    assert chores() is True
    assert chores.pending() == {spec.identifier: None}, "not awaited: pending again, from where it started"
    assert not release.is_set() and reported == []
    release.set()


def test_one_worker_serves_three_tables_and_a_poisoned_one_fails_alone(
    settings, spark, kafka, catalog, kafka_config, unique, topic_factory
):
    specs = _three_tables(kafka_config, unique, topic_factory)
    commits, failures = [], []
    ports = WorkerPorts(
        lambda spec: run_micro_batch(spark, settings, spec, commit_id=f"worker-{unique}", kafka=kafka, catalog=catalog),
        kafka.watermarks_many,
        on_commit=lambda spec, result: commits.append((spec.name, result.records)),
        on_failure=lambda spec, error: failures.append((spec.name, type(error).__name__)),
    )
    worker = Worker(
        specs,
        ports,
        budget_s=1800,  # ends when no table has records waiting (idle_s 0); the budget only bounds a hang
        idle_s=0,
    )
    served = worker.run()
    assert [name for name, _ in failures] == [specs[2].name]
    assert served[specs[2].identifier].error is not None
    assert _rows(settings, specs[0]) == (300, 300) and _rows(settings, specs[1]) == (120, 120)
    # fair: the small table finished while the big one still had micro-batches to go
    names = [name for name, _ in commits]
    assert names.index(specs[1].name) < len(names) - 1 and names.count(specs[0].name) >= 4
    # a successor's warm-up checks the tables that exist and commits nothing; a missing one is left to its micro-batch
    absent = make_spec(f"{unique}_absent", specs[0].topic)
    heads = {s.identifier: catalog.load_table(s.identifier).metadata.current_snapshot_id for s in specs}
    done = warm_up(connect(spark, settings, kafka, catalog), [*specs, absent])
    assert done == {**{s.identifier: "warm" for s in specs}, absent.identifier: "missing"}
    assert heads == {s.identifier: catalog.load_table(s.identifier).metadata.current_snapshot_id for s in specs}
    assert not catalog.table_exists(absent.identifier)


def test_the_worker_job_materializes_each_table_and_the_sensor_launches_it(
    settings, kafka, kafka_config, unique, topic_factory
):
    specs = _three_tables(kafka_config, unique, topic_factory, counts=(90, 30, 10))
    instance = DagsterInstance.ephemeral()
    resources = default_resources(settings)
    job = worker_job(0, specs, sqlite_catalog=True, crons=maintenance_crons(specs))  # as the location gives it

    sensor = workers_sensor({0: specs}, [job])
    with build_sensor_context(instance=instance, resources=resources) as context:
        result = sensor(context)
    assert [r.job_name for r in result.run_requests] == ["lake_worker_0"]
    assert {e.asset_key for e in result.asset_events} == {table_key(s) for s in specs}
    assert {e.asset_key: e.metadata["offset_lag"].value for e in result.asset_events}[table_key(specs[0])] == 90
    with build_sensor_context(instance=instance, resources=resources, cursor=result.cursor) as context:
        again = sensor(context)
    assert again.asset_events == [], f"observed again within {OBSERVE_EVERY_S} s"
    assert [r.job_name for r in again.run_requests] == ["lake_worker_0"], "still due: the worker has no run"

    # a sensor-launched run with a short-run tag: serves until no table has records waiting (idle time 0)
    tags = {"dagster/sensor_name": "lake_workers", BUDGET_TAG: "1800"}
    run = job.execute_in_process(instance=instance, resources=resources, raise_on_error=False, tags=tags)
    assert not run.success, "the poisoned table fails the run, after the others committed"
    assert instance.get_run_by_id(run.run_id).tags["dagster/max_retries"] == "0", "the sensor replaces a dead worker"
    commits = {s.name: len(instance.fetch_materializations(table_key(s), limit=100).records) for s in specs}
    assert commits[specs[0].name] >= 2 and commits[specs[1].name] >= 1 and commits[specs[2].name] == 0, commits
    latest = instance.get_latest_materialization_event(table_key(specs[0])).asset_materialization
    assert latest.metadata["lag_after_commit"].value == 0 and latest.metadata["snapshot_id"].value != "none"
    assert _rows(settings, specs[0]) == (90, 90) and _rows(settings, specs[1]) == (30, 30)
    pycatalog = load_catalog(settings.catalog)
    for spec in specs[:2]:  # the deferred group mirror is flushed when the run stops serving
        assert kafka.group_offsets(spec.consumer_group, spec.topic) == read_state(pycatalog, spec.identifier).offsets
    assert is_due(specs[0], 1, None, 0) and not is_due(specs[0], 0, None, 0)
    checked = {
        e.dagster_event.event_specific_data.asset_key: e.dagster_event.event_specific_data.passed
        for e in instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    }
    assert checked == {table_key(specs[0]): True, table_key(specs[1]): True}, "one duplicate_free per committed table"

    # compaction of the first table is overdue (last run at 1 ms since epoch): the next worker run compacts it
    compact = LAST_RUN_PROPERTY.format(kind="compact")
    load_catalog(settings.catalog).load_table(specs[0].identifier).transaction().set_properties(
        **{compact: "1"}
    ).commit_transaction()
    produce(kafka_config, specs[0].topic, event_records(range(90, 120)))
    job.execute_in_process(instance=instance, resources=resources, raise_on_error=False)
    observed = [
        r.asset_observation.metadata for r in instance.fetch_observations(table_key(specs[0]), limit=20).records
    ]
    compactions = [m for m in observed if "procedure" in m and m["procedure"].value == "rewrite_data_files"]
    assert len(compactions) == 1, observed
    assert (
        compactions[0]["data_files_after"].value <= compactions[0]["data_files_before"].value
    )  # 3 files a day: under min-input-files
    assert int(load_catalog(settings.catalog).load_table(specs[0].identifier).properties[compact]) > 1
    assert _rows(settings, specs[0]) == (120, 120)

    with build_sensor_context(instance=instance, resources=resources) as context:
        observed = all_tables_retention_sensor(specs)(context)
    assert {e.asset_key for e in observed.asset_events} >= {table_key(s) for s in specs}


def test_workers_serve_every_table_by_default_and_their_sensors_run_unclicked(lake_env):
    from dagster import DefaultSensorStatus

    specs = [make_spec(f"w{i}", f"topic{i}") for i in range(5)]
    defs = build_definitions(load_settings(env=lake_env), specs)  # no LAKE_WORKERS, a SQLite catalog: one worker
    sensors = {s.name: s for s in defs.sensors}
    assert set(sensors) == {"lake_workers", "lake_retention", "run_failure_alert_sensor", "run_liveness"}, set(sensors)
    assert all(s.default_status == DefaultSensorStatus.RUNNING for s in sensors.values())
    workers = {j.name for j in defs.jobs if j.name.startswith("lake_worker_")}
    assert workers == {"lake_worker_0"}
    # the workers do the maintenance and the full-scan checks: no schedule
    assert list(defs.schedules) == []
    two = build_definitions(load_settings(env={**lake_env, "LAKE_WORKERS": "2"}), specs)
    assert {"lake_worker_0", "lake_worker_1"} <= {j.name for j in two.jobs}


def test_the_worker_count_follows_the_catalog_the_cores_and_the_tables():
    assert worker_count(100, sqlite_catalog=True, cores=16) == 1, "SQLite admits one committing process"
    assert worker_count(100, sqlite_catalog=False, cores=2) == 2
    assert worker_count(3, sqlite_catalog=False, cores=16) == 3, "never more workers than tables"
    assert worker_count(100, sqlite_catalog=False, cores=64) == MAX_DEFAULT_WORKERS, "a JVM each: memory bounds them"
    assert worker_count(0, sqlite_catalog=False, cores=None) == 1
    assert worker_count(100, sqlite_catalog=True, cores=2, override=3) == 3, "LAKE_WORKERS wins"


def test_only_sensor_runs_outside_backfills_keep_serving():
    assert run_budget_s({"dagster/sensor_name": "lake_workers"}) == BUDGET_S
    assert run_budget_s({"dagster/sensor_name": "lake_workers", BUDGET_TAG: "30"}) == 30.0
    assert run_budget_s({"dagster/sensor_name": "lake_workers", "dagster/backfill": "abc"}) == 0.0
    assert run_budget_s({}) == 0.0, "a run launched by hand or by a job serves one round"


def test_the_check_op_lowers_the_priority_of_its_process_tree(tmp_path):
    # in a process of its own: nobody may lower a nice value again, and pytest must keep its priority
    script = """
import os, subprocess, sys, threading, time
from kafka_iceberg.ops.niceness import lower_cpu_priority
code = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); print('ready', flush=True); time.sleep(30)"
child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"  # its second thread runs
threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
changed = lower_cpu_priority(10)
late = threading.Thread(target=lambda: print("late", os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
late.start(); late.join()
tids = [int(t) for pid in (os.getpid(), child.pid) for t in os.listdir(f"/proc/{pid}/task")]
def nice(t):
    try:
        return os.getpriority(os.PRIO_PROCESS, t)
    except ProcessLookupError:  # a thread that ended after the listing (the joined one may linger there)
        return None
nices = {t: nice(t) for t in tids}
tids = [t for t in tids if nices[t] is not None]
print("changed", changed, "nice", sorted({nices[t] for t in tids}), "threads", len(tids))
print("again", lower_cpu_priority(10))
child.kill()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True).stdout
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    assert lines["late"] == "10", "a thread started later inherits the nice value"
    changed, rest = lines["changed"].split(" nice ")
    nice, threads = rest.split(" threads ")
    # every thread of both processes (one started since inherits it), and at least the four started before
    assert nice == "[10]" and int(threads) >= int(changed) >= 4, out
    assert lines["again"] == "0", "only threads below the nice value are changed"
    assert os.getpriority(os.PRIO_PROCESS, 0) < 10, "the test process itself is untouched"


def test_an_upsert_table_is_paused_while_it_is_compacted_in_the_background():
    """Its micro-batch publishes by fast-forward, which a compaction's commit would refuse (the table
    would be set aside); an append table rebases onto the compaction and keeps committing."""
    append, upsert = make_spec("ap", "ap_topic"), make_spec("up", "up_topic", mode="upsert", key=["id"], cdc="none")
    chores = WorkerChores(SimpleNamespace(run_id="r"), [append, upsert], MaintenanceRota({}), NO_ENV)
    running = Future()
    chores.running = Chore(upsert.identifier, 0.0, None, running, "compact")
    assert chores.paused() == frozenset({upsert.identifier})
    chores.running = Chore(upsert.identifier, 0.0, None, running, "expire_snapshots")
    assert chores.paused() == frozenset(), "an expiry does not move main"
    chores.running = Chore(append.identifier, 0.0, None, running, "compact")
    assert chores.paused() == frozenset()
    running.set_result(None)
    chores.running = Chore(upsert.identifier, 0.0, None, running, "compact")
    assert chores.paused() == frozenset(), "the compaction ended"


def test_the_group_mirror_commits_the_latest_offsets_of_each_group_when_due_and_all_at_the_end(
    kafka, kafka_config, unique, topic_factory
):
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(40)))
    now = [0.0]
    mirror = GroupMirror(kafka, 10, clock=lambda: now[0])
    a, b = f"lake.{unique}.a", f"lake.{unique}.b"
    mirror.note("t.a", a, topic, {0: 3, 1: 2})
    mirror.note("t.a", a, topic, {0: 5, 1: 4})
    mirror.note("t.b", b, topic, {0: 7})
    mirror.note("t.c", None, topic, {0: 1})  # a table without a group has nothing to mirror
    assert mirror.flush() == {} and mirror.pending == 2
    assert kafka.group_offsets(a, topic) == {}, "not due yet: nothing committed"
    now[0] = 10.0
    assert mirror.flush() == {} and mirror.pending == 0
    assert kafka.group_offsets(a, topic) == {0: 5, 1: 4} and kafka.group_offsets(b, topic) == {0: 7}
    mirror.note("t.a", a, topic, {0: 9, 1: 8})
    now[0] = 15.0
    mirror.flush()
    assert kafka.group_offsets(a, topic) == {0: 5, 1: 4}
    mirror.flush(final=True)
    assert kafka.group_offsets(a, topic) == {0: 9, 1: 8}


def _queued(instance, job_def, starting: bool = False) -> object:
    """A run of ``job_def`` queued as Dagster's QueuedRunCoordinator queues it (the enqueue event; a queued
    run needs a code location origin, here one in process); with ``starting``, then dequeued and launched."""
    from dagster import DagsterEvent
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    location = InProcessCodeLocationOrigin(LoadableTargetOrigin(python_file=__file__))
    origin = RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job_def.name)
    run = instance.create_run_for_job(job_def, remote_job_origin=origin)
    instance.report_dagster_event(DagsterEvent.job_enqueue(run), run_id=run.run_id)
    if starting:
        launched = DagsterEvent(event_type_value=DagsterEventType.RUN_STARTING.value, job_name=run.job_name)
        instance.report_dagster_event(launched, run_id=run.run_id)  # as instance.launch_run reports it
    return instance.get_run_by_id(run.run_id)


def test_the_worker_hands_over_to_a_run_the_run_queue_holds_back_for_its_pool(lake_env):
    """On a SQLite catalog a table's micro-batch run (a backfill's, the UI's) needs the worker's pool. Dagster's
    run queue does not start it while the worker holds the slot, so it never waits inside the pool; the worker
    hands over to it all the same. A queued worker run (its ``warm`` op is outside the pool) is no reason."""
    from dagster import instance_for_test
    from dagster._core.op_concurrency_limits_counter import GlobalOpConcurrencyLimitsCounter

    from kafka_iceberg.lake_assets.dagster_internals import held_back_for_pool
    from kafka_iceberg.lake_assets.vocabulary import SQLITE_POOL
    from kafka_iceberg.lake_assets.worker import pool_waiting

    spec = make_spec("handover", "handover_topic")
    defs = build_definitions(load_settings(env=lake_env), [spec])  # SQLite catalog: one worker, one pool
    with instance_for_test(overrides={"concurrency": {"pools": {"default_limit": 1}}}) as instance:
        storage = instance.event_log_storage
        storage.initialize_concurrency_limit_to_default(SQLITE_POOL)
        worker = SimpleNamespace(instance=instance, run_id="the-serving-worker-run")
        assert storage.claim_concurrency_slot(SQLITE_POOL, worker.run_id, "serve").is_claimed
        assert not pool_waiting(worker, SQLITE_POOL), "nothing queued, nothing pending"

        successor = _queued(instance, defs.resolve_job_def("lake_worker_0"))
        assert not pool_waiting(worker, SQLITE_POOL), "a queued worker run starts outside the pool"
        micro_batch = _queued(instance, defs.resolve_implicit_job_def_def_for_assets([table_key(spec)]))
        assert pool_waiting(worker, SQLITE_POOL)
        assert not pool_waiting(worker, "lake/table/another"), "held back for another pool"
        zombie = _queued(instance, defs.resolve_implicit_job_def_def_for_assets([table_key(spec)]), starting=True)
        assert zombie.status == DagsterRunStatus.STARTING
        assert not pool_waiting(worker, SQLITE_POOL), "a STARTING run holds the queue back, not the worker"
        instance.report_run_failed(zombie, "its worker died")  # what run monitoring does
        assert pool_waiting(worker, SQLITE_POOL)

        # the judgement is Dagster's: its run queue holds back the micro-batch run, not the worker run
        queued = [successor, micro_batch]
        counter = GlobalOpConcurrencyLimitsCounter(
            instance, queued, [], concurrency_keys=storage.get_concurrency_keys(), pool_limits=storage.get_pool_limits()
        )
        assert [counter.is_blocked(r) for r in queued] == [held_back_for_pool(r, SQLITE_POOL) for r in queued]
        assert [held_back_for_pool(r, SQLITE_POOL) for r in queued] == [False, True]
