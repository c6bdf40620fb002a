"""Rehearsal scenario ``maintenance_loop``: while a sink process streams micro-batches of one table
under producers, a second process runs Iceberg's ``rewrite_data_files`` (every data file) and
``expire_snapshots`` (down to the ingest state) on the same table in a loop for 5 minutes. No
micro-batch may fail (the sink runs throughout), and the table must hold each produced record exactly
once (0 lost, 0 duplicated), with no attempt branch left and no two snapshots covering one offset.

The maintenance process is ``python -m devtools.rehearsal.maintenance_loop DECLARATION SECONDS``; it
prints one JSON line per round (``{"ok": ...}`` or ``{"error": ...}``: a compaction that loses a race
to a micro-batch's commit is refused, as a scheduled one would be). Registered in
:data:`devtools.rehearsal.run.SCENARIO_MODULES` (``make rehearse --only maintenance_loop``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid

from devtools.rehearsal.run import Rehearsal, ScenarioResult, Traffic, kill_group, reconcile
from kafka_iceberg.config.settings import CHECKOUT


def _maintain_main(declaration: str, seconds: float) -> int:
    """Compact every data file and expire snapshots of the declared table, round after round, for ``seconds``."""
    from kafka_iceberg.catalog.spark import get_spark
    from kafka_iceberg.catalog.tables import load_catalog, load_table, metadata_view
    from kafka_iceberg.config.settings import load_settings
    from kafka_iceberg.declaration.spec import parse_table_spec
    from kafka_iceberg.ops import maintenance

    settings = load_settings()
    spec = parse_table_spec(json.loads(declaration))
    spark, catalog, name = get_spark(settings), load_catalog(settings.catalog), settings.catalog.name
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            spark.sql(
                f"CALL {name}.system.rewrite_data_files(table => '{spec.identifier}', "
                "options => map('rewrite-all', 'true'))"
            ).collect()
            view = metadata_view(load_table(catalog, spec.identifier))
            expired = maintenance.expire(spark, name, spec.identifier, 0.0, 1, view)  # keeps the ingest state
            print(json.dumps({"ok": expired.output["expired_snapshots"]}), flush=True)
        except Exception as exc:  # noqa: BLE001 - a refused round is reported and the loop goes on
            print(json.dumps({"error": str(exc)[:300]}), flush=True)
        time.sleep(0.5)
    return 0


def _lines(stream, into: list[str]) -> threading.Thread:
    """Read ``stream`` line by line into ``into`` in a thread (a pipe nobody reads would block its writer)."""

    def read():
        for line in iter(stream.readline, b""):
            into.append(line.decode())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def maintenance_loop(r: Rehearsal, seconds: float = 300.0, rate: float = 100.0) -> ScenarioResult:
    """Stream one table at ``rate`` records/s while compaction and expiry run on it for ``seconds``."""
    t0 = time.monotonic()
    decl, spec = r._table(f"maint_{uuid.uuid4().hex[:6]}", 2, 300)
    traffic = Traffic(r.lake.kafka_config, spec.topic, rate, bad_every=97)
    traffic.start()
    sink, batches = r.lake.sink(decl, "loop"), []
    _lines(sink.stdout, batches)
    deadline = time.monotonic() + 300
    while r._lag(spec) > 0 and not batches and time.monotonic() < deadline:
        time.sleep(1)  # the first micro-batch creates the table
    maint = subprocess.Popen(
        [sys.executable, "-m", "devtools.rehearsal.maintenance_loop", json.dumps(decl), str(seconds)],
        env=r.lake.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=str(CHECKOUT),
    )
    rounds: list[str] = []
    _lines(maint.stdout, rounds).join(timeout=seconds + 600)
    maint.wait(timeout=60)
    traffic.stop()
    deadline = time.monotonic() + 600
    while r._lag(spec) > 0 and time.monotonic() < deadline and sink.poll() is None:
        time.sleep(1)
    sink_ran_throughout = sink.poll() is None
    kill_group(sink)
    done = [json.loads(line) for line in rounds if line.startswith("{")]
    ok = sum("ok" in d for d in done)
    checks = {
        "no micro-batch failed (the sink ran throughout)": sink_ran_throughout,
        "maintenance rounds completed (10 or more)": ok >= 10,
        "caught up": r._lag(spec) == 0,
        "no attempt branches left": r._no_leftovers(spec),
        "no overlapping snapshot ranges": r._no_overlaps(spec),
        "producers delivered everything": not traffic.errors,
    }
    tally = reconcile(r.catalog, spec, traffic.expected())
    notes = f"{ok} compaction + expiry rounds ({len(done) - ok} refused) under {len(batches)} micro-batches"
    return ScenarioResult("Compaction and expiry in a loop", ok, tally, checks, notes, time.monotonic() - t0)


def register(scenarios: dict) -> None:
    """Add this module's scenarios to the rehearsal's registry."""
    scenarios["maintenance_loop"] = lambda r, args: maintenance_loop(r)


if __name__ == "__main__":
    sys.exit(_maintain_main(sys.argv[1], float(sys.argv[2])))

__all__ = ["maintenance_loop", "register"]
