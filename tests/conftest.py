"""Fixtures: a real Kafka-protocol broker (noida-db), real Spark (local mode) and a real
Iceberg JDBC catalog (SQLite), all under one temporary ``LAKE_HOME`` per test session.

Each test declares its own topic and table (unique names), so tests share the broker,
the Spark session and the catalog without seeing each other's data.
"""

from __future__ import annotations

import itertools
import socket
import uuid
from pathlib import Path

import pytest

from kafka_iceberg import devbroker
from kafka_iceberg.catalog import get_spark, load_catalog
from kafka_iceberg.demo_data import create_topic
from kafka_iceberg.kafka_client import KafkaConfig, KafkaMetadata
from kafka_iceberg.pipeline import TableWriter
from kafka_iceberg.settings import load_settings
from kafka_iceberg.spec import TableSpec

_names = itertools.count()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def lake_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lake")


@pytest.fixture(scope="session")
def broker(lake_home):
    data_dir = lake_home / "kafka"
    bootstrap = devbroker.start(data_dir, _free_port())
    yield bootstrap
    devbroker.stop(data_dir)


@pytest.fixture(scope="session")
def settings(lake_home, broker):
    return load_settings(
        env={
            "LAKE_HOME": str(lake_home),
            "KAFKA_BOOTSTRAP_SERVERS": broker,
            "SPARK_MASTER": "local[2]",
            "LAKE_SPARK_DRIVER_MEMORY": "1g",
            "LAKE_READ_TIMEOUT_S": "30",
            "LAKE_KAFKA_TIMEOUT_S": "15",
        }
    )


@pytest.fixture(scope="session")
def spark(settings):
    session = get_spark(settings)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kafka_config(settings) -> KafkaConfig:
    return KafkaConfig(settings.kafka_bootstrap_servers, {}, settings.kafka_timeout_s)


@pytest.fixture(scope="session")
def kafka(kafka_config) -> KafkaMetadata:
    return KafkaMetadata(kafka_config)


@pytest.fixture()
def catalog(settings):
    return load_catalog(settings.catalog)


@pytest.fixture()
def unique() -> str:
    """A short unique name for this test's topic and table."""
    return f"t{next(_names)}_{uuid.uuid4().hex[:6]}"


@pytest.fixture()
def topic_factory(kafka_config):
    """Create a topic with N partitions and return its name."""

    def make(name: str, partitions: int = 3) -> str:
        topic = f"events.{name}"
        create_topic(kafka_config, topic, partitions, {"retention.ms": "-1"})
        return topic

    return make


@pytest.fixture()
def writer_factory(spark, settings, kafka, catalog):
    def make(spec: TableSpec) -> TableWriter:
        w = TableWriter(spark, settings, spec, kafka, catalog)
        w.ensure_table()
        return w

    return make
