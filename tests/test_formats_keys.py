"""Parsed keys (``key_format``) through the whole write path (run_micro_batch) on the real broker
and the stand-in registry: an Avro key becomes the struct column ``_kafka_key_parsed`` (its
fields read back by DuckDB and pyiceberg, the raw key bytes kept in ``_kafka_key``), and each
kind of bad key (missing magic byte, unknown schema id, undecodable; for json keys, not JSON and a
required field missing) goes to the dead-letter table with its reason."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from devtools import duck
from devtools.demo.data import produce
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.errors import ConfigError
from kafka_iceberg.formats import frame
from tests.helpers import make_spec

KEY = {
    "type": "record",
    "name": "PlaneKey",
    "namespace": "test",
    "fields": [{"name": "tailnum", "type": "string"}, {"name": "day", "type": {"type": "int", "logicalType": "date"}}],
}
VALUE = {
    "type": "record",
    "name": "Seen",
    "namespace": "test",
    "fields": [{"name": "seats", "type": "int"}, {"name": "model", "type": ["null", "string"], "default": None}],
}
DAY0 = dt.date(2013, 1, 1)


def _dead_letters(con, catalog, spec) -> list[tuple]:
    dlq = catalog.load_table(spec.bad_records.dead_letter_identifier)
    return con.execute(
        f'SELECT "offset", error_kind, error FROM {duck.scan_sql(dlq.metadata_location)} ORDER BY 1'
    ).fetchall()


def test_avro_key_parsed_into_a_struct_column_and_bad_keys_quarantined(
    broker, kafka_config, topic_factory, unique, registry, spark, settings, kafka, catalog, monkeypatch
):
    topic = topic_factory(unique, partitions=1)
    monkeypatch.setenv("TEST_REGISTRY_URL", registry)
    sr = SchemaRegistryClient({"url": registry})
    key_sid = sr.register_schema(f"{topic}-key", Schema(json.dumps(KEY), "AVRO"))
    sr.register_schema(f"{topic}-value", Schema(json.dumps(VALUE), "AVRO"))
    kser, vser = AvroSerializer(sr, json.dumps(KEY)), AvroSerializer(sr, json.dumps(VALUE))
    kctx, vctx = SerializationContext(topic, MessageField.KEY), SerializationContext(topic, MessageField.VALUE)
    good = [
        (
            kser({"tailnum": f"N{i:03d}", "day": DAY0 + dt.timedelta(days=i)}, kctx),
            vser({"seats": 100 + i, "model": f"A{i}"}, vctx),
        )
        for i in range(8)
    ]
    value = vser({"seats": 1, "model": None}, vctx)
    bad = [(b"N999", value), (frame(99_999, b"\x02x"), value), (frame(key_sid, b"\xff\xff\xff\xff"), value)]
    records = good + [(None, value)] + bad  # offsets 0-7 good, 8 without a key, 9-11 bad keys
    assert produce(kafka_config, topic, [(k, v, 1_700_000_000_000 + i) for i, (k, v) in enumerate(records)]) == 12

    fmt = {"type": "avro", "registry_url": "${TEST_REGISTRY_URL}"}
    spec = make_spec(
        f"keys_{unique}",
        topic,
        schema="from_registry",
        partition_by=[],
        format=fmt,
        key_format=fmt,
        kafka_columns=["partition", "offset", "key"],
    )
    result = run_micro_batch(spark, settings, spec, commit_id="run-k", kafka=kafka, catalog=catalog)
    assert (result.records, result.quarantined) == (9, 3)
    assert dict(result.quarantine_kinds) == {"missing_magic_byte": 1, "unknown_schema_id": 1, "undecodable": 1}

    tbl = catalog.load_table(spec.identifier)
    key_type = tbl.schema().find_field("_kafka_key_parsed").field_type
    assert [(f.name, str(f.field_type)) for f in key_type.fields] == [("tailnum", "string"), ("day", "date")]
    con = duck.connect()
    rows = con.execute(
        f"SELECT _kafka_offset, _kafka_key_parsed.tailnum, _kafka_key_parsed.day, seats, _kafka_key "
        f"FROM {duck.scan_sql(tbl.metadata_location)} ORDER BY 1"
    ).fetchall()
    assert [r[:4] for r in rows] == [(i, f"N{i:03d}", DAY0 + dt.timedelta(days=i), 100 + i) for i in range(8)] + [
        (8, None, None, 1)
    ]
    assert [bytes(r[4]) for r in rows[:8]] == [k for k, _ in good] and rows[8][4] is None  # raw key bytes kept
    back = tbl.scan().to_arrow().sort_by("_kafka_offset").to_pylist()
    assert back[3]["_kafka_key_parsed"] == {"tailnum": "N003", "day": DAY0 + dt.timedelta(days=3)}

    dead = _dead_letters(con, catalog, spec)
    assert [(o, k) for o, k, _ in dead] == [(9, "missing_magic_byte"), (10, "unknown_schema_id"), (11, "undecodable")]
    assert all(reason.startswith("the key: ") for _, _, reason in dead) and "99999" in dead[1][2]


def test_json_key_parsed_with_a_declared_key_schema(
    broker, kafka_config, topic_factory, unique, spark, settings, kafka, catalog
):
    topic = topic_factory(unique, partitions=1)
    value = json.dumps({"id": 1, "name": "n", "amount": 1.5, "event_time": "2023-11-14T00:00:00Z"}).encode()
    keys = [json.dumps({"tenant": f"t{i}", "shard": i}).encode() for i in range(4)]
    keys += [b"not json", json.dumps({"shard": 9}).encode(), json.dumps({"tenant": "t", "shard": "x"}).encode()]
    assert produce(kafka_config, topic, [(k, value, 1_700_000_000_000 + i) for i, k in enumerate(keys)]) == 7
    key_format = {
        "type": "json",
        "schema": [{"name": "tenant", "type": "string", "required": True}, {"name": "shard", "type": "int"}],
    }
    spec = make_spec(f"jkeys_{unique}", topic, key_format=key_format, kafka_columns=["partition", "offset"])
    result = run_micro_batch(spark, settings, spec, commit_id="run-j", kafka=kafka, catalog=catalog)
    assert (result.records, result.quarantined, dict(result.quarantine_kinds)) == (4, 3, {"malformed": 1, "schema": 2})

    tbl = catalog.load_table(spec.identifier)
    con = duck.connect()
    got = con.execute(
        f"SELECT _kafka_key_parsed.tenant, _kafka_key_parsed.shard FROM "
        f"{duck.scan_sql(tbl.metadata_location)} ORDER BY 2"
    ).fetchall()
    assert got == [(f"t{i}", i) for i in range(4)]
    dead = _dead_letters(con, catalog, spec)
    assert [(o, k) for o, k, _ in dead] == [(4, "malformed"), (5, "schema"), (6, "schema")]
    assert "required field tenant" in dead[1][2] and dead[0][2].startswith("the key is not a JSON object")


@pytest.mark.parametrize(
    "key_format, message",
    [
        ({"type": "json"}, "key_format json needs key_format.schema"),
        ("avro", None),
    ],
)
def test_key_format_declarations(key_format, message):
    if message is None:
        spec = make_spec("k", "t", key_format=key_format)
        assert spec.key_format.type == "avro" and spec.key_format.columns == ()
        with pytest.raises(ConfigError, match="format.schema is only for key_format"):
            make_spec("k", "t", format={"type": "json", "schema": [{"name": "a", "type": "int"}]})
        with pytest.raises(ConfigError, match="not supported with mode: upsert"):
            make_spec("k", "t", key_format="avro", mode="upsert", key=["id"], cdc="none")
    else:
        with pytest.raises(ConfigError, match=message):
            make_spec("k", "t", key_format=key_format)
