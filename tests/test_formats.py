"""Avro, Protobuf and JSON Schema through the stand-in schema registry and the real dev broker.

Records are produced to noida-db in the Confluent wire format (Avro by confluent-kafka's own
AvroSerializer, Protobuf and JSON framed by kafka_iceberg.formats.frame), consumed back, decoded
by kafka_iceberg.formats into Arrow, appended to an Iceberg table with pyiceberg (SQLite catalog)
and read back by pyiceberg and DuckDB.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from devtools import duck
from devtools.demo.samples import (
    AVRO_PLANE,
    JSON_PLANE,
    avro_plane,
    json_payload,
    protobuf_plane,
    protobuf_plane_class,
    protobuf_schema_str,
)
from devtools.services import registry as dev_registry
from devtools.services.devbroker import free_port
from kafka_iceberg.config.models import RegistrySettings
from kafka_iceberg.formats import (
    RegistryUnavailableError,
    arrow_schema,
    classify,
    decode_values,
    evolution,
    frame,
    iceberg_schema,
    resolve,
    schema_ids,
    table_schema_from_subject,
)
from kafka_iceberg.formats.decode import as_struct_column
from kafka_iceberg.formats.resolver import WriterSchema


@pytest.fixture
def sr(registry):
    return SchemaRegistryClient({"url": registry})


def _produce(broker: str, topic: str, values: list[bytes], keys: list[bytes] | None = None) -> None:
    p = Producer({"bootstrap.servers": broker})
    for i, v in enumerate(values):
        p.produce(topic, value=v, key=keys[i] if keys else None, partition=0)
    assert p.flush(30) == 0


def _consume(broker: str, topic: str, n: int) -> tuple[list[bytes], list[bytes]]:
    c = Consumer({"bootstrap.servers": broker, "group.id": "formats-test", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    keys, values, deadline = [], [], time.monotonic() + 30
    while len(values) < n and time.monotonic() < deadline:
        for m in c.consume(1000, timeout=1.0):
            if m.error() is None:
                keys.append(m.key())
                values.append(m.value())
    c.close()
    assert len(values) == n
    return keys, values


def _for_pyiceberg(rows: pa.Table, schema) -> pa.Table:
    """The decoders' Arrow (uuid as text, fixed as binary: what Spark carries) in pyiceberg's types."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.types import FixedType, UUIDType

    cols = []
    for f in schema.fields:
        col = rows.column(f.name)
        if isinstance(f.field_type, UUIDType):
            storage = pa.array([None if s is None else uuid.UUID(s).bytes for s in col.to_pylist()], pa.binary(16))
            col = pa.ExtensionArray.from_storage(pa.uuid(), storage)
        elif isinstance(f.field_type, FixedType):
            col = col.cast(pa.binary(len(f.field_type)))
        cols.append(col)
    return pa.Table.from_arrays(cols, names=rows.column_names).cast(schema_to_pyarrow(schema, include_field_ids=False))


def _iceberg_round_trip(tmp_path, name: str, schema, rows: pa.Table):
    """Create an Iceberg table with ``schema``, append ``rows``; return (pyiceberg rows, DuckDB connection, scan SQL)."""
    from pyiceberg.catalog.sql import SqlCatalog

    (tmp_path / "wh").mkdir(exist_ok=True)
    cat = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")
    cat.create_namespace_if_not_exists("fmt")
    tbl = cat.create_table(f"fmt.{name}", schema=schema)
    tbl.append(_for_pyiceberg(rows, tbl.schema()))
    tbl = cat.load_table(f"fmt.{name}")
    return tbl.scan().to_arrow().sort_by("tailnum").to_pylist(), duck.connect(), duck.scan_sql(tbl.metadata_location)


def _decode_topic(broker, registry, topic, n, fmt, subject):
    _, values = _consume(broker, topic, n)
    writers = resolve(registry, schema_ids(values))
    schema = table_schema_from_subject(registry, subject)
    return schema, decode_values(values, writers, arrow_schema(schema), fmt)


def test_avro_round_trip_with_nested_types(broker, topic_factory, unique, registry, sr, tmp_path):
    topic = topic_factory(unique, partitions=1)
    ser = AvroSerializer(sr, json.dumps(AVRO_PLANE))
    ctx = SerializationContext(topic, MessageField.VALUE)
    _produce(broker, topic, [ser(avro_plane(i), ctx) for i in range(40)])

    schema, out = _decode_topic(broker, registry, topic, 40, "avro", f"{topic}-value")
    assert out.bad == [] and out.row_index == list(range(40))
    rows = out.rows.to_pylist()
    assert rows[4]["engine"] == {"member0": None, "member1": "jet4"} and rows[5]["engine"] == {
        "member0": 5,
        "member1": None,
    }
    assert rows[0]["engine"] is None and rows[0]["year"] is None
    assert rows[2]["flights"] == [
        {"flight": 20 + k, "dest": d, "dep_delay": None if k else -1.5} for k, d in enumerate(["ATL", "ORD", "LAX"])
    ]
    assert str(schema.find_field("id").field_type) == "uuid" and str(schema.find_field("kind").field_type) == "string"

    back, con, scan = _iceberg_round_trip(tmp_path, f"avro_{unique}", schema, out.rows)
    assert len(back) == 40 and back[3]["price"] == avro_plane(3)["price"] and back[3]["id"] == uuid.UUID(int=4)
    assert back[3]["seen_at"] == avro_plane(3)["seen_at"] and back[3]["code"] == b"003"
    got = con.execute(
        f"SELECT count(*), sum(len(flights)), max(counts['seats']), "
        f"count(engine.member1), max(first_flight.flight), min(day) FROM {scan}"
    ).fetchone()
    assert got[0] == 40 and got[1] == sum(i % 3 + 1 for i in range(40)) and got[2] == 139
    assert got[3] == sum(1 for i in range(40) if i % 3 and not i % 2) and got[4] == 39 and str(got[5]) == "2013-01-01"


def test_protobuf_round_trip_with_nested_types(broker, topic_factory, unique, registry, sr, tmp_path):
    topic = topic_factory(unique, partitions=1)
    sid = sr.register_schema(f"{topic}-value", Schema(protobuf_schema_str(), "PROTOBUF"))
    cls = protobuf_plane_class()
    _produce(broker, topic, [frame(sid, protobuf_plane(cls, i).SerializeToString(), [0]) for i in range(30)])

    schema, out = _decode_topic(broker, registry, topic, 30, "protobuf", f"{topic}-value")
    assert out.bad == [] and len(out.rows) == 30
    r = out.rows.to_pylist()
    assert (r[1]["jet"], r[1]["props"], r[2]["jet"], r[2]["props"], r[3]["jet"]) == ("jet1", None, None, 2, None)
    assert r[0]["model"] is None and r[1]["model"] == "A1" and r[0]["seats"] is None and r[1]["seats"] == 101
    assert r[5]["kind"] == "ROTOR" and r[2]["tags"] == ["a", "b"] and r[1]["counts"] == [("seats", 101)]

    back, con, scan = _iceberg_round_trip(tmp_path, f"pb_{unique}", schema, out.rows)
    assert back[7]["seen_at"].isoformat() == "2013-01-01T05:07:00+00:00" and back[7]["flights"][1]["dest"] == "ORD"
    got = con.execute(
        f"SELECT count(*), count(jet), count(props), sum(len(flights)), count(seats) FROM {scan}"
    ).fetchone()
    assert got == (30, 10, 10, sum(i % 3 + 1 for i in range(30)), sum(1 for i in range(30) if i % 4))


def test_json_schema_round_trip_with_nested_types(broker, topic_factory, unique, registry, sr, tmp_path):
    topic = topic_factory(unique, partitions=1)
    sid = sr.register_schema(f"{topic}-value", Schema(json.dumps(JSON_PLANE), "JSON"))
    _produce(broker, topic, [frame(sid, json_payload(i)) for i in range(25)])

    schema, out = _decode_topic(broker, registry, topic, 25, "json_schema", f"{topic}-value")
    assert out.bad == [] and len(out.rows) == 25
    assert schema.find_field("tailnum").required and not schema.find_field("year").required
    r = out.rows.to_pylist()
    assert r[2]["engine"] == {"member0": None, "member1": "jet2"} and r[1]["engine"]["member0"] == 1
    assert r[1]["raw"] == b"\x00\x01" and str(r[1]["day"]) == "2013-01-02"

    back, con, scan = _iceberg_round_trip(tmp_path, f"js_{unique}", schema, out.rows)
    assert back[1]["seen_at"].isoformat() == "2013-01-01T05:01:00+00:00" and back[1]["id"] == uuid.UUID(int=2)
    assert con.execute(f"SELECT count(*), sum(len(flights)) FROM {scan}").fetchone() == (
        25,
        sum(i % 3 + 1 for i in range(25)),
    )


def test_each_kind_of_bad_record(registry, sr, unique):
    v1 = {
        "type": "record",
        "name": "E",
        "fields": [{"name": "id", "type": "long"}, {"name": "n", "type": {"type": "array", "items": "int"}}],
    }
    sid = sr.register_schema(f"{unique}-value", Schema(json.dumps(v1)))
    good = AvroSerializer(sr, json.dumps(v1), conf={"auto.register.schemas": False, "use.latest.version": True})
    ctx = SerializationContext(unique, MessageField.VALUE)
    # the table's id column is an int: a long beyond int32 does not fit it
    table = pa.schema([pa.field("id", pa.int32(), nullable=False), pa.field("n", pa.list_(pa.int32()))])
    values = [
        good({"id": 1, "n": [1]}, ctx),
        b'{"id": 2}',
        frame(424242, b"\x02"),
        frame(sid, b"\x02\x09"),
        good({"id": 2**40, "n": []}, ctx),
        None,
        good({"id": 3, "n": [2, 3]}, ctx),
    ]
    out = decode_values(values, resolve(registry, schema_ids(values)), table, "avro")
    assert [r["id"] for r in out.rows.to_pylist()] == [1, 3] and out.row_index == [0, 6]
    kinds = {b.index: (b.kind, b.reason) for b in out.bad}
    assert kinds[1][0] == "missing_magic_byte" and kinds[5][0] == "missing_magic_byte"
    assert kinds[2] == ("unknown_schema_id", "schema id 424242 is not in the schema registry")
    assert kinds[3][0] == "undecodable" and f"schema id {sid}" in kinds[3][1]
    assert kinds[4][0] == "schema" and "does not fit" in kinds[4][1]


def test_required_field_null_and_type_mismatch_are_schema_bad_records(registry, sr, unique):
    doc = {
        "type": "object",
        "required": ["a"],
        "properties": {
            "a": {"type": "integer"},
            "s": {"type": "object", "required": ["x"], "properties": {"x": {"type": "string", "format": "date"}}},
        },
    }
    sid = sr.register_schema(f"{unique}-value", Schema(json.dumps(doc), "JSON"))
    target = arrow_schema(iceberg_schema(WriterSchema(sid, "JSON", json.dumps(doc))))
    values = [
        frame(sid, json.dumps(v).encode())
        for v in (
            {"a": 1, "s": {"x": "2024-01-02"}},
            {"s": {"x": "2024-01-02"}},
            {"a": 2, "s": {}},
            {"a": "x"},
            {"a": 3, "s": {"x": "yesterday"}},
            [1],
        )
    ]
    out = decode_values(values, resolve(registry, [sid]), target, "json_schema")
    assert out.row_index == [0]
    reasons = {b.index: (b.kind, b.reason) for b in out.bad}
    assert reasons[1] == ("schema", "the value does not fit the table schema: required field a is missing or null")
    assert reasons[2] == ("schema", "the value does not fit the table schema: required field s.x is missing or null")
    assert reasons[3][0] == "schema" and reasons[4] == (
        "schema",
        "the value does not fit the table schema: s: x: 'yesterday' is not an ISO-8601 date",
    )
    assert reasons[5][0] == "undecodable"


def _avro(fields, name="W"):
    return json.dumps({"type": "record", "name": name, "fields": fields})


def test_each_kind_of_evolution(registry, sr, unique, tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    subject = f"{unique}-value"
    inner = {"type": "record", "name": "In", "fields": [{"name": "x", "type": "int"}]}
    v1 = [
        {"name": "id", "type": "int"},
        {"name": "f", "type": "float"},
        {"name": "inner", "type": inner},
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2}},
    ]
    sr.register_schema(subject, Schema(_avro(v1)))
    table = table_schema_from_subject(registry, subject)

    inner2 = {**inner, "fields": inner["fields"] + [{"name": "y", "type": ["null", "string"], "default": None}]}
    v2 = v1[:2] + [
        {"name": "inner", "type": inner2},
        v1[3],
        {"name": "note", "type": ["null", "string"], "default": None},
    ]
    v2_id = sr.register_schema(subject, Schema(_avro(v2)))  # BACKWARD-compatible: accepted
    e2 = classify(table, iceberg_schema(resolve(registry, [v2_id])[v2_id]))
    assert e2.kind == "evolvable" and [c.path for c in e2.changes] == ["inner.y", "note"]

    v3 = [
        {"name": "id", "type": "long"},
        {"name": "f", "type": "double"},
        {"name": "inner", "type": inner},
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    ]
    e3 = classify(table, iceberg_schema(WriterSchema(0, "AVRO", _avro(v3))))
    assert e3.kind == "promotion" and [(c.path, str(c.new_type)) for c in e3.changes] == [
        ("id", "long"),
        ("f", "double"),
        ("d", "decimal(9, 2)"),
    ]

    v4 = [{"name": "id", "type": "string"}, {"name": "f", "type": "float"}, {"name": "inner", "type": inner}]
    with pytest.raises(Exception, match="incompatible"):  # the registry itself refuses long->string
        sr.register_schema(subject, Schema(_avro(v4)))
    e4 = classify(table, iceberg_schema(WriterSchema(0, "AVRO", _avro(v4))))
    assert e4.kind == "blocked" and [c.reason for c in e4.of("blocked")] == [
        "id: the table has int, the writer sends string",
        "d: required in the table, absent from the writer schema (a required field was removed)",
    ]

    # the evolvable and promotion changes apply to a real table as one schema update
    cat = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}")
    cat.create_namespace_if_not_exists("fmt")
    tbl = cat.create_table("fmt.evo", schema=table)
    evolution.apply(tbl, e2)
    evolution.apply(tbl, e3)
    after = cat.load_table("fmt.evo").schema()
    assert str(after.find_field("id").field_type) == "long" and str(after.find_field("d").field_type) == "decimal(9, 2)"
    assert not after.find_field("note").required and not after.find_field("inner.y").required
    assert classify(after, iceberg_schema(WriterSchema(0, "AVRO", _avro(v2)))).kind == "none"
    with pytest.raises(ValueError, match="blocked"):
        evolution.apply(tbl, e4)


def test_registry_unreachable_is_retried_then_a_clear_error(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    with pytest.raises(
        RegistryUnavailableError, match=r"unreachable: schema id 7 failed 3 times.*nothing was committed"
    ):
        resolve(url, [7], attempts=3, backoff_s=0.2)
    assert time.monotonic() - t0 >= 0.6  # waited between the attempts (0.2 + 0.4 s)

    # a registry that comes back while the resolver retries is used
    data_dir = tmp_path / "late"
    dev_registry.start(data_dir, port)
    sid = SchemaRegistryClient({"url": url}).register_schema(
        "late-value", Schema(_avro([{"name": "a", "type": "int"}]))
    )
    dev_registry.stop(data_dir)
    th = threading.Timer(0.5, dev_registry.start, (data_dir, port))
    th.start()
    try:
        got = resolve(url, [sid], attempts=8, backoff_s=0.3)
        assert got[sid].schema_type == "AVRO" and json.loads(got[sid].schema_str)["fields"][0]["name"] == "a"
    finally:
        th.join()
        dev_registry.stop(data_dir)


def test_registry_basic_auth_comes_from_the_environment(tmp_path, monkeypatch):
    data_dir = tmp_path / "auth"
    url = dev_registry.start(data_dir, free_port(), basic_auth="lake:s3cret")
    try:
        with pytest.raises(RegistryUnavailableError, match="refused"):
            resolve(url, [1], RegistrySettings())
        monkeypatch.setenv(
            "LAKE_SCHEMA_REGISTRY_CONFIG", '{"basic.auth.user.info": "lake:s3cret"}'
        )  # kafka_iceberg.config.settings.registry_settings
        from kafka_iceberg.formats import client_config

        c = SchemaRegistryClient(client_config(url))
        sid = c.register_schema("auth-value", Schema(_avro([{"name": "a", "type": "int"}])))
        assert resolve(url, [sid])[sid].schema_id == sid
    finally:
        dev_registry.stop(data_dir)


def test_registry_persists_across_restarts_and_checks_compatibility(tmp_path):
    data_dir = tmp_path / "persist"
    url = dev_registry.start(data_dir, free_port())
    c = SchemaRegistryClient({"url": url})
    a = c.register_schema("p-value", Schema(_avro([{"name": "a", "type": "long"}])))
    b = c.register_schema(
        "p-value",
        Schema(_avro([{"name": "a", "type": "long"}, {"name": "b", "type": ["null", "int"], "default": None}])),
    )
    bad = Schema(_avro([{"name": "a", "type": "string"}]))
    assert not c.test_compatibility("p-value", bad)
    c.set_compatibility("p-value", "NONE")
    dev_registry.stop(data_dir)

    url = dev_registry.start(data_dir, free_port())
    try:
        c = SchemaRegistryClient({"url": url})
        assert (a, b) == (1, 2) and c.get_versions("p-value") == [1, 2] and c.get_compatibility("p-value") == "NONE"
        assert c.register_schema("p-value", bad) == 3  # NONE: accepted after the restart
        assert c.get_latest_version("p-value").schema_id == 3 and c.get_compatibility() == "BACKWARD"
        assert c.lookup_schema("p-value", Schema(_avro([{"name": "a", "type": "long"}]))).version == 1
    finally:
        dev_registry.stop(data_dir)


def test_key_parsed_into_columns(broker, topic_factory, unique, registry, sr):
    topic = topic_factory(unique, partitions=1)
    key_schema = _avro(
        [{"name": "tailnum", "type": "string"}, {"name": "day", "type": {"type": "int", "logicalType": "date"}}],
        name="PlaneKey",
    )
    kser = AvroSerializer(sr, key_schema)
    vser = AvroSerializer(sr, json.dumps(AVRO_PLANE))
    kctx, vctx = SerializationContext(topic, MessageField.KEY), SerializationContext(topic, MessageField.VALUE)
    planes = [avro_plane(i) for i in range(5)]
    _produce(
        broker,
        topic,
        [vser(p, vctx) for p in planes],
        keys=[kser({"tailnum": p["tailnum"], "day": p["day"]}, kctx) for p in planes],
    )
    keys, _ = _consume(broker, topic, 5)
    key_table = table_schema_from_subject(registry, f"{topic}-key")
    out = decode_values(keys, resolve(registry, schema_ids(keys)), arrow_schema(key_table), "avro")
    assert out.rows.column_names == ["tailnum", "day"] and out.bad == []
    assert out.rows.to_pylist()[3] == {"tailnum": "N00003", "day": planes[3]["day"]}
    as_struct = as_struct_column(out.rows)  # a key kept as one struct column
    assert as_struct.type == pa.struct(list(arrow_schema(key_table))) and as_struct[3]["tailnum"].as_py() == "N00003"


def test_avro_time_types_across_schema_ids_keep_input_order(registry, sr, unique):
    import datetime as dt

    from kafka_iceberg.formats.avro import AvroDecoder

    ts = {"type": "long", "logicalType": "timestamp-millis"}
    leg = {
        "type": "record",
        "name": "Leg",
        "fields": [{"name": "at", "type": ts}, {"name": "on", "type": {"type": "int", "logicalType": "date"}}],
    }
    v1 = [
        {"name": "id", "type": "int"},
        {"name": "t", "type": ["null", ts], "default": None},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "legs", "type": {"type": "array", "items": leg}},
        {"name": "last", "type": ["null", "Leg"]},
    ]
    v2 = v1 + [{"name": "note", "type": ["null", "string"], "default": None}]
    subject = f"{unique}-value"
    s1, s2 = (sr.register_schema(subject, Schema(_avro(v))) for v in (v1, v2))
    table = table_schema_from_subject(registry, subject)
    target = arrow_schema(table)
    assert AvroDecoder(_avro(v1)).raw_type(pa.struct(list(target))) is not None  # the raw-number path is used

    at = dt.datetime(2013, 1, 1, 5, 0, 0, 123000, tzinfo=dt.timezone.utc)

    def rec(i):
        return {
            "id": i,
            "t": None if i == 2 else at + dt.timedelta(hours=i),
            "local": dt.datetime(2013, 1, 1, i),
            "tm": dt.time(i, 30),
            "legs": [{"at": at, "on": dt.date(2013, 1, 1 + i)}],
            "last": {"at": at, "on": dt.date(2013, 2, 1)} if i % 2 else None,
        }

    ser = {
        sid: AvroSerializer(sr, _avro(v), conf={"auto.register.schemas": False, "use.latest.version": False})
        for sid, v in ((s1, v1), (s2, v2))
    }
    ctx = SerializationContext(unique, MessageField.VALUE)
    values = [ser[s1 if i % 2 else s2](rec(i), ctx) for i in range(6)]
    values.insert(3, frame(s2, b"\x02"))  # undecodable, between the groups
    out = decode_values(values, resolve(registry, schema_ids(values)), target, "avro")
    assert out.row_index == [0, 1, 2, 4, 5, 6] and [b.index for b in out.bad] == [3]
    rows = out.rows.to_pylist()
    assert [r["id"] for r in rows] == [0, 1, 2, 3, 4, 5]
    assert rows[4]["t"] == at + dt.timedelta(hours=4) and rows[2]["t"] is None and rows[1]["tm"] == dt.time(1, 30)
    assert rows[3]["local"] == dt.datetime(2013, 1, 1, 3) and rows[3]["legs"][0] == {
        "at": at,
        "on": dt.date(2013, 1, 4),
    }
    assert rows[1]["last"]["on"] == dt.date(2013, 2, 1) and rows[0]["last"] is None

    # a table whose column is not a timestamp: the records do not fit (no raw numbers slip in)
    wrong = pa.schema([pa.field("id", pa.int32()), pa.field("t", pa.string())])
    out = decode_values(values[:2], resolve(registry, [s1, s2]), wrong, "avro")
    assert [b.kind for b in out.bad] == ["schema", "schema"] and len(out.rows) == 0


def test_batch_plan_applies_promotions_and_refuses_blocked_schema_ids(registry, sr, unique):
    from kafka_iceberg.formats import plan_batch

    subject = f"{unique}-value"
    sr.set_compatibility(subject, "NONE")  # let every change in, so the table side must block it
    v1 = [{"name": "id", "type": "int"}, {"name": "name", "type": "string"}]
    ids = [
        sr.register_schema(subject, Schema(_avro(f)))
        for f in (
            v1,
            v1 + [{"name": "extra", "type": ["null", "long"], "default": None}],  # new field
            [{"name": "id", "type": "long"}, v1[1]],  # promotion
            [{"name": "id", "type": "int"}, {"name": "name", "type": "long"}],  # blocked
        )
    ]
    table = iceberg_schema(resolve(registry, ids[:1])[ids[0]])
    writers = resolve(registry, ids)

    reject = plan_batch(table, writers, "reject")
    assert [c.path for c in reject.apply] == ["id"] and set(reject.refused) == {ids[1], ids[3]}
    assert reject.refused[ids[1]] == (
        "unknown_field",
        f"schema id {ids[1]} has fields the table lacks (unknown_fields: reject): extra",
    )
    assert (
        reject.refused[ids[3]][0] == "schema"
        and "name: the table has string, the writer sends long" in reject.refused[ids[3]][1]
    )
    evolve = plan_batch(table, writers, "evolve")
    assert [c.path for c in evolve.apply] == ["extra", "id"] and set(evolve.refused) == {ids[3]}
    ignore = plan_batch(table, writers, "ignore")
    assert [c.path for c in ignore.ignored] == ["extra"] and set(ignore.refused) == {ids[3]}

    sers = [
        AvroSerializer(sr, _avro(f), conf={"auto.register.schemas": False})
        for f in (v1, v1 + [{"name": "extra", "type": ["null", "long"], "default": None}])
    ]
    blocked = AvroSerializer(
        sr,
        _avro([{"name": "id", "type": "int"}, {"name": "name", "type": "long"}]),
        conf={"auto.register.schemas": False},
    )
    ctx = SerializationContext(unique, MessageField.VALUE)
    values = [
        sers[0]({"id": 1, "name": "a"}, ctx),
        sers[1]({"id": 2, "name": "b", "extra": 5}, ctx),
        blocked({"id": 3, "name": 7}, ctx),
    ]
    out = decode_values(values, writers, arrow_schema(table), "avro", reject.refused)
    assert out.row_index == [0] and [(b.index, b.kind) for b in out.bad] == [(1, "unknown_field"), (2, "schema")]
