"""On a PostgreSQL catalog, two worker runs ingest two tables in parallel, each within its own pool (issue 13, section 4).

The shipped code location (``devtools/dev_location.py``: ``kafka_iceberg.lake_assets.definitions`` with the
development defaults) declares two tables on a PostgreSQL JDBC catalog with ``LAKE_WORKERS=2``, so it has two
worker jobs (``lake_worker_0`` serves the first table in sorted order, ``lake_worker_1`` the second,
:func:`kafka_iceberg.batch.assign.assign_workers`), and each job's ``serve`` op holds a pool of its own
(``lake/worker/<k>``, limit 1 from dagster.yaml). ``dagster-daemon run`` drives it on a Dagster instance with
PostgreSQL storage and the shipped dagster.yaml's run queue: the ``lake_workers`` sensor sees both tables due
and launches one run of each worker, each run in its own process with its own Spark session, serving its
table one bounded micro-batch at a time.

Read back: both tables reach their topics' high watermarks exactly once; while the runs serve, each pool is
claimed only by its own worker's ``serve`` step (sampled from the instance's pool info); each table's
commits are materialized by runs of one worker only; and the two serve steps ran at once: each started
(STEP_START in the event log) before the other's table made its last commit (its snapshot's timestamp).
Record counts are tiny; what costs time is a Python process and a JVM per run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from dagster import DagsterEventType, DagsterInstance, RunsFilter

from kafka_iceberg.catalog.tables import load_catalog, read_state
from kafka_iceberg.config.settings import CHECKOUT, load_settings
from kafka_iceberg.lake_assets.vocabulary import WORKER_TAG, table_key, worker_job_name, worker_pool
from tests.helpers import event_records, make_spec, new_database, spec_dict
from tests.spark_cluster import produce

RECORDS = 120
"""Records produced to each table's 2-partition topic."""
BOUND = 5
"""``max_records_per_partition``: about 60 records a partition make 12 micro-batches per table, so one worker
still serves when the other's run has started on a loaded machine (its Spark start can lag by 11 s or more)."""
LAG = {"max_offset_lag": 1, "max_interval": "1h", "interval": "5s"}
WORKERS = 2


def _dagster_home(home: Path, server, db_name: str) -> Path:
    """The shipped dagster.yaml plus PostgreSQL storage (database ``db_name``) and at most 4 runs at once."""
    config = yaml.safe_load((CHECKOUT / "dagster.yaml").read_text())
    config["storage"] = {
        "postgres": {
            "postgres_db": {
                "username": "lake",
                "password": "lakepw",
                "hostname": "127.0.0.1",
                "port": server.port,
                "db_name": db_name,
                "scheme": "postgresql+psycopg2",
            }
        }
    }
    config["concurrency"]["runs"] = {"max_concurrent_runs": 4}
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    return home


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the daemon's process group (the daemon, its code server, the runs), then SIGKILL to what is left."""
    for sig, wait_s in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(2)


def _sample_claims(instance: DagsterInstance, claims: dict[str, set]) -> None:
    """Add each worker pool's claimed slots now, as (run id, step key), to ``claims`` (pool -> claims seen)."""
    for pool in claims:
        info = instance.event_log_storage.get_concurrency_info(pool)
        assert info.limit == 1, (pool, info)  # dagster.yaml's default pool limit
        claims[pool] |= {(s.run_id, s.step_key) for s in info.claimed_slots}


def _wait_until_ingested(instance, catalog, kafka, specs, claims, timeout_s: float = 2400) -> None:
    """Poll until every table's committed offsets are its topic's high watermarks, sampling the pools meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        _sample_claims(instance, claims)
        high = {s.identifier: {p: w.high for p, w in kafka.watermarks(s.topic).items()} for s in specs}
        if all(read_state(catalog, s.identifier).offsets == high[s.identifier] for s in specs):
            _sample_claims(instance, claims)  # the runs serve on (idle) a while after their last commit
            return
        assert time.monotonic() < deadline, f"the tables were not ingested in {timeout_s:.0f} s"
        time.sleep(2)


def _serve_starts(instance: DagsterInstance, runs, step_key: str) -> list[float]:
    """STEP_START timestamps (s since epoch) of ``step_key`` in ``runs``."""
    return [
        e.timestamp
        for r in runs
        for e in instance.all_logs(r.run_id, of_type=DagsterEventType.STEP_START)
        if e.step_key == step_key
    ]


@pytest.mark.timeout(3000)  # 2 runs, each a Python process and a JVM: a few minutes, longer at a high load average
def test_two_workers_ingest_two_tables_in_parallel_within_their_pools(
    tmp_path, postgres_server, broker, kafka, kafka_config, unique, topic_factory
):
    catalog_uri = new_database(postgres_server, "iceberg")
    dagster_db = new_database(postgres_server, "dagster").rsplit("/", 1)[1]
    raw = [
        spec_dict(f"{unique}{s}", topic_factory(f"{unique}{s}", partitions=2), max_records_per_partition=BOUND, lag=LAG)
        for s in ("a", "b")
    ]
    specs = [make_spec(r["name"], r["topic"], max_records_per_partition=BOUND, lag=LAG) for r in raw]
    for spec in specs:
        produce(kafka_config, spec.topic, event_records(range(RECORDS)))
    tables_file = tmp_path / "tables.yaml"
    tables_file.write_text(yaml.safe_dump({"tables": raw}))
    home = _dagster_home(tmp_path / "dagster", postgres_server, dagster_db)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "LAKE_", "DAGSTER_", "PYICEBERG_"))}
    env.update(
        {
            "PYTHONPATH": str(CHECKOUT),
            "DAGSTER_HOME": str(home),
            "LAKE_HOME": str(tmp_path / "lake"),
            "LAKE_TABLES_FILE": str(tables_file),
            "LAKE_WORKERS": str(WORKERS),  # what a host of 2 cores or more derives for 2 tables
            "KAFKA_BOOTSTRAP_SERVERS": broker,
            "LAKE_CATALOG_URI": catalog_uri,
            "SPARK_MASTER": "local[1]",
            "LAKE_SPARK_CONF": json.dumps({"spark.driver.memory": "512m"}),
            "LAKE_DEV_HOOKS": "read_timeout_s=60",
        }
    )
    settings = load_settings(env=env)
    assert not settings.catalog.is_sqlite
    ordered = sorted(specs, key=lambda s: s.identifier)  # assign_workers deals them round robin in this order
    worker_of = {s.identifier: str(k) for k, s in enumerate(ordered)}
    claims: dict[str, set] = {worker_pool(k): set() for k in range(WORKERS)}
    catalog = load_catalog(settings.catalog)  # creates the JDBC catalog tables before two runs race to
    instance = DagsterInstance.from_config(str(home))  # creates the storage schema before the daemon starts
    log = tmp_path / "daemon.log"
    daemon = subprocess.Popen(
        [str(Path(sys.executable).with_name("dagster-daemon")), "run", "-w", "workspace.yaml"],
        cwd=CHECKOUT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_until_ingested(instance, catalog, kafka, specs, claims)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{log.read_text()[-4000:]}") from None
    finally:
        _stop_group(daemon)

    runs = {str(k): instance.get_runs(RunsFilter(tags={WORKER_TAG: str(k)})) for k in range(WORKERS)}
    assert all(runs.values()), {k: [r.run_id for r in v] for k, v in runs.items()}
    run_worker = {r.run_id: k for k, rs in runs.items() for r in rs}
    assert all(r.job_name == worker_job_name(int(k)) for k, rs in runs.items() for r in rs)
    windows = {}
    for spec in specs:
        k = worker_of[spec.identifier]
        table = catalog.load_table(spec.identifier)
        assert table.scan().to_arrow().num_rows == RECORDS  # exactly once
        # each table served by one worker: every materialization of it comes from that worker's runs
        records = instance.fetch_materializations(table_key(spec), limit=100).records
        assert records and {run_worker.get(r.run_id) for r in records} == {k}, (spec.identifier, k, records)
        starts = _serve_starts(instance, runs[k], f"serve_{worker_job_name(int(k))}")
        assert starts, f"worker {k}: no STEP_START of its serve step"
        windows[k] = (min(starts), read_state(catalog, spec.identifier).snapshot_timestamp_ms / 1000)
        assert windows[k][0] < windows[k][1], f"worker {k}: the last commit precedes its serve step: {windows[k]}"
    t0 = min(start for start, _ in windows.values())
    print(
        "\nserve step start -> last commit (s after the first serve step started):",
        json.dumps({k: (round(a - t0, 1), round(b - t0, 1)) for k, (a, b) in windows.items()}),
        "\npool claims seen:",
        json.dumps({p: sorted(c) for p, c in claims.items()}),
    )

    # each serve step held its own pool, and only it did
    for k in range(WORKERS):
        pool, step = worker_pool(k), f"serve_{worker_job_name(k)}"
        assert claims[pool], f"{pool} was never seen claimed while the tables were ingested"
        assert {(run_worker.get(run_id), key) for run_id, key in claims[pool]} == {(str(k), step)}, (pool, claims)
    # the two workers served at once: each serve step started before the other's table made its last commit
    (s0, e0), (s1, e1) = windows["0"], windows["1"]
    assert s0 < e1 and s1 < e0, f"the two workers did not serve in parallel: {windows}"
    instance.dispose()
