"""Registry formats through the whole write path (run_micro_batch): an Avro topic with nested
records on the real broker and the stand-in registry, a table created from the subject, a bad
record quarantined with its kind, an evolvable change (a new nested field, a new top-level field,
an int->long promotion) applied before the write, a blocked change quarantined and reported, and
the schema ids in the snapshot summary; the table read back by DuckDB."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from devtools import duck
from devtools.demo.data import produce
from devtools.services.devbroker import free_port
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.state import KEY_QUARANTINE_KINDS, KEY_SCHEMA_CHANGES, KEY_SCHEMA_IDS
from tests.helpers import make_spec

FLIGHT = {
    "type": "record",
    "name": "Flight",
    "fields": [{"name": "flight", "type": "int"}, {"name": "dest", "type": "string"}],
}


def plane_schema(version: int) -> dict:
    """v1: nested struct and list of structs; v2: seats int->long, engine.power and model added;
    v3 (blocked): seats long->string."""
    engine = [{"name": "kind", "type": "string"}]
    if version >= 2:
        engine.append({"name": "power", "type": ["null", "int"], "default": None})
    seats = {1: "int", 2: "long", 3: "string"}[version]
    fields = [
        {"name": "tailnum", "type": "string"},
        {"name": "seats", "type": seats},
        {"name": "engine", "type": {"type": "record", "name": "Engine", "fields": engine}},
        {"name": "flights", "type": {"type": "array", "items": FLIGHT}},
    ]
    if version >= 2:
        fields.append({"name": "model", "type": ["null", "string"], "default": None})
    return {"type": "record", "name": "Plane", "namespace": "test", "fields": fields}


def plane(i: int, version: int) -> dict:
    rec = {
        "tailnum": f"N{i:04d}",
        "seats": 100 + i,
        "engine": {"kind": "jet"},
        "flights": [{"flight": i * 10 + k, "dest": "IAH"} for k in range(i % 3 + 1)],
    }
    if version >= 2:
        rec["engine"]["power"], rec["model"] = 1000 + i, f"A{i}"
    if version == 3:
        rec["seats"] = str(rec["seats"])
    return rec


def _produce(kafka_config, registry: str, topic: str, version: int, ids) -> int:
    ser = AvroSerializer(SchemaRegistryClient({"url": registry}), json.dumps(plane_schema(version)))
    ctx = SerializationContext(topic, MessageField.VALUE)
    return produce(kafka_config, topic, [(None, ser(plane(i, version), ctx), 1_700_000_000_000 + i) for i in ids])


def test_avro_topic_through_run_micro_batch(
    broker, kafka_config, topic_factory, unique, registry, spark, settings, kafka, catalog, monkeypatch
):
    topic = topic_factory(unique, partitions=1)
    monkeypatch.setenv("TEST_REGISTRY_URL", registry)
    spec = make_spec(
        f"planes_{unique}",
        topic,
        schema="from_registry",
        partition_by=[],
        format={"type": "avro", "registry_url": "${TEST_REGISTRY_URL}"},
        unknown_fields="evolve",
        kafka_columns=["partition", "offset"],
    )
    SchemaRegistryClient({"url": registry}).register_schema(
        f"{topic}-value", Schema(json.dumps(plane_schema(1)), "AVRO")
    )
    assert _produce(kafka_config, registry, topic, 1, range(20)) == 20
    assert produce(kafka_config, topic, [(None, b"not avro at all", 1_700_000_000_100)]) == 1

    first = run_micro_batch(spark, settings, spec, commit_id="run-1", kafka=kafka, catalog=catalog)
    assert (first.records, first.quarantined, dict(first.quarantine_kinds)) == (20, 1, {"missing_magic_byte": 1})

    assert _produce(kafka_config, registry, topic, 2, range(20, 30)) == 10  # evolvable: promotion + new fields
    second = run_micro_batch(spark, settings, spec, commit_id="run-2", kafka=kafka, catalog=catalog)
    assert (second.records, second.quarantined) == (10, 0)
    assert {(c["column"], c["change"]) for c in second.schema_changes} == {
        ("seats", "promotion"),
        ("engine.power", "evolvable"),
        ("model", "evolvable"),
    }

    v2_id = SchemaRegistryClient({"url": registry}).get_latest_version(f"{topic}-value").schema_id
    SchemaRegistryClient({"url": registry}).set_compatibility(f"{topic}-value", "NONE")
    assert _produce(kafka_config, registry, topic, 3, range(30, 33)) == 3  # blocked: long -> string
    third = run_micro_batch(spark, settings, spec, commit_id="run-3", kafka=kafka, catalog=catalog)
    assert (third.records, third.quarantined, dict(third.quarantine_kinds)) == (0, 3, {"schema": 3})
    assert [c["change"] for c in third.schema_changes] == ["blocked"]

    tbl = catalog.load_table(spec.identifier)
    summary = tbl.snapshot_by_id(second.snapshot_id).summary.additional_properties
    assert json.loads(summary[KEY_SCHEMA_IDS]) == {str(v2_id): 10} and KEY_SCHEMA_CHANGES in summary
    third_summary = tbl.snapshot_by_id(third.snapshot_id).summary.additional_properties
    assert len(json.loads(third_summary[KEY_SCHEMA_IDS])) == 1 and str(v2_id) not in third_summary[KEY_SCHEMA_IDS]
    assert json.loads(third_summary[KEY_QUARANTINE_KINDS]) == {"schema": 3}
    assert str(tbl.schema().find_field("seats").field_type) == "long"

    con = duck.connect()
    got = con.execute(
        f"SELECT count(*), sum(len(flights)), count(engine.power), count(model), sum(seats) "
        f"FROM {duck.scan_sql(tbl.metadata_location)}"
    ).fetchone()
    assert got == (30, sum(i % 3 + 1 for i in range(30)), 10, 10, sum(100 + i for i in range(30)))
    dlq = catalog.load_table(spec.bad_records.dead_letter_identifier)
    kinds = con.execute(
        f"SELECT error_kind, count(*) FROM {duck.scan_sql(dlq.metadata_location)} GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert kinds == [("missing_magic_byte", 1), ("schema", 3)]


def test_registry_unreachable_fails_the_batch_and_commits_nothing(
    broker, kafka_config, topic_factory, unique, spark, settings, kafka, catalog
):
    from kafka_iceberg.formats import RegistryUnavailableError, frame

    topic = topic_factory(unique, partitions=1)
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    spec = make_spec(
        f"down_{unique}",
        topic,
        schema=[{"name": "tailnum", "type": "string"}],
        partition_by=[],
        format={"type": "avro", "registry_url": down},
        kafka_columns=["partition", "offset"],
    )
    assert produce(kafka_config, topic, [(None, frame(1, b"\x02a"), 1_700_000_000_000)]) == 1
    with pytest.raises(RegistryUnavailableError, match="127.0.0.1"):
        run_micro_batch(spark, settings, spec, commit_id="run-down", kafka=kafka, catalog=catalog)
    from kafka_iceberg.catalog.tables import read_state

    assert all(o == 0 for o in read_state(catalog, spec.identifier).offsets.values())  # nothing committed
    assert catalog.load_table(spec.identifier).scan().to_arrow().num_rows == 0
