"""The formats inside Spark: schema ids found by a Spark job, records decoded in the tasks
(mapInArrow), good rows written by Spark's Iceberg writer and read back by DuckDB; bad records
kept with their kind for the dead-letter table."""

from __future__ import annotations

import json
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from devtools import duck
from devtools.demo.samples import AVRO_PLANE, avro_plane
from kafka_iceberg.formats import frame, resolve, table_schema_from_subject
from kafka_iceberg.formats.spark import ERROR, ERROR_KIND, classify_formatted, decode_dataframe, schema_ids_in


def _records(broker: str, topic: str, n: int) -> list[tuple[int, int, bytes]]:
    c = Consumer({"bootstrap.servers": broker, "group.id": "formats-spark-test", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    out, deadline = [], time.monotonic() + 30
    while len(out) < n and time.monotonic() < deadline:
        out += [(m.partition(), m.offset(), m.value()) for m in c.consume(1000, timeout=1.0) if m.error() is None]
    c.close()
    return out


def test_avro_decoded_in_spark_tasks_and_written_by_spark(
    broker, topic_factory, unique, registry, spark, settings, catalog
):
    topic = topic_factory(unique, partitions=1)
    sr = SchemaRegistryClient({"url": registry})
    ser = AvroSerializer(sr, json.dumps(AVRO_PLANE))
    ctx = SerializationContext(topic, MessageField.VALUE)
    values = [ser(avro_plane(i), ctx) for i in range(50)]
    values[10], values[20] = b"plain text", frame(9999, b"\x00")
    p = Producer({"bootstrap.servers": broker})
    for v in values:
        p.produce(topic, value=v, partition=0)
    assert p.flush(30) == 0
    del p  # no client left to reconnect after the broker stops

    raw = spark.createDataFrame(_records(broker, topic, 50), "partition INT, offset BIGINT, value BINARY").repartition(
        3
    )
    ids = schema_ids_in(raw)
    registered = SchemaRegistryClient({"url": registry}).get_latest_version(f"{topic}-value").schema_id
    assert ids == {registered, 9999}  # the plain-text value has no magic byte: not an id
    writers = resolve(registry, ids)
    assert writers[9999] is None
    schema = table_schema_from_subject(registry, f"{topic}-value")
    decoded = decode_dataframe(raw, writers, schema, "avro").cache()

    bad = {r["offset"]: r[ERROR_KIND] for r in decoded.where(decoded[ERROR].isNotNull()).collect()}
    assert bad == {10: "missing_magic_byte", 20: "unknown_schema_id"}

    ns = f"fmt_{unique}"
    catalog.create_namespace_if_not_exists(ns)
    catalog.create_table(f"{ns}.planes", schema=schema)
    good = decoded.where(decoded[ERROR].isNull()).select("j.*")
    good.writeTo(f"{settings.catalog.name}.{ns}.planes").append()

    tbl = catalog.load_table(f"{ns}.planes")
    con = duck.connect()
    got = con.execute(
        f"SELECT count(*), sum(len(flights)), count(engine.member1), min(seen_at), max(price) "
        f"FROM {duck.scan_sql(tbl.metadata_location)}"
    ).fetchone()
    kept = [i for i in range(50) if i not in (10, 20)]
    assert got[0] == 48 and got[1] == sum(i % 3 + 1 for i in kept)
    assert got[2] == sum(1 for i in kept if i % 3 and not i % 2) and str(got[4]) == "49.25"
    row = tbl.scan(row_filter="tailnum == 'N00003'").to_arrow().to_pylist()[0]
    assert str(row["id"]) == str(avro_plane(3)["id"]) and row["code"] == b"003" and row["counts"] == [("seats", 103)]


def test_classify_formatted_has_the_shape_of_the_json_classification(
    broker, topic_factory, unique, registry, spark, settings
):
    from kafka_iceberg.kafka.records import RAW_SCHEMA_DDL

    sr = SchemaRegistryClient({"url": registry})
    ser = AvroSerializer(sr, json.dumps(AVRO_PLANE))
    ctx = SerializationContext(f"{unique}-topic", MessageField.VALUE)
    values = [ser(avro_plane(i), ctx) for i in range(6)] + [None, b"x" * 5000, b"\x01junk"]
    rows = [("t", 0, i, 1_700_000_000_000 + i, b"k", v, None) for i, v in enumerate(values)]
    raw = spark.createDataFrame(rows, RAW_SCHEMA_DDL)
    writers = resolve(registry, schema_ids_in(raw))
    schema = table_schema_from_subject(registry, f"{unique}-topic-value")
    out = classify_formatted(raw, schema, "avro", writers, max_record_bytes=4096)
    assert out.columns == [*raw.columns, "j", "_problem"]
    got = {r["offset"]: (r["_problem"]["kind"] if r["_problem"] else r["j"]["tailnum"]) for r in out.collect()}
    assert got == {
        0: "N00000",
        1: "N00001",
        2: "N00002",
        3: "N00003",
        4: "N00004",
        5: "N00005",
        6: "tombstone",
        7: "oversize",
        8: "missing_magic_byte",
    }
