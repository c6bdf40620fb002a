"""Goal 3 of the benchmark: freshness under steady load, with the Dagster daemon driving ingestion.

``scripts/bench.py --freshness [--minutes 8] [--rate 200]``: a producer writes ``--rate`` flights
records/s (record timestamp = produce time) round-robin to a fresh 4-partition topic while
``dagster-daemon run`` (sensors, run queue, run monitoring) runs this checkout's code location
with one declared table on that topic, on the default SQLite catalog. Then, per record:
freshness = commit time of the first ``main`` snapshot whose ``kafka.batch`` holds its offset
minus its record timestamp. Prints p50, p90, max, the runs, where a run's wall time goes (from
the run's event log and its materializations' ``phase_*`` metadata) and the exactly-once check
(DuckDB count and distinct (partition, offset)). See docs/benchmark.md.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml
from confluent_kafka import Producer

from devtools import duck
from devtools.bench.common import CHECKOUT, PARTITIONS, flights_records, say, section
from devtools.bench.runs import print_runs
from devtools.demo import data as demo_data
from devtools.services import devbroker
from kafka_iceberg.catalog.tables import load_catalog, metadata_view
from kafka_iceberg.config.settings import Settings
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata
from kafka_iceberg.state import ancestors, batch_ranges, state_at

TOPIC, IDENTIFIER = "fresh.flights", "fresh.flights"
LAG = {"max_offset_lag": 1, "max_interval": "1s", "interval": "1s", "window": 10}
PRIMING = 40  # records ingested before the timed load (the first run also starts the code location)


def write_tables_file(path: Path) -> None:
    """One table, the flights declaration on :data:`TOPIC`, due (``lake_workers``) on any lag."""
    doc = yaml.safe_load((CHECKOUT / "kafka_iceberg" / "defs" / "nyc" / "defs.yaml").read_text())["attributes"]
    flights = dict(next(t for t in doc["tables"] if t["name"] == "flights"))
    flights.update(identifier=IDENTIFIER, topic=TOPIC, lag=LAG, description="freshness benchmark")
    path.write_text(yaml.safe_dump({"defaults": doc.get("defaults") or {}, "tables": [flights]}))


class SteadyProducer(threading.Thread):
    """Produces ``rate`` records/s (timestamp = now, ms) round-robin over the partitions until
    stopped; ``delivered`` maps (partition, offset) -> timestamp ms from the delivery reports."""

    def __init__(self, config: KafkaConfig, df, rate: int, first_row: int):
        super().__init__(daemon=True)
        self.config, self.df, self.rate, self.row = config, df, rate, first_row
        self.delivered: dict[tuple[int, int], int] = {}
        self.errors: list[str] = []
        self.stop_event = threading.Event()

    def _report(self, err, msg) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.delivered[(msg.partition(), msg.offset())] = msg.timestamp()[1]

    def run(self) -> None:
        producer = Producer(self.config.client_conf(**{"enable.idempotence": True, "linger.ms": 5}))
        t0, sent = time.monotonic(), 0
        while not self.stop_event.is_set():
            due = int((time.monotonic() - t0) * self.rate) - sent
            if due > 0:
                for key, value, _ in flights_records(self.df, self.row, due):
                    producer.produce(
                        TOPIC,
                        key=key,
                        value=value,
                        timestamp=int(time.time() * 1000),
                        partition=self.row % PARTITIONS,
                        on_delivery=self._report,
                    )
                    self.row, sent = self.row + 1, sent + 1
            producer.poll(0.02)
        producer.flush(60)


def daemon_env(settings: Settings, home: Path, tables: Path, tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a benchmark's ``dagster-daemon``: this process's minus every ``LAKE_`` and
    ``DAGSTER_`` variable (``LAKE_DEV`` too: it runs as a deployment), then the benchmark's own lake,
    catalog and warehouse, tables file, broker and Spark scratch, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKE_", "DAGSTER_"))}
    env.update(
        DAGSTER_HOME=str(home),
        LAKE_HOME=str(settings.lake_home),
        LAKE_TABLES_FILE=str(tables),
        LAKE_CATALOG_URI=settings.catalog.sqlalchemy_uri,
        LAKE_WAREHOUSE=settings.catalog.warehouse,
        KAFKA_BOOTSTRAP_SERVERS=settings.kafka_bootstrap_servers,
        PYTHONPATH=str(CHECKOUT),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_DIRS=str(tmp / "spark-local"),
        **extra,
    )
    return env


def start_daemon(home: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    """The deployment (:mod:`devtools.bench.deployment`: a code server and ``dagster-daemon run`` on it)
    in its own process session, its workspace file and code server port in ``home``."""
    port = devbroker.free_port()
    return subprocess.Popen(
        [sys.executable, "-m", "devtools.bench.deployment", str(home / "workspace.yaml"), str(port)],
        cwd=CHECKOUT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_daemon(proc: subprocess.Popen, grace_s: float = 60) -> None:
    """Stop the deployment :func:`start_daemon` started (or any process group leader): SIGTERM to its process
    group, up to ``grace_s`` seconds for it to exit, then SIGKILL to whatever outlived it (``dagster api grpc``
    does not exit on SIGTERM)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


def committed(settings: Settings) -> dict[int, int]:
    table = load_catalog(settings.catalog).load_table(IDENTIFIER)
    view = metadata_view(table)
    return state_at(view.snapshots, view.main).offsets


def wait_caught_up(settings: Settings, kafka: KafkaMetadata, timeout_s: float) -> float:
    """Seconds until the table's committed offsets reach the high watermarks (raises on timeout)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        high = {p: w.high for p, w in kafka.watermarks(TOPIC).items()}
        try:
            if committed(settings) == high:
                return time.monotonic() - t0
        except Exception:  # noqa: BLE001 - the table may not exist yet
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{IDENTIFIER} did not catch up with {TOPIC} within {timeout_s:.0f} s")


def commit_times(settings: Settings) -> tuple[dict[tuple[int, int], int], object]:
    """(partition, offset) -> commit time (ms) of the first main snapshot whose kafka.batch holds it."""
    table = load_catalog(settings.catalog).load_table(IDENTIFIER)
    view = metadata_view(table)
    out: dict[tuple[int, int], int] = {}
    for snap in reversed(ancestors(view.snapshots, view.main)):  # oldest first
        for p, (start, end) in batch_ranges(snap).items():
            for off in range(start, end):
                out.setdefault((p, off), snap.timestamp_ms)
    return out, table


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run_freshness(args, tmp: Path, settings: Settings) -> dict:
    """Goal 3 (see the module docstring). Returns the figures it printed."""
    section(
        f"(3) freshness: {args.rate} records/s to {PARTITIONS} partitions for {args.minutes:g} min under dagster-daemon"
    )
    config = KafkaConfig.from_settings(settings)
    kafka = KafkaMetadata(config)
    demo_data.create_topic(config, TOPIC, PARTITIONS, {"retention.ms": "-1"})
    home = tmp / "dagster_home"
    home.mkdir(parents=True)
    shutil.copy(CHECKOUT / "dagster.yaml", home / "dagster.yaml")
    tables = tmp / "tables.yaml"
    write_tables_file(tables)
    env = daemon_env(settings, home, tables, tmp)
    say(f"table {IDENTIFIER} (flights declaration) on topic {TOPIC}; lag {LAG}; DAGSTER_HOME {home}")
    df = demo_data.load_frame("flights")
    daemon = start_daemon(home, env, tmp / "daemon.log")
    producer = None
    try:
        demo_data.produce(
            config, TOPIC, ((k, v, int(time.time() * 1000)) for k, v, _ in flights_records(df, 0, PRIMING))
        )
        primed_s = wait_caught_up(settings, kafka, 300)
        say(
            f"priming: {PRIMING} records committed {primed_s:.1f} s after the daemon started (code location load, "
            "first sensor tick, first run); not counted below"
        )
        producer = SteadyProducer(config, df, args.rate, PRIMING)
        producer.start()
        time.sleep(args.minutes * 60)
        producer.stop_event.set()
        producer.join(120)
        drain_s = wait_caught_up(settings, kafka, 600)
        say(
            f"load done: {len(producer.delivered):,} records delivered ({len(producer.errors)} errors); "
            f"table caught up {drain_s:.1f} s after the producer stopped"
        )
        time.sleep(5)  # let the last run finish its checks
    finally:
        if producer is not None:
            producer.stop_event.set()
        stop_daemon(daemon)
    return report(settings, home, producer.delivered)


def report(settings: Settings, home: Path, delivered: dict[tuple[int, int], int]) -> dict:
    firsts, table = commit_times(settings)
    fresh = [(firsts[k] - ts) / 1000 for k, ts in delivered.items() if k in firsts]
    missing = len(delivered) - len(fresh)
    con = duck.connect()
    total, distinct = con.execute(
        f"SELECT count(*), count(DISTINCT (_kafka_partition, _kafka_offset)) FROM {duck.scan_sql(table.metadata_location)}"
    ).fetchone()
    expected = PRIMING + len(delivered)
    out = {
        "p50": pct(fresh, 0.5),
        "p90": pct(fresh, 0.9),
        "max": max(fresh, default=float("nan")),
        "records": len(delivered),
        "missing": missing,
        "rows": total,
        "distinct": distinct,
    }
    say(f"freshness over {len(fresh):,} records (commit of first main snapshot holding it - record timestamp):")
    say(
        f"  p50 {out['p50']:.1f} s   p90 {out['p90']:.1f} s   max {out['max']:.1f} s   mean {statistics.fmean(fresh):.1f} s"
        f"   |  goal p50 <= 10 s, p90 <= 20 s"
    )
    say(
        f"exactly once (DuckDB): rows {total:,}, distinct (partition, offset) {distinct:,}, produced {expected:,}, "
        f"not in any snapshot {missing}: {'OK' if total == distinct == expected and not missing else 'MISMATCH'}"
    )
    out["runs"] = print_runs(home)
    return out


__all__ = ["run_freshness"]
