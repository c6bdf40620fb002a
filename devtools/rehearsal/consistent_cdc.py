"""Rehearsal scenario ``consistent_cdc``: transaction-consistent CDC across tables
(docs/cdc.md#consistency-groups) while the worker serving the group is SIGKILLed again and again.

- Source: a private PostgreSQL (:func:`devtools.services.cdc_source.start_database`) holding the shop of
  :mod:`devtools.rehearsal.shop` (orders, order_lines, stock, moves, customers), captured by real
  Debezium 3.6.3 with ``provide.transaction.metadata`` on, one topic per table
  (``<slot>.public.<table>``, 2 partitions) plus ``<slot>.transaction``.
- Workload: :class:`devtools.rehearsal.shop.ShopWorkload`, transactions that keep invariants spanning
  tables (an order's total equals the sum of its lines; stock moved between warehouses is conserved and
  matches the moves ledger).
- Sink: the five tables declared as one consistency group (``mode: upsert``, ``cdc: debezium``), served
  by a worker process (:class:`kafka_iceberg.batch.worker.Worker` with the ``run_group`` port,
  :func:`kafka_iceberg.batch.group_batch.run_group_micro_batch`), SIGKILLed as a process group at random
  moments ``kills`` times (every other one 30-240 s after it started, the others 0-30 s after its first
  group commit); a fresh worker picks up after each kill.
- Reader: :class:`devtools.rehearsal.shop.InvariantReader` checks both invariants at every consistent
  position of the group it sees (must never break) and on the tables read one by one at their current
  snapshots (may break: that shows the check can fail).
- End: a marker row awaited in its topic, Debezium stopped, a last worker catches up, and every table is
  compared with PostgreSQL, ``EXCEPT ALL`` both ways.

``python -m devtools.rehearsal.consistent_cdc worker DECLARATIONS COMMIT_PREFIX IDLE_S`` is the worker
process; it prints one JSON line per table commit (table, offset ranges, commit time in ms since epoch).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

from devtools import duck
from devtools.demo.data import create_topic
from devtools.rehearsal import shop
from devtools.rehearsal.cdc import cdc_declaration
from devtools.rehearsal.run import Lake, Rehearsal, ScenarioResult, Tally, kill_group, kills_or
from devtools.services import cdc_source
from kafka_iceberg.config.settings import CHECKOUT

PARTITIONS = 2


def declaration(uid: str, slot: str, table: str, group: str | None, bound: int = 10_000) -> dict:
    """A tables.yaml-style declaration of the shop table ``table`` as ``rehearsal.cc_<uid>_<table>``
    (in consistency group ``group``, or alone when None) on Debezium's topic ``<slot>.public.<table>``."""
    topic = f"{slot}.public.{table}"
    decl = cdc_declaration(f"cc_{uid}_{table}", topic, bound, shop.iceberg_schema(table), shop.TABLES[table][0])
    if group:
        decl["consistency_group"] = group
    return decl


def _worker_main(declarations: str, commit_prefix: str, idle_s: float) -> int:
    """Serve the tables of ``declarations`` (a JSON list; a consistency group's members as one unit) until
    killed or idle ``idle_s`` seconds; one JSON line per table commit on stdout."""
    from kafka_iceberg.batch.group_batch import run_group_micro_batch
    from kafka_iceberg.batch.pipeline import run_micro_batch
    from kafka_iceberg.batch.worker import Worker, WorkerPorts
    from kafka_iceberg.catalog.spark import get_spark
    from kafka_iceberg.catalog.tables import load_catalog, read_state
    from kafka_iceberg.config.settings import load_settings
    from kafka_iceberg.declaration.spec import parse_table_spec
    from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata

    settings = load_settings()
    specs = [parse_table_spec(d) for d in json.loads(declarations)]
    spark, catalog = get_spark(settings), load_catalog(settings.catalog)
    kafka = KafkaMetadata(KafkaConfig.from_settings(settings))
    clients = dict(commit_id=commit_prefix, kafka=kafka, catalog=catalog)

    def on_commit(spec, r) -> None:
        if r.committed:
            ranges = {str(p): list(v) for p, v in r.ranges.items()}
            print(json.dumps({"table": spec.identifier, "ranges": ranges, "t_ms": int(time.time() * 1000)}), flush=True)

    ports = WorkerPorts(
        lambda spec: run_micro_batch(spark, settings, spec, **clients),
        kafka.watermarks_many,
        on_commit=on_commit,
        on_failure=lambda spec, e: print(json.dumps({"table": spec.identifier, "error": str(e)[:500]}), flush=True),
        run_group=lambda group: run_group_micro_batch(spark, settings, group, **clients),
    )
    committed = {s.identifier: read_state(catalog, s.identifier).offsets for s in specs}
    states = Worker(specs, ports, committed, budget_s=3600, idle_s=idle_s).run()
    return 1 if any(s.error is not None for s in states.values()) else 0


def start_worker(lake: Lake, declarations: str, log: Path, idle_s: float = 3600) -> subprocess.Popen:
    """A worker process serving ``declarations`` in its own process group, its output appended to ``log``."""
    out = log.open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "devtools.rehearsal.consistent_cdc", "worker", declarations,
         f"cc-{uuid.uuid4().hex[:8]}", str(idle_s)],
        env=lake.env(),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=str(CHECKOUT),
    )  # fmt: skip


def compare_table(db, table: str, metadata_location: str) -> tuple[int, int, int, int]:
    """(rows in PostgreSQL, rows in Iceberg, rows only in Iceberg, rows only in PostgreSQL) of one shop
    table: psql's rows cast to the declared types, EXCEPT ALL both ways against DuckDB's scan."""
    import pandas as pd

    _, cols = shop.TABLES[table]
    names = [c for c, _, _ in cols]
    pg = pd.DataFrame(cdc_source.table_rows(db, table, names), columns=names, dtype=object)
    con = duck.connect()
    con.register("pg_text", pg)
    typed = ", ".join(f"CAST({c} AS BIGINT) AS {c}" for c in names)
    con.execute(f"CREATE TABLE pg AS SELECT {typed} FROM pg_text")
    ice = f"(SELECT {typed} FROM {duck.scan_sql(metadata_location)})"
    in_ice = con.execute(f"SELECT count(*) FROM {ice}").fetchone()[0]
    only_ice = con.execute(f"SELECT count(*) FROM ({ice} EXCEPT ALL SELECT * FROM pg)").fetchone()[0]
    only_pg = con.execute(f"SELECT count(*) FROM (SELECT * FROM pg EXCEPT ALL {ice})").fetchone()[0]
    return len(pg), in_ice, only_ice, only_pg


def wait_for_marker(bootstrap: str, topic: str, key_id: int, timeout_s: float) -> None:
    """Wait until a change event keyed ``{"id": key_id}`` is in ``topic`` (Debezium delivered every earlier change).

    Raises:
        RuntimeError: not there within ``timeout_s`` seconds.
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"cc-{time.time_ns()}", "enable.auto.commit": False}
    )
    deadline = time.monotonic() + timeout_s
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        while time.monotonic() < deadline:
            for m in consumer.consume(500, 1.0):
                if not m.error() and m.key() and json.loads(m.key()).get("id") == key_id:
                    time.sleep(2.0)  # the rest of Debezium's batch, flushed together
                    return
    finally:
        consumer.close()
    raise RuntimeError(f"marker {key_id} not in {topic} within {timeout_s:.0f} s")


class Source:
    """The scenario's PostgreSQL, topics and Debezium capture (``slot`` is the topic prefix)."""

    def __init__(self, r: Rehearsal, uid: str):
        self.slot = f"cc_{uid}"
        for table in shop.TABLES:
            create_topic(r.lake.kafka_config, f"{self.slot}.public.{table}", PARTITIONS, {"retention.ms": "-1"})
        create_topic(r.lake.kafka_config, f"{self.slot}.transaction", 1, {"retention.ms": "-1"})
        self.db = cdc_source.start_database(r.lake.home / f"pg-{self.slot}")  # the next rehearsal stops a leftover
        self.capture = None
        try:
            cdc_source.run_sql(self.db, shop.ddl())
            self.capture = cdc_source.start_capture(
                self.db, r.lake.bootstrap, None, [f"public.{t}" for t in shop.TABLES],
                r.lake.home / f"debezium-{uid}", slot=self.slot, transactions=True,
            )  # fmt: skip
            cdc_source.run_sql(self.db, shop.initial_rows_sql())
        except BaseException:
            self.stop()
            raise

    def finish(self, bootstrap: str) -> None:
        """Insert a marker customer, await it in its topic, stop Debezium."""
        cdc_source.run_sql(self.db, "INSERT INTO customers VALUES (-1, 0);")
        wait_for_marker(bootstrap, f"{self.slot}.public.customers", -1, timeout_s=600)
        self.capture.stop()

    def stop(self) -> None:
        if self.capture is not None:
            self.capture.stop()
        self.db.stop()


KILLS = 12
"""SIGKILLs of the group's worker without ``--kills``: half early in a run, half after its first group commit."""
KILL_DEFAULTS = {"consistent_cdc": KILLS}
"""This module's kill scenario and its default, for ``make rehearse --help``."""


def consistent_cdc(r: Rehearsal, kills: int = KILLS, pause_s: float = 3.0, lifetime_s=(30.0, 240.0)) -> ScenarioResult:
    """The scenario (see the module docstring): ``kills`` SIGKILLs of the group's worker, while the workload
    runs one round every ``pause_s`` seconds: the 1st, 3rd, ... a random ``lifetime_s`` seconds after the
    worker started (its Spark session, recovery, planning, the members' attempt writes or the group commit),
    the 2nd, 4th, ... 0-30 s after its first group commit (up to 900 s to get there)."""
    from kafka_iceberg.catalog.tables import load_table

    t0, uid = time.monotonic(), uuid.uuid4().hex[:6]
    src = Source(r, uid)
    decls = [declaration(uid, src.slot, t, "shop") for t in shop.TABLES]
    idents = {t: d["identifier"] for t, d in zip(shop.TABLES, decls)}
    log = r.lake.home / f"consistent-cdc-{uid}.log"
    workload = shop.ShopWorkload(src.db, seed=int(r.rng.random() * 10**6), pause_s=pause_s)
    reader = shop.InvariantReader(r.lake.settings, {t: idents[t] for t in ("orders", "order_lines", "stock", "moves")})
    checks: dict[str, bool] = {}
    try:
        workload.start()
        reader.start()
        for i in range(kills):
            proc = start_worker(r.lake, json.dumps(decls), log)
            if i % 2:  # every other worker commits first, so the reader sees positions while kills go on
                _await_commit(log, proc, timeout_s=900)
                time.sleep(r.rng.uniform(0.0, 30.0))
            else:
                time.sleep(r.rng.uniform(*lifetime_s))
            kill_group(proc)
            r.log(f"  kill {i + 1}/{kills} of the group's worker (rc {proc.returncode}); reader: "
                  f"{reader.group.checked} consistent reads, {reader.single.checked} per-table reads")  # fmt: skip
        workload.stop()
        checks["workload ran without errors"] = not workload.errors
        if workload.errors:
            r.log(workload.errors[0])
        src.finish(r.lake.bootstrap)
        time.sleep(5.5)  # older than attempt_timeout_s (Lake.env): any attempt left is dead now
        last = start_worker(r.lake, json.dumps(decls), log, idle_s=8)
        checks["final worker caught up"] = last.wait(timeout=1800) == 0
        time.sleep(3 * reader.gap_s + 2 * reader.pause_s)  # the reader sees the final position too
        reader.stop()
        rows = {}
        for t, ident in idents.items():
            rows[t] = compare_table(src.db, t, load_table(r.catalog, ident).metadata_location)
            checks[f"{t}: equals PostgreSQL (EXCEPT ALL both ways)"] = rows[t][2] == rows[t][3] == 0
            checks[f"{t}: no attempt branches left"] = _no_branches(r, ident)
        g, s = reader.group, reader.single
        checks["consistent view read at several positions"] = len(g.positions) > 1
        checks["consistent view never broke an invariant"] = g.broken == 0
        _print_table(r, rows, kills, g, s, workload, reader)
        tally = Tally(
            produced=sum(v[0] for v in rows.values()),
            in_table=sum(v[1] for v in rows.values()),
            quarantined=0,
            lost=sum(v[3] for v in rows.values()),
            duplicates=0,
            mismatched=0,
            unexpected=sum(v[2] for v in rows.values()),
            examples=[("consistent view broken", x) for x in g.reasons],
        )
        notes = (
            f"{workload.transactions} source transactions; consistent positions checked {g.checked} "
            f"({len(g.positions)} distinct), broken {g.broken}; per-table reads checked {s.checked}, broken {s.broken}"
        )
        return ScenarioResult(
            "transaction-consistent CDC, worker killed", kills, tally, checks, notes, time.monotonic() - t0
        )
    finally:
        if workload.is_alive():
            workload.stop()
        if reader.is_alive():
            reader.stop()
        src.stop()


def _commits(log: Path) -> int:
    return sum(1 for line in log.read_text().splitlines() if line.startswith('{"table"') and '"ranges"' in line)


def _await_commit(log: Path, proc: subprocess.Popen, timeout_s: float) -> None:
    """Wait until the worker ``proc`` (writing ``log``) reports a commit, exits, or ``timeout_s`` pass."""
    before, deadline = _commits(log) if log.exists() else 0, time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None and _commits(log) == before:
        time.sleep(0.5)


def _no_branches(r: Rehearsal, ident: str) -> bool:
    from kafka_iceberg.catalog.tables import load_table

    table = load_table(r.catalog, ident)
    return table is not None and not [ref for ref in table.metadata.refs if ref != "main"]


def _print_table(r: Rehearsal, rows: dict, kills: int, g, s, workload, reader) -> None:
    """The scenario's own report: per table rows vs PostgreSQL, then the kills and the reads."""
    r.log(f"   {'table':<12} {'postgres':>9} {'iceberg':>9} {'only ice':>9} {'only pg':>8}")
    for t, (pg, ice, only_ice, only_pg) in rows.items():
        r.log(f"   {t:<12} {pg:>9} {ice:>9} {only_ice:>9} {only_pg:>8}")
    r.log(f"   worker kills: {kills}; source transactions: {workload.transactions} in {workload.rounds} rounds")
    r.log(f"   consistent view: {g.checked} reads at {len(g.positions)} positions, broken {g.broken}")
    r.log(f"   tables one by one: {s.checked} reads, broken {s.broken}; e.g. {s.reasons[:2]}")
    if reader.errors:
        r.log(f"   reader errors ({g.errors}): {reader.errors[:3]}")


def record_times(bootstrap: str, topic: str) -> dict[tuple[int, int], int]:
    """(partition, offset) -> record timestamp (ms since epoch: when the capture produced the change
    event) of every record of ``topic``."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"cc-{time.time_ns()}", "enable.auto.commit": False}
    )
    out: dict[tuple[int, int], int] = {}
    try:
        highs = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(PARTITIONS)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        seen = {p: 0 for p in highs}
        while any(seen[p] < highs[p] for p in highs):
            for m in consumer.consume(1000, 2.0):
                if not m.error():
                    out[(m.partition(), m.offset())] = m.timestamp()[1]
                    seen[m.partition()] = m.offset() + 1
    finally:
        consumer.close()
    return out


def freshness_seconds(bootstrap: str, log: Path, decls: list[dict]) -> list[float]:
    """Per change event committed by the worker that wrote ``log``: seconds from its record timestamp to
    the commit that published it (the worker's commit line), for events produced after its first commit
    (the backlog of its start is left out)."""
    commits = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    commits = [c for c in commits if "ranges" in c]
    if not commits:
        return []
    first = min(c["t_ms"] for c in commits)
    out = []
    for decl in decls:
        times = record_times(bootstrap, decl["topic"])
        for c in (c for c in commits if c["table"] == decl["identifier"]):
            for p, (start, end) in c["ranges"].items():
                stamps = (times.get((int(p), o)) for o in range(start, end))
                out += [(c["t_ms"] - ts) / 1000 for ts in stamps if ts is not None and ts > first]
    return out


def _alone(decl: dict) -> dict:
    """``decl`` as a table of its own beside the group: ``<name>_alone``, same topic, no consistency group."""
    out = {k: v for k, v in decl.items() if k != "consistency_group"}
    return {**out, "name": f"{decl['name']}_alone", "identifier": f"{decl['identifier']}_alone"}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def group_cost(r: Rehearsal, seconds: float = 900.0, pause_s: float = 3.0) -> ScenarioResult:
    """Freshness of the shop's five tables as one consistency group beside the same five tables each alone
    (same topics), all served by one worker for ``seconds`` under the workload, so both see the same load
    (docs/cdc.md#consistency-groups). Then caught up; every table is compared with PostgreSQL."""
    import subprocess as sp

    from kafka_iceberg.catalog.tables import load_table

    t0, uid = time.monotonic(), uuid.uuid4().hex[:6]
    commit = sp.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=str(CHECKOUT))
    commit.stdout = commit.stdout.strip() or "unknown: not a git checkout"
    src = Source(r, uid)
    grouped = [declaration(uid, src.slot, t, "shop") for t in shop.TABLES]
    alone = [_alone(d) for d in grouped]
    log = r.lake.home / f"freshness-{uid}.log"
    workload = shop.ShopWorkload(src.db, seed=int(r.rng.random() * 10**6), pause_s=pause_s)
    proc = None
    try:
        workload.start()
        proc = start_worker(r.lake, json.dumps(grouped + alone), log, idle_s=8)
        time.sleep(seconds)
        workload.stop()
        src.finish(r.lake.bootstrap)
        checks = {"worker caught up": proc.wait(timeout=3600) == 0, "workload ran without errors": not workload.errors}
        for t, d in zip(list(shop.TABLES) * 2, grouped + alone):
            diff = compare_table(src.db, t, load_table(r.catalog, d["identifier"]).metadata_location)
            checks[f"{d['identifier']} equals PostgreSQL"] = diff[2:] == (0, 0)
        fresh = {"one consistency group": freshness_seconds(r.lake.bootstrap, log, grouped),
                 "each table alone": freshness_seconds(r.lake.bootstrap, log, alone)}  # fmt: skip
    finally:
        if workload.is_alive():
            workload.stop()
        if proc is not None and proc.poll() is None:
            kill_group(proc)
        src.stop()
    for name, f in fresh.items():
        r.log(f"   5 tables, {name}: freshness p50 {_pct(f, 0.5):.1f} s, p90 {_pct(f, 0.9):.1f} s ({len(f)} change "
              f"events; {workload.transactions} source transactions in {seconds:.0f} s; commit {commit.stdout.strip()})")  # fmt: skip
    g, a = (_pct(f, 0.5) for f in fresh.values())
    notes = f"freshness p50 grouped {g:.1f} s beside alone {a:.1f} s (commit {commit.stdout.strip()})"
    n = sum(len(f) for f in fresh.values())
    tally = Tally(produced=n, in_table=n, quarantined=0, lost=0, duplicates=0, mismatched=0, unexpected=0)
    return ScenarioResult("consistency group cost (freshness)", 0, tally, checks, notes, time.monotonic() - t0)


def register(scenarios: dict) -> None:
    """Add ``consistent_cdc`` (``--kills`` SIGKILLs of the group's worker; default: :func:`consistent_cdc`'s) and
    ``consistent_cdc_cost`` (freshness of the group beside the same tables alone)."""
    scenarios["consistent_cdc"] = lambda r, args: consistent_cdc(r, kills_or(args, KILLS))
    scenarios["consistent_cdc_cost"] = lambda r, args: group_cost(r)


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        sys.exit(_worker_main(sys.argv[2], sys.argv[3], float(sys.argv[4])))

__all__ = ["consistent_cdc", "declaration", "group_cost", "register"]
