"""The write path on a real Spark standalone cluster: a master and two workers on loopback.

The driver runs in a subprocess (tests/cluster_batch.py) with ``SPARK_MASTER=spark://...``, so its
SparkContext does not clash with the session's local[2] one. Executors get the project's Python
through ``spark.pyspark.python`` (this interpreter); the read tasks run on them. pyiceberg and
DuckDB then count the rows independently of Spark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kafka_iceberg.catalog.tables import load_catalog, load_table
from kafka_iceberg.config.settings import load_settings
from tests.helpers import event_records, spec_dict
from tests.spark_cluster import duck, produce, start_cluster

CHECKOUT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1, memory="1g")
    yield cluster
    cluster.stop()


def _driver(env: dict[str, str], raw: dict, commit_id: str) -> dict:
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


def test_micro_batches_on_a_standalone_cluster(spark_cluster, broker, kafka_config, topic_factory, unique, tmp_path):
    assert spark_cluster.alive_workers() == 2
    topic = topic_factory(unique, partitions=4)
    produce(kafka_config, topic, event_records(range(4000)))
    raw = spec_dict(unique, topic, max_records_per_partition=100_000)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(CHECKOUT), os.environ.get("PYTHONPATH", "")]),
        "LAKE_HOME": str(tmp_path / "lake"),
        "KAFKA_BOOTSTRAP_SERVERS": broker,
        "SPARK_MASTER": spark_cluster.url,
        "LAKE_MAX_RECORDS_PER_TASK": "500",  # 4 partitions x 1000 records -> 8 read tasks
        "LAKE_SPARK_CONF": json.dumps(
            {
                "spark.driver.memory": "1g",
                "spark.executor.memory": "512m",
                "spark.executor.cores": "1",
                "spark.cores.max": "2",
                "spark.pyspark.python": sys.executable,
            }
        ),
    }
    first = _driver(env, raw, f"cluster-{uuid.uuid4()}")
    assert first["master"] == spark_cluster.url
    assert first["committed"] and first["records"] == 4000 and first["check_passed"]
    assert len(first["executor_tasks"]) == 2, first["executor_tasks"]  # one executor per worker
    assert all(n > 0 for n in first["executor_tasks"].values()), first["executor_tasks"]

    produce(kafka_config, topic, event_records(range(4000, 5000)))
    second = _driver(env, raw, f"cluster-{uuid.uuid4()}")
    assert second["committed"] and second["records"] == 1000 and second["check_passed"]

    settings = load_settings(env={k: v for k, v in env.items() if k.startswith(("LAKE_", "KAFKA_", "SPARK_"))})
    table = load_table(load_catalog(settings.catalog), f"test.{unique}")
    assert table.scan().to_arrow().num_rows == 5000  # pyiceberg
    assert duck.count_rows(table.metadata_location) == 5000  # DuckDB
