"""The write path on a PostgreSQL JDBC catalog (Debian's postgresql, started by a fixture),
including two processes committing to two tables at the same time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from devtools import duck
from devtools.demo.data import produce
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.catalog.spark import catalog_conf
from kafka_iceberg.catalog.tables import load_catalog, load_table
from kafka_iceberg.config.settings import load_settings
from tests.helpers import event_records, make_spec, new_database, spec_dict


@pytest.fixture(scope="module")
def postgres_uri(postgres_server):
    """A database of this module's own on the session's PostgreSQL server (a private PostgreSQL on a free
    loopback port, :mod:`devtools.services.devpostgres`); its URI."""
    return new_database(postgres_server, "catalog")


@pytest.fixture(scope="module")
def pg_settings(postgres_uri, lake_home, broker, spark):
    settings = load_settings(
        env={
            "LAKE_HOME": str(lake_home),
            "KAFKA_BOOTSTRAP_SERVERS": broker,
            "LAKE_CATALOG_NAME": "pg",
            "LAKE_CATALOG_URI": postgres_uri,
            "LAKE_WAREHOUSE": f"file://{lake_home / 'pg-warehouse'}",
        }
    )
    load_catalog(settings.catalog)  # creates the catalog tables
    for key, value in catalog_conf(settings.catalog).items():  # register catalog "pg" in the running session
        spark.conf.set(key, value)
    return settings


def test_micro_batches_on_a_postgresql_catalog(spark, pg_settings, kafka, kafka_config, unique, topic_factory):
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(500)))
    spec = make_spec(unique, topic, max_records_per_partition=150)
    catalog = load_catalog(pg_settings.catalog)
    total = 0
    for _ in range(5):
        r = run_micro_batch(spark, pg_settings, spec, commit_id=f"pg-{unique}-{total}", kafka=kafka, catalog=catalog)
        total += r.records
        if r.total_lag == 0:
            break
    assert total == 500
    table = load_table(catalog, spec.identifier)
    assert duck.count_rows(table.metadata_location) == 500
    ids = {row["id"] for row in spark.table(f"pg.{spec.identifier}").select("id").collect()}
    assert ids == set(range(500))


def test_two_processes_commit_to_two_tables_concurrently(pg_settings, kafka_config, unique, topic_factory):
    specs = []
    for suffix in ("a", "b"):
        topic = topic_factory(f"{unique}{suffix}", partitions=2)
        produce(kafka_config, topic, event_records(range(3000)))
        specs.append(spec_dict(f"{unique}{suffix}", topic, max_records_per_partition=500))
    code = textwrap.dedent(
        """
        import json, sys
        from kafka_iceberg.catalog.spark import get_spark
        from kafka_iceberg.batch.pipeline import run_micro_batch
        from kafka_iceberg.config.settings import load_settings
        from kafka_iceberg.declaration.spec import parse_table_spec
        settings = load_settings()
        spec = parse_table_spec(json.loads(sys.argv[1]))
        spark = get_spark(settings)
        for batch in range(50):
            r = run_micro_batch(spark, settings, spec, commit_id=f"{spec.name}-{batch}")
            if r.total_lag == 0:
                break
        """
    )
    env = {
        **os.environ,
        "LAKE_HOME": str(pg_settings.lake_home),
        "KAFKA_BOOTSTRAP_SERVERS": pg_settings.kafka_bootstrap_servers,
        "LAKE_CATALOG_NAME": "pg",
        "LAKE_CATALOG_URI": _uri(pg_settings),
        "LAKE_WAREHOUSE": pg_settings.catalog.warehouse,
        "SPARK_MASTER": "local[1]",
        "LAKE_SPARK_CONF": json.dumps({"spark.driver.memory": "1g"}),
    }
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(raw)], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
        )
        for raw in specs
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()[-3000:]
    assert time.monotonic() - t0 < 600
    catalog = load_catalog(pg_settings.catalog)
    for raw in specs:
        table = load_table(catalog, raw["identifier"])
        assert duck.count_rows(table.metadata_location) == 3000
        ingest = [
            s
            for s in table.metadata.snapshots
            if "kafka.batch" in (s.summary.additional_properties if s.summary else {})
        ]
        assert len(ingest) >= 3, "each table took several micro-batches, interleaved with the other process"


def _uri(settings) -> str:
    cat = settings.catalog
    return cat.sqlalchemy_uri.replace("postgresql+psycopg2://", "postgresql://")
