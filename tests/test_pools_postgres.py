"""On a PostgreSQL catalog, tables ingest in parallel within the pool limits (issue 13, section 4).

The shipped code location (``kafka_iceberg.lake_assets.definitions``) declares two tables on a PostgreSQL JDBC
catalog, so each table asset has a pool of its own (``lake/table/<namespace>_<table>``, limit 1
from dagster.yaml). ``dagster-daemon run`` drives it on a Dagster instance with PostgreSQL storage,
the shipped dagster.yaml's run queue and ``max_concurrent_runs: 4``: each table's lag sensor sees a
backlog of several micro-batches and requests a backfill, the backfill daemon submits one run per
micro-batch, and the run queue launches them, each run in its own process with its own Spark.

Read back from the event log (the table step's STEP_START -> STEP_SUCCESS, the span during which
the step holds its pool slot): a micro-batch of one table runs while a micro-batch of the other
does, and two micro-batches of the same table never overlap. Record counts are tiny; what costs
time is a Python process and a JVM per run.
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
from dagster import DagsterInstance, RunsFilter

from kafka_iceberg.catalog.tables import load_catalog, read_state
from kafka_iceberg.config.settings import CHECKOUT, load_settings
from kafka_iceberg.lake_assets.vocabulary import IN_PROGRESS, TABLE_TAG, table_key, table_pool
from tests.helpers import event_records, make_spec, new_database, spec_dict
from tests.spark_cluster import produce

RECORDS = 40
"""Records produced to each table's 2-partition topic."""
BOUND = 15
"""``max_records_per_partition``: about 20 records a partition make 2 or 3 micro-batches per table."""
LAG = {"max_offset_lag": 1, "max_interval": "1h", "interval": "5s"}


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


def _step_window(instance: DagsterInstance, run_id: str, spec) -> tuple[float, float]:
    """(STEP_START, STEP_SUCCESS) timestamps (s since epoch) of the run's step that materialized the table."""
    events = [e for e in instance.all_logs(run_id) if e.dagster_event is not None]
    (step,) = {
        e.step_key
        for e in events
        if e.dagster_event_type.value == "ASSET_MATERIALIZATION" and e.dagster_event.asset_key == table_key(spec)
    }
    starts = [e.timestamp for e in events if e.step_key == step and e.dagster_event_type.value == "STEP_START"]
    ends = [e.timestamp for e in events if e.step_key == step and e.dagster_event_type.value == "STEP_SUCCESS"]
    assert starts and ends, f"run {run_id}: no STEP_START/STEP_SUCCESS for {step}"
    return min(starts), max(ends)


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


def _wait_until_ingested(instance, catalog, kafka, specs, timeout_s: float = 2400) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        done = True
        for spec in specs:
            runs = instance.get_runs(RunsFilter(tags={TABLE_TAG: spec.identifier}))
            high = {p: w.high for p, w in kafka.watermarks(spec.topic).items()}
            done &= (
                bool(runs)
                and not any(r.status in IN_PROGRESS for r in runs)
                and read_state(catalog, spec.identifier).offsets == high
            )
        if done:
            return
        assert time.monotonic() < deadline, f"the tables were not ingested in {timeout_s:.0f} s"
        time.sleep(3)


@pytest.mark.timeout(3000)  # 4 to 6 runs, each a Python process and a JVM: about 15 min at load average 30
def test_tables_ingest_in_parallel_within_their_pools(
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
            "KAFKA_BOOTSTRAP_SERVERS": broker,
            "LAKE_CATALOG_URI": catalog_uri,
            "SPARK_MASTER": "local[1]",
            "LAKE_SPARK_DRIVER_MEMORY": "512m",
            "LAKE_READ_TIMEOUT_S": "60",
        }
    )
    settings = load_settings(env=env)
    assert not settings.catalog.is_sqlite
    pools = {table_pool(spec, sqlite_catalog=False) for spec in specs}
    assert len(pools) == 2, pools  # one pool per table
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
        _wait_until_ingested(instance, catalog, kafka, specs)
    except AssertionError:
        raise AssertionError(log.read_text()[-4000:]) from None
    finally:
        _stop_group(daemon)

    windows = {}
    for spec in specs:
        runs = instance.get_runs(RunsFilter(tags={TABLE_TAG: spec.identifier}))
        assert len(runs) >= 2 and all(r.is_success for r in runs), [(r.run_id, r.status) for r in runs]
        assert all(r.tags.get("dagster/backfill") for r in runs)  # the lag sensor's backfill, one run per micro-batch
        windows[spec.identifier] = sorted(_step_window(instance, r.run_id, spec) for r in runs)
        table = catalog.load_table(spec.identifier)
        assert table.scan().to_arrow().num_rows == RECORDS  # exactly once
    t0 = min(w[0] for ws in windows.values() for w in ws)
    print(
        "\nstep windows (s after the first step started):",
        json.dumps({k: [(round(a - t0, 1), round(b - t0, 1)) for a, b in ws] for k, ws in windows.items()}),
    )

    # within a table's pool (limit 1): each micro-batch ends before the next one starts
    for identifier, ws in windows.items():
        for (_, end), (start, _) in zip(ws, ws[1:]):
            assert end <= start, f"two micro-batches of {identifier} overlapped: {ws}"
    # across the two pools: some micro-batch of one table ran while one of the other did
    a, b = windows.values()
    assert any(sa < eb and sb < ea for sa, ea in a for sb, eb in b), f"no micro-batches ran in parallel: {windows}"
    for pool in pools:
        info = instance.event_log_storage.get_concurrency_info(pool)
        assert info.slot_count == 1 and info.active_slot_count == 0, (pool, info)
    instance.dispose()
