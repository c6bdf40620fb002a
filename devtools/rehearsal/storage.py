"""Rehearsal scenario ``storage_faults``: object-storage faults on the S3 path while producers write.

The warehouse is on a local S3 server (moto) reached through :class:`devtools.services.s3faults.FaultProxy`,
which answers a share of PUTs and GETs with ``503 SlowDown``, ``500 InternalError`` or no answer at
all (a timeout), from every writer of the lake: the read tasks' Parquet writer (pyarrow's
``S3FileSystem`` through pyiceberg's FileIO), the publish's manifests and metadata (pyiceberg's
FileIO) and Spark's ``S3FileIO`` (the dead-letter appends, the Iceberg AWS SDK v2 client). The
catalog stays on SQLite. A sink runs micro-batches in a loop through the faults; a sink that exits on
an error (a fault its client did not retry away) is started again, and its next micro-batch
must recover.

What retries: pyarrow's S3 client (the AWS SDK for C++, standard retry strategy, 3 attempts, for
5xx, ``SlowDown`` and timeouts) and Spark's ``S3FileIO`` (the AWS SDK for Java v2, Iceberg's
``s3.retry.*`` defaults). The write path adds no storage retry of its own: a micro-batch whose
storage call still fails after those retries fails, leaves its attempt to recovery, and the next
micro-batch re-reads the same offsets.

Observed: the proxy counts each fault by method and kind, and which faulted requests the client
sent again and got through; failed micro-batches are the sink's exit codes and last stderr lines.
The verifier (DuckDB, pyiceberg) reads the bucket straight from moto, without faults. Registered in
:data:`devtools.rehearsal.run.SCENARIO_MODULES` (``make rehearse --only storage_faults``).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid

from devtools.rehearsal.run import Lake, Rehearsal, ScenarioResult, Traffic, kill_group, reconcile
from devtools.services import devbroker
from devtools.services.s3faults import KEY, REGION, SECRET, FaultProxy, aws_sdk_jars, start_moto
from kafka_iceberg.catalog.tables import load_catalog
from kafka_iceberg.config.settings import load_settings


def _catalog_properties(db: str, bucket: str, endpoint: str) -> str:
    return json.dumps(
        {
            "type": "sql",
            "uri": f"sqlite:///{db}",
            "warehouse": f"s3://{bucket}/warehouse",
            "s3.endpoint": endpoint,
            "s3.region": REGION,
            "s3.path-style-access": "true",
        }
    )


def _committed(out: bytes | None) -> list[dict]:
    return [json.loads(line) for line in (out or b"").decode().splitlines() if line.startswith("{")]


def _run_sinks(
    lake: Lake, decl: dict, seconds: float, min_batches: int, max_s: float
) -> tuple[list[dict], list[tuple[int, str]]]:
    """Micro-batches in a loop for at least ``seconds`` and until ``min_batches`` of them committed
    (at most ``max_s`` seconds); a sink that exits is started again. Returns the micro-batches'
    JSON lines and (exit code, last stderr line) of every sink that exited on its own."""
    batches: list[dict] = []
    exits: list[tuple[int, str]] = []
    t0 = time.monotonic()

    def enough(partial: bytes | None) -> bool:
        done = sum(1 for b in batches + _committed(partial) if b.get("committed"))
        elapsed = time.monotonic() - t0
        return (elapsed >= seconds and done >= min_batches) or elapsed >= max_s

    while not enough(None):
        proc = lake.sink(decl, "loop")
        while True:
            try:
                out, err = proc.communicate(timeout=5)
                lines = err.decode().strip().splitlines()
                exits.append((proc.returncode, lines[-1][:300] if lines else ""))
                break
            except subprocess.TimeoutExpired as exc:
                if enough(exc.output):
                    kill_group(proc)
                    out, _ = proc.communicate()
                    break
        batches += _committed(out)
    return batches, exits


def storage_faults(
    r: Rehearsal,
    seconds: float = 90.0,
    min_batches: int = 10,
    share: float = 0.1,
    rate: float = 150.0,
    seed: int = 11,
) -> ScenarioResult:
    """See the module docstring: ``share`` of PUTs and GETs faulted for at least ``seconds`` and
    until ``min_batches`` micro-batches committed under faults (at most 20 minutes) while a sink
    loops; then the faults stop, a last catch-up runs, and every record is reconciled."""
    t0 = time.monotonic()
    home = r.lake.home
    name = f"s3_{uuid.uuid4().hex[:6]}"
    moto = start_moto(home / f"moto-{name}.log", devbroker.free_port())
    proxy = FaultProxy(moto.endpoint, share=share, seed=seed)
    try:
        bucket = f"lake-rehearsal-{name.replace('_', '-')}"
        moto.client().create_bucket(Bucket=bucket)
        db = str(home / f"catalog-{name}.db")
        secrets = {
            "PYICEBERG_CATALOG__LAKE__S3__ACCESS_KEY_ID": KEY,
            "PYICEBERG_CATALOG__LAKE__S3__SECRET_ACCESS_KEY": SECRET,
        }
        lake = Lake(
            home,
            r.lake.broker_dir,
            r.lake.bootstrap,
            extra_env={
                **secrets,
                "LAKE_CATALOG_PROPERTIES": _catalog_properties(db, bucket, proxy.endpoint),
                "LAKE_SPARK_CONF": json.dumps({"spark.driver.memory": "1g", "spark.jars": ",".join(aws_sdk_jars())}),
            },
        )
        sr = Rehearsal(lake, r.log)
        direct = {**lake.env(), "LAKE_CATALOG_PROPERTIES": _catalog_properties(db, bucket, moto.endpoint)}
        sr.catalog = load_catalog(load_settings(env=direct).catalog)  # the verifier: no faults
        decl, spec = sr._table(name, 2, 100_000)
        traffic = Traffic(lake.kafka_config, spec.topic, rate, bad_every=61)
        traffic.start()
        time.sleep(2)
        first = lake.catch_up(decl)  # creates the tables, no faults yet
        r.log(f"  first catch-up: rc {first.returncode} at {time.monotonic() - t0:.0f} s; faults on")
        proxy.enabled = True
        batches, exits = _run_sinks(lake, decl, seconds, min_batches, 1200.0)
        proxy.enabled = False
        r.log(f"  faults off at {time.monotonic() - t0:.0f} s: {proxy.counts()}; sinks that exited: {exits}")
        traffic.stop()
        retried, never = proxy.retried()
        counts = proxy.counts()
        committed = sum(1 for b in batches if b.get("committed"))
        checks = {
            "first run caught up": first.returncode == 0,
            "producer delivered everything": not traffic.errors,
            "PUTs and GETs faulted": any(k.startswith("PUT") for k in counts)
            and any(k.startswith("GET") for k in counts),
            "faulted requests were retried": retried > 0,
            "micro-batches committed through the faults": committed > 0,
        }
        sr._final_catch_up(decl, checks)
        checks["no attempt branches left"] = sr._no_leftovers(spec)
        checks["no overlapping snapshot ranges"] = sr._no_overlaps(spec)
        tally = reconcile(sr.catalog, spec, traffic.expected())
        checks["bad records quarantined"] = tally.quarantined > 0
    finally:
        proxy.close()
        moto.stop()
    failed = "; ".join(f"rc {rc}: {line[:140]}" for rc, line in exits[:3])
    notes = (
        f"{len(proxy.faults)} faults ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}) "
        f"of {sum(proxy.requests.values())} requests; {retried} sent again and got through, {never} not; "
        f"{committed} micro-batches committed under faults, {len(exits)} failed and recovered"
        + (f" ({failed})" if failed else "")
    )
    return ScenarioResult("object-storage faults (S3)", len(proxy.faults), tally, checks, notes, time.monotonic() - t0)


def register(scenarios: dict) -> None:
    """Add this module's scenarios to the rehearsal's registry."""
    scenarios["storage_faults"] = lambda r, args: storage_faults(r)


__all__ = ["register", "storage_faults"]
