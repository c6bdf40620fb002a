"""Upsert tables (``mode: upsert``) through the real write path: TableWriter plans, reads from
the real broker, merges into the attempt branch and publishes with the conditional fast-forward."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer

from kafka_iceberg.catalog.tables import read_state
from kafka_iceberg.errors import ConfigError
from kafka_iceberg.ops.checks import duplicate_free
from tests.helpers import make_spec


def produce(kafka_config, topic: str, records, partition: int = 0) -> None:
    producer = Producer(kafka_config.client_conf())
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0


def event(i: int, amount: float) -> bytes:
    return json.dumps({"id": i, "name": f"n{i}", "amount": amount, "event_time": "2023-11-14T10:00:00Z"}).encode()


def upsert_spec(name: str, topic: str, **overrides):
    return make_spec(
        name,
        topic,
        mode="upsert",
        key=["id"],
        cdc="none",
        partition_by=[],
        bad_records={"policy": "quarantine", "max_quarantine_rate": 1.0},
        **overrides,
    )


def test_plain_upserts_through_the_write_path(
    spark, settings, catalog, kafka_config, topic_factory, writer_factory, unique
):
    topic = topic_factory(unique, partitions=2)
    spec = upsert_spec(unique, topic)
    writer = writer_factory(spec)
    produce(
        kafka_config,
        topic,
        [
            (b"1", event(1, 1.0)),
            (b"2", event(2, 2.0)),
            (b"1", event(1, 1.5)),
            (b"3", event(3, 3.0)),
            (None, event(9, 9.0)),
        ],
    )
    produce(kafka_config, topic, [(b"4", event(4, 4.0))], partition=1)
    first = writer.execute(writer.plan(), "run-1")
    assert first.committed and first.quarantined == 1
    produce(kafka_config, topic, [(b"3", None), (b"2", event(2, 2.5)), (b"5", event(5, 5.0)), (b"5", None)])
    second = writer.execute(writer.plan(), "run-2")
    assert second.committed
    table = f"{settings.catalog.name}.{spec.identifier}"
    got = {r["id"]: r["amount"] for r in spark.table(table).collect()}
    assert got == {1: 1.5, 2: 2.5, 4: 4.0}
    state = read_state(catalog, spec.identifier)
    assert state.offsets == {0: 9, 1: 1}
    assert {r[0] for r in spark.sql(f"SELECT content FROM {table}.delete_files").collect()} == {1}
    props = dict(spark.sql(f"SHOW TBLPROPERTIES {table}").collect())
    assert props["write.update.mode"] == "merge-on-read" and props["format-version"] == "2"
    dead = spark.table(f"{settings.catalog.name}.{spec.bad_records.dead_letter_identifier}").collect()
    assert [(r["offset"], r["error_kind"]) for r in dead] == [(4, "missing_key")]
    outcome = duplicate_free(spark, table, spec, writer.view())
    assert outcome.passed and outcome.figures["duplicate_keys"] == 0
    # the merged rows keep the Kafka coordinates of their last change
    assert {r["id"]: r["_kafka_offset"] for r in spark.table(table).collect()} == {1: 2, 2: 6, 4: 0}
    spark.sql(f"INSERT INTO {table} SELECT * FROM {table} WHERE id = 4")  # a second row for key 4
    outcome = duplicate_free(spark, table, spec, writer.view())
    assert (
        not outcome.passed
        and outcome.figures["duplicate_keys"] == 1
        and "keys (id) in more than one row" in outcome.summary
    )


def test_upsert_declaration_errors():
    with pytest.raises(ConfigError, match="mode upsert needs 'key'"):
        make_spec("x", "t", mode="upsert", cdc="none")
    with pytest.raises(ConfigError, match="not supported with mode: upsert"):
        make_spec("x", "t", mode="upsert", key=["id"], cdc="none", unknown_fields="evolve")
    assert make_spec("x", "t").upsert is None
