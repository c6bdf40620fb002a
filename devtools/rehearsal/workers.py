"""Rehearsal scenario ``worker_kills``: one worker process serving several tables
(:class:`kafka_iceberg.batch.worker.Worker`) is SIGKILLed mid-stream, again and again, while producers
write to every table's topic; a fresh worker picks up after each kill. Afterwards every table must hold
each produced record exactly once (0 lost, 0 duplicated), with no attempt branch left.

The worker is a process of its own (``python -m devtools.rehearsal.workers DECLARATIONS``), so a kill
takes its Spark JVM and Python workers with it, as a killed worker run would. Registered in
:data:`devtools.rehearsal.run.SCENARIO_MODULES` (``make rehearse --only worker_kills``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

from devtools.rehearsal.run import Lake, Rehearsal, ScenarioResult, Tally, Traffic, kill_group, reconcile
from kafka_iceberg.config.settings import CHECKOUT


def _worker_main(declarations: str, commit_prefix: str, idle_s: float) -> int:
    """Serve the tables of ``declarations`` (a JSON list) until killed; one JSON line per commit."""
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
    ports = WorkerPorts(
        lambda spec: run_micro_batch(spark, settings, spec, commit_id=commit_prefix, kafka=kafka, catalog=catalog),
        kafka.watermarks_many,
        on_commit=lambda spec, r: print(json.dumps({"table": spec.name, "records": r.records}), flush=True),
        on_failure=lambda spec, e: print(json.dumps({"table": spec.name, "error": str(e)[:300]}), flush=True),
    )
    worker = Worker(
        specs,
        ports,
        {s.identifier: read_state(catalog, s.identifier).offsets for s in specs},
        budget_s=3600,
        idle_s=idle_s,
    )
    worker.run()
    return 0


def start_worker(lake: Lake, declarations: str, idle_s: float = 3600) -> subprocess.Popen:
    """A worker process serving ``declarations`` in its own process group (so it can be killed whole);
    it exits once no record has waited for ``idle_s`` seconds."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devtools.rehearsal.workers",
            declarations,
            f"worker-{uuid.uuid4().hex[:8]}",
            str(idle_s),
        ],
        env=lake.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=str(CHECKOUT),
    )


def worker_kills(r: Rehearsal, tables: int = 3, kills: int = 6, rate: float = 60.0) -> ScenarioResult:
    """``kills`` SIGKILLs of a worker serving ``tables`` tables under ``rate`` records/s per topic."""
    t0 = time.monotonic()
    made = [r._table(f"worker_{i}_{uuid.uuid4().hex[:6]}", 2, 300) for i in range(tables)]
    traffic = [Traffic(r.lake.kafka_config, spec.topic, rate, bad_every=97) for _, spec in made]
    for t in traffic:
        t.start()
    decls = json.dumps([decl for decl, _ in made])
    for i in range(kills):
        proc = start_worker(r.lake, decls)
        time.sleep(r.rng.uniform(8.0, 30.0))
        kill_group(proc)
        r.log(f"  kill {i + 1}/{kills} of the worker (rc {proc.returncode})")
    for t in traffic:
        t.stop()
    time.sleep(5.5)  # older than attempt_timeout_s (Lake.env): any attempt left is dead now
    last = start_worker(r.lake, decls, idle_s=5)  # serves until nothing waits for 5 s, then exits
    caught_up = last.wait(timeout=1800) == 0
    checks = {"final worker caught up": caught_up, "producers delivered everything": not any(t.errors for t in traffic)}
    tallies = []
    for (_, spec), t in zip(made, traffic):
        tally = reconcile(r.catalog, spec, t.expected())
        tallies.append(tally)
        checks[f"{spec.name}: exactly once"] = tally.lost == 0 and tally.duplicates == 0
        checks[f"{spec.name}: no attempt branches left"] = r._no_leftovers(spec)
    total = Tally.total(tallies)
    notes = f"{tables} tables, one worker process killed {kills} times"
    return ScenarioResult("Many-table worker killed mid-stream", kills, total, checks, notes, time.monotonic() - t0)


def register(scenarios: dict) -> None:
    """Add this module's scenarios to the rehearsal's registry."""
    scenarios["worker_kills"] = lambda r, args: worker_kills(r)


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1], sys.argv[2], float(sys.argv[3])))

__all__ = ["register", "worker_kills"]
