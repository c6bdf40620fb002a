"""Protobuf and JSON Schema topics with nested records through the whole write path
(run_micro_batch) on the real broker and the stand-in registry: tables created from the subject
(``schema: from_registry``), decoded in the Spark tasks, written by Spark, read back by DuckDB and
pyiceberg. Types covered: struct, list of structs, list of strings, map, oneof, enum,
google.protobuf.Timestamp and a wrapper, bytes (Protobuf); struct, list, map, uuid, date,
date-time, base64 bytes and a multi-type union (JSON Schema). One undecodable record each goes
to the dead-letter table."""

from __future__ import annotations

import datetime as dt
import json

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from devtools import duck
from devtools.demo.data import produce
from devtools.demo.samples import (
    JSON_PLANE,
    T0,
    json_payload,
    protobuf_plane,
    protobuf_plane_class,
    protobuf_schema_str,
)
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.formats import frame
from tests.helpers import make_spec


def _spec(unique: str, topic: str, fmt: str):
    return make_spec(
        f"{fmt}_{unique}",
        topic,
        schema="from_registry",
        partition_by=[],
        format={"type": fmt, "registry_url": "${TEST_REGISTRY_URL}"},
        kafka_columns=["partition", "offset"],
    )


def _run(spark, settings, spec, kafka, catalog, records: int, bad: int):
    result = run_micro_batch(spark, settings, spec, commit_id="run-1", kafka=kafka, catalog=catalog)
    assert (result.records, result.quarantined, dict(result.quarantine_kinds)) == (records, bad, {"undecodable": bad})
    tbl = catalog.load_table(spec.identifier)
    return tbl, duck.connect(), duck.scan_sql(tbl.metadata_location)


def test_protobuf_topic_with_nested_types_through_run_micro_batch(
    broker, kafka_config, topic_factory, unique, registry, spark, settings, kafka, catalog, monkeypatch
):
    topic = topic_factory(unique, partitions=1)
    monkeypatch.setenv("TEST_REGISTRY_URL", registry)
    sid = SchemaRegistryClient({"url": registry}).register_schema(
        f"{topic}-value", Schema(protobuf_schema_str(), "PROTOBUF")
    )
    cls = protobuf_plane_class()
    values = [frame(sid, protobuf_plane(cls, i).SerializeToString(), [0]) for i in range(30)]
    values.append(frame(sid, b"\xff\xff\xff\xff", [0]))  # undecodable
    assert produce(kafka_config, topic, [(None, v, 1_700_000_000_000 + i) for i, v in enumerate(values)]) == 31

    spec = _spec(unique, topic, "protobuf")
    tbl, con, scan = _run(spark, settings, spec, kafka, catalog, 30, 1)
    types = {f.name: str(f.field_type) for f in tbl.schema().fields}
    assert (types["seen_at"], types["seats"], types["kind"], types["code"]) == (
        "timestamptz",
        "long",
        "string",
        "binary",
    )
    assert types["counts"] == "map<string, long>" and types["tags"] == "list<string>"

    got = con.execute(
        f"SELECT count(*), count(jet), count(props), sum(len(flights)), count(seats), "
        f"sum(counts['seats']), sum(len(tags)), count(*) FILTER (kind = 'ROTOR'), max(seen_at) "
        f"FROM {scan}"
    ).fetchone()
    assert got[:8] == (
        30,
        10,
        10,
        sum(i % 3 + 1 for i in range(30)),
        sum(1 for i in range(30) if i % 4),
        sum(100 + i % 50 for i in range(30)),
        sum(len(["a", "b"][: i % 3]) for i in range(30)),
        6,
    )
    assert got[8] == T0 + dt.timedelta(minutes=29)
    back = {r["tailnum"]: r for r in tbl.scan().to_arrow().to_pylist()}
    r7 = back["N00007"]
    assert r7["flights"][1] == {"flight": 71, "dest": "ORD", "dep_delay": 1.5} and r7["jet"] == "jet7"
    assert r7["code"] == b"007" and r7["model"] == "A7" and r7["seats"] == 107 and r7["counts"] == [("seats", 107)]
    assert back["N00004"]["seats"] is None and back["N00004"]["model"] is None


def test_json_schema_topic_with_nested_types_through_run_micro_batch(
    broker, kafka_config, topic_factory, unique, registry, spark, settings, kafka, catalog, monkeypatch
):
    import uuid

    topic = topic_factory(unique, partitions=1)
    monkeypatch.setenv("TEST_REGISTRY_URL", registry)
    sid = SchemaRegistryClient({"url": registry}).register_schema(
        f"{topic}-value", Schema(json.dumps(JSON_PLANE), "JSON")
    )
    values = [frame(sid, json_payload(i)) for i in range(25)] + [frame(sid, b"{not json")]
    assert produce(kafka_config, topic, [(None, v, 1_700_000_000_000 + i) for i, v in enumerate(values)]) == 26

    spec = _spec(unique, topic, "json_schema")
    tbl, con, scan = _run(spark, settings, spec, kafka, catalog, 25, 1)
    types = {f.name: str(f.field_type) for f in tbl.schema().fields}
    assert (types["seen_at"], types["day"], types["raw"], types["id"]) == ("timestamptz", "date", "binary", "string")
    assert tbl.schema().find_field("tailnum").required and not tbl.schema().find_field("year").required

    got = con.execute(
        f"SELECT count(*), sum(len(flights)), sum(counts['seats']), count(engine.member0), "
        f"count(engine.member1), min(day), max(seen_at), max(first_flight.flight) FROM {scan}"
    ).fetchone()
    assert got[:6] == (
        25,
        sum(i % 3 + 1 for i in range(25)),
        sum(100 + i % 50 for i in range(25)),
        sum(1 for i in range(25) if i % 3 and i % 2),
        sum(1 for i in range(25) if i % 3 and not i % 2),
        dt.date(2013, 1, 1),
    )
    assert (got[6], got[7]) == (T0 + dt.timedelta(minutes=24), 24)
    back = {r["tailnum"]: r for r in tbl.scan().to_arrow().to_pylist()}
    r1 = back["N00001"]
    assert r1["raw"] == b"\x00\x01" and uuid.UUID(r1["id"]) == uuid.UUID(int=2) and r1["day"] == dt.date(2013, 1, 2)
    assert r1["seen_at"] == T0 + dt.timedelta(minutes=1) and r1["flights"] == [
        {"flight": 10, "dest": "ATL", "dep_delay": None},
        {"flight": 11, "dest": "ATL", "dep_delay": None},
    ]
    dlq = catalog.load_table(spec.bad_records.dead_letter_identifier)
    assert con.execute(f'SELECT "offset", error_kind FROM {duck.scan_sql(dlq.metadata_location)}').fetchall() == [
        (25, "undecodable")
    ]


def test_writer_uuid_and_fixed_fit_the_string_and_binary_columns_spark_creates():
    from pyiceberg.schema import Schema as IcebergSchema
    from pyiceberg.types import BinaryType, FixedType, LongType, NestedField, StringType, UUIDType

    from kafka_iceberg.formats import classify

    table = IcebergSchema(NestedField(1, "id", StringType()), NestedField(2, "code", BinaryType()))
    writer = IcebergSchema(NestedField(1, "id", UUIDType()), NestedField(2, "code", FixedType(3)))
    assert classify(table, writer).kind == "none"
    assert classify(writer, table).kind == "blocked"  # not the other way round
    assert classify(table, IcebergSchema(NestedField(1, "id", LongType()))).kind == "blocked"
