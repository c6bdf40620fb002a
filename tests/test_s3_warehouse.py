"""A warehouse on a local S3-compatible server (PyPI moto[server]), read by pyiceberg, DuckDB
(httpfs from PyPI duckdb-extension-httpfs) and the project's own reads (kafka_iceberg.catalog,
kafka_iceberg.duck). The catalog comes from one :class:`CatalogConfig` with ``s3.*`` properties.

Spark is not exercised here: Iceberg's S3FileIO needs the AWS SDK (iceberg-aws-bundle), which no
reachable registry carries (docs/deployment.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pyarrow as pa
import pytest

from kafka_iceberg import duck
from kafka_iceberg.catalog import load_table, metadata_view, read_state
from kafka_iceberg.catalog_config import catalog_config_from_env
from kafka_iceberg.state import KEY_BATCH, KEY_COMMIT_ID, KEY_OFFSETS, KEY_RECORDS, KEY_TOPIC
from tests.spark_cluster import free_port

KEY, SECRET, REGION = "lake-test-key", "lake-test-secret", "us-east-1"


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    """``http://127.0.0.1:PORT`` of a moto S3 server (stopped after the module)."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                         region_name=REGION).list_buckets()
            break
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"moto_server did not start (log {log})")
            time.sleep(0.2)
    yield endpoint
    proc.terminate()
    proc.wait(10)


def test_s3_warehouse_pyiceberg_duckdb_and_project_reads(s3_endpoint, tmp_path, unique):
    bucket = f"lake-{unique.replace('_', '-')}"
    boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                 region_name=REGION).create_bucket(Bucket=bucket)
    env = {  # as a pod gets it: properties from the ConfigMap, keys from the Secret
        "LAKE_CATALOG_PROPERTIES": json.dumps({"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                                               "warehouse": f"s3://{bucket}/warehouse", "s3.endpoint": s3_endpoint,
                                               "s3.region": REGION}),
        "PYICEBERG_CATALOG__LAKE__S3__ACCESS_KEY_ID": KEY,
        "PYICEBERG_CATALOG__LAKE__S3__SECRET_ACCESS_KEY": SECRET,
    }
    cfg = catalog_config_from_env(env)
    catalog = cfg.load()
    catalog.create_namespace("db")
    table = catalog.create_table("db.events", schema=pa.schema([("id", pa.int64()), ("name", pa.string())]))
    assert table.metadata_location.startswith(f"s3://{bucket}/warehouse/db/events/metadata/")
    for batch, (start, end) in enumerate([(0, 600), (600, 1000)]):
        rows = pa.table({"id": pa.array(range(start, end), pa.int64()), "name": [f"n{i}" for i in range(start, end)]})
        table.append(rows, snapshot_properties={
            KEY_TOPIC: "events.s3", KEY_OFFSETS: json.dumps({"0": end}), KEY_BATCH: json.dumps({"0": [start, end]}),
            KEY_COMMIT_ID: f"run-{batch}", KEY_RECORDS: str(end - start)})
    objects = boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                           region_name=REGION).list_objects_v2(Bucket=bucket, Prefix="warehouse/db/events/data/")
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
