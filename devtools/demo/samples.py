"""Nested sample schemas and records for Avro, Protobuf and JSON Schema (tests and the decode benchmark).

Each format carries a nested record (a plane with a list of its flights), a map, a multi-type
union or oneof, and the primitives the formats map (decimal, date, timestamps, uuid, bytes, fixed).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid

UTC = dt.timezone.utc
T0 = dt.datetime(2013, 1, 1, 5, 0, tzinfo=UTC)

FLIGHT = {
    "type": "record",
    "name": "Flight",
    "fields": [
        {"name": "flight", "type": "int"},
        {"name": "dest", "type": "string"},
        {"name": "dep_delay", "type": ["null", "double"], "default": None},
    ],
}

AVRO_PLANE = {
    "type": "record",
    "name": "Plane",
    "namespace": "nycflights13",
    "fields": [
        {"name": "tailnum", "type": "string"},
        {"name": "year", "type": ["null", "int"], "default": None},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "seen_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local_seen", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["FIXED_WING", "ROTOR"]}},
        {"name": "code", "type": {"type": "fixed", "name": "Code", "size": 3}},
        {"name": "raw", "type": "bytes"},
        {"name": "engine", "type": ["null", "int", "string"], "default": None},
        {"name": "counts", "type": {"type": "map", "values": "long"}},
        {"name": "first_flight", "type": FLIGHT},
        {"name": "flights", "type": {"type": "array", "items": "Flight"}},
    ],
}


def avro_plane(i: int) -> dict:
    """Plane ``i`` as the Python value fastavro and confluent's AvroSerializer write."""
    return {
        "tailnum": f"N{i:05d}",
        "year": None if i % 7 == 0 else 1990 + i % 30,
        "id": str(uuid.UUID(int=i + 1)),
        "seen_at": T0 + dt.timedelta(minutes=i),
        "local_seen": dt.datetime(2013, 1, 1, 5, 0) + dt.timedelta(minutes=i),
        "day": dt.date(2013, 1, 1) + dt.timedelta(days=i % 365),
        "price": decimal.Decimal(f"{i}.25"),
        "kind": "ROTOR" if i % 5 == 0 else "FIXED_WING",
        "code": b"%03d" % (i % 1000),
        "raw": bytes([i % 256]),
        "engine": (i if i % 2 else f"jet{i}") if i % 3 else None,
        "counts": {"seats": 100 + i % 50},
        "first_flight": {"flight": i, "dest": "IAH", "dep_delay": 2.0},
        "flights": [
            {"flight": i * 10 + k, "dest": ["ATL", "ORD", "LAX"][k], "dep_delay": None if k else -1.5}
            for k in range(i % 3 + 1)
        ],
    }


def protobuf_file():
    """The ``FileDescriptorProto`` of ``lake/plane.proto`` (package ``nycflights13``)::

    message Plane {
      string tailnum = 1; int32 year = 2; optional string model = 3;
      google.protobuf.Timestamp seen_at = 4; google.protobuf.Int64Value seats = 5;
      repeated Flight flights = 6; map<string, int64> counts = 7;
      oneof engine { string jet = 8; int32 props = 9; }
      Kind kind = 10; bytes code = 11; repeated string tags = 12;
      message Flight { int32 flight = 1; string dest = 2; double dep_delay = 3; }
      enum Kind { FIXED_WING = 0; ROTOR = 1; }
    }
    """
    from google.protobuf import descriptor_pb2 as d

    F = d.FieldDescriptorProto
    fd = d.FileDescriptorProto(
        name="lake/plane.proto",
        package="nycflights13",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"],
    )
    plane = fd.message_type.add(name="Plane")
    flight = plane.nested_type.add(name="Flight")
    for n, (name, typ) in enumerate(
        [("flight", F.TYPE_INT32), ("dest", F.TYPE_STRING), ("dep_delay", F.TYPE_DOUBLE)], 1
    ):
        flight.field.add(name=name, number=n, type=typ, label=F.LABEL_OPTIONAL)
    entry = plane.nested_type.add(name="CountsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    plane.enum_type.add(name="Kind").value.extend(
        [d.EnumValueDescriptorProto(name="FIXED_WING", number=0), d.EnumValueDescriptorProto(name="ROTOR", number=1)]
    )
    plane.oneof_decl.add(name="engine")
    plane.oneof_decl.add(name="_model")
    add = plane.field.add
    add(name="tailnum", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    add(name="year", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    add(name="model", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=1, proto3_optional=True)
    add(name="seen_at", number=4, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".google.protobuf.Timestamp")
    add(name="seats", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".google.protobuf.Int64Value")
    add(name="flights", number=6, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED, type_name=".nycflights13.Plane.Flight")
    add(
        name="counts",
        number=7,
        type=F.TYPE_MESSAGE,
        label=F.LABEL_REPEATED,
        type_name=".nycflights13.Plane.CountsEntry",
    )
    add(name="jet", number=8, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0)
    add(name="props", number=9, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL, oneof_index=0)
    add(name="kind", number=10, type=F.TYPE_ENUM, label=F.LABEL_OPTIONAL, type_name=".nycflights13.Plane.Kind")
    add(name="code", number=11, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL)
    add(name="tags", number=12, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    return fd


def protobuf_schema_str() -> str:
    """The registry's text for :func:`protobuf_file` (base64 ``FileDescriptorProto``)."""
    import base64

    return base64.b64encode(protobuf_file().SerializeToString()).decode("ascii")


def protobuf_plane_class():
    """The generated message class of ``nycflights13.Plane`` (from a private descriptor pool)."""
    from google.protobuf.message_factory import GetMessageClass

    from kafka_iceberg.formats.protobuf import message_descriptor

    return GetMessageClass(message_descriptor(protobuf_schema_str(), (0,)))


def protobuf_plane(cls, i: int):
    """Plane ``i`` as a message of ``cls`` (:func:`protobuf_plane_class`)."""
    m = cls(
        tailnum=f"N{i:05d}",
        year=1990 + i % 30,
        kind=int(i % 5 == 0),
        code=b"%03d" % (i % 1000),
        tags=["a", "b"][: i % 3],
    )
    if i % 2:
        m.model = f"A{i}"
    m.seen_at.FromDatetime(T0 + dt.timedelta(minutes=i))
    if i % 4:
        m.seats.value = 100 + i
    for k in range(i % 3 + 1):
        m.flights.add(flight=i * 10 + k, dest=["ATL", "ORD", "LAX"][k], dep_delay=k * 1.5)
    m.counts["seats"] = 100 + i % 50
    if i % 3 == 1:
        m.jet = f"jet{i}"
    elif i % 3 == 2:
        m.props = i
    return m


JSON_PLANE = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Plane",
    "type": "object",
    "required": ["tailnum", "seen_at"],
    "definitions": {
        "flight": {
            "type": "object",
            "required": ["flight"],
            "properties": {
                "flight": {"type": "integer"},
                "dest": {"type": "string"},
                "dep_delay": {"type": ["null", "number"]},
            },
        }
    },
    "properties": {
        "tailnum": {"type": "string"},
        "year": {"type": ["null", "integer"]},
        "id": {"type": "string", "format": "uuid"},
        "seen_at": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "raw": {"type": "string", "contentEncoding": "base64"},
        "engine": {"oneOf": [{"type": "null"}, {"type": "integer"}, {"type": "string"}]},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        "flights": {"type": "array", "items": {"$ref": "#/definitions/flight"}},
        "first_flight": {"$ref": "#/definitions/flight"},
    },
}


def json_plane(i: int) -> dict:
    """Plane ``i`` as the JSON object a JSON Schema producer sends."""
    return {
        "tailnum": f"N{i:05d}",
        "year": None if i % 7 == 0 else 1990 + i % 30,
        "id": str(uuid.UUID(int=i + 1)),
        "seen_at": (T0 + dt.timedelta(minutes=i)).isoformat().replace("+00:00", "Z"),
        "day": (dt.date(2013, 1, 1) + dt.timedelta(days=i % 365)).isoformat(),
        "raw": "AAE=",
        "engine": (i if i % 2 else f"jet{i}") if i % 3 else None,
        "counts": {"seats": 100 + i % 50},
        "flights": [{"flight": i * 10 + k, "dest": "ATL", "dep_delay": None} for k in range(i % 3 + 1)],
        "first_flight": {"flight": i, "dest": "IAH", "dep_delay": 2.0},
    }


def json_payload(i: int) -> bytes:
    return json.dumps(json_plane(i)).encode()
