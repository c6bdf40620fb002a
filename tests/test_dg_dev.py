"""A team's own project, made as ``create-dagster project`` lays it out, with the lake as a dependency:
``dg scaffold defs`` of the Component and one table in its ``defs.yaml`` are all the code there is.
Under ``dg dev`` (webserver and daemon, a fresh instance), with no sensor or run started by hand, the
table is ingested exactly once from a real Kafka-protocol broker (the dev broker) into a JDBC catalog.

Outside the repository's checkout nothing falls back to a development default: the test unsets
``LAKE_DEV`` and names the broker, the catalog and the warehouse, as a team's environment would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer

from devtools import duck
from devtools.demo.data import create_topic
from devtools.services import devbroker
from kafka_iceberg.catalog.tables import load_catalog
from kafka_iceberg.config.settings import load_settings
from kafka_iceberg.kafka.admin import KafkaConfig
from tests.test_component import COMPONENT, DG, _team_project

RECORDS = 500


def _produce(bootstrap: str, topic: str) -> None:
    """``RECORDS`` JSON orders ``{"id": i, "amount": i / 2}`` on a topic of 2 partitions."""
    create_topic(KafkaConfig(bootstrap, {}), topic, 2)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(RECORDS):
        producer.produce(topic, key=str(i).encode(), value=json.dumps({"id": i, "amount": i / 2}).encode())
    assert producer.flush(30) == 0


def _declare_one_table(project: Path, env: dict[str, str], topic: str) -> None:
    """``dg scaffold defs`` of the Component, then its commented starter table, on ``topic``."""
    out = subprocess.run(
        [DG, "scaffold", "defs", COMPONENT, "ingest"], cwd=project, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout + out.stderr
    defs_yaml = project / "src" / "team_proj" / "defs" / "ingest" / "defs.yaml"
    starter = defs_yaml.read_text()
    table = [line.replace("  #", "  ", 1) for line in starter.splitlines() if line.startswith(("  #  -", "  #    "))]
    declared = "  tables:\n" + "\n".join(table).replace("topic: shop.orders", f"topic: {topic}") + "\n"
    defs_yaml.write_text(starter.replace("  tables: []\n", declared))


def _rows(settings) -> tuple[int, int, int]:
    """(rows, distinct (partition, offset), distinct id) of ``shop.orders``, read by DuckDB; zeros before it exists."""
    catalog = load_catalog(settings.catalog)
    if not catalog.table_exists("shop.orders"):
        return 0, 0, 0
    location = catalog.load_table("shop.orders").metadata_location
    return (
        duck.connect()
        .execute(
            "SELECT count(*), count(DISTINCT (_kafka_partition, _kafka_offset)), count(DISTINCT id) "
            f"FROM {duck.scan_sql(location)}"
        )
        .fetchone()
    )


def test_dg_dev_ingests_the_scaffolded_table_exactly_once(tmp_path, broker):
    project = _team_project(tmp_path / "team_proj")
    topic = f"shop.orders.{uuid.uuid4().hex[:8]}"
    _produce(broker, topic)
    lake = tmp_path / "lake"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKE_", "DAGSTER_HOME"))}
    env.update(
        PYTHONPATH=str(project / "src"),
        DAGSTER_HOME=str(tmp_path / "dagster"),
        KAFKA_BOOTSTRAP_SERVERS=broker,
        LAKE_HOME=str(lake),
        LAKE_CATALOG_URI=f"sqlite:///{lake / 'catalog.db'}",
        LAKE_WAREHOUSE=f"file://{lake / 'warehouse'}",
        LAKE_METRICS_PORT="0",
        SPARK_MASTER="local[1]",
        LAKE_SPARK_CONF=json.dumps({"spark.driver.memory": "1g"}),
    )
    (tmp_path / "dagster").mkdir()
    _declare_one_table(project, env, topic)
    settings = load_settings(env=env)
    log = (tmp_path / "dg-dev.log").open("w")
    dev = subprocess.Popen(
        [DG, "dev", "--port", str(devbroker.free_port())],
        cwd=project,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline, rows = time.monotonic() + 600, (0, 0, 0)
        while time.monotonic() < deadline and rows[0] < RECORDS and dev.poll() is None:
            time.sleep(3)
            rows = _rows(settings)
        time.sleep(5)  # a second micro-batch, if one came, would have committed by now
        rows = _rows(settings)
    finally:
        os.killpg(dev.pid, signal.SIGTERM)
        try:
            dev.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(dev.pid, signal.SIGKILL)
        log.close()
    tail = (tmp_path / "dg-dev.log").read_text()[-3000:]
    assert rows == (RECORDS, RECORDS, RECORDS), f"rows, distinct offsets, distinct ids: {rows}\n{tail}"
