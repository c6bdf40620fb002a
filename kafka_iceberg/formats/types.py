"""Type mapping: Avro, Protobuf and JSON Schema -> Iceberg (pyiceberg types) -> Arrow.

The mapping is documented in docs/tables.md ("Formats"). Summary:

- nested records/messages/objects -> ``struct``; arrays/``repeated`` -> ``list``; Avro maps,
  Protobuf ``map<>`` and JSON objects with only ``additionalProperties`` -> ``map<string, T>``.
- Avro: enum -> ``string``; ``[null, T]`` -> optional ``T``; a union of several non-null types ->
  a ``struct`` with one optional field per non-null branch, named ``member0``, ``member1`` ... in
  branch order (as Spark's ``from_avro``); exactly one is set per row. Logical types: decimal,
  date, time, timestamp-* (``timestamptz``), local-timestamp-* (``timestamp``), uuid.
- Protobuf: every field is optional; a ``oneof``'s fields are ordinary optional columns (only the
  set one is non-null); ``google.protobuf.Timestamp`` -> ``timestamptz``; wrappers
  (``Int64Value`` ...) -> the optional primitive; enum -> ``string`` (the value's name).
- JSON Schema: ``required`` properties are required; ``integer`` -> ``long``, ``number`` ->
  ``double``; string formats ``date``, ``date-time`` (``timestamptz``), ``time``, ``uuid``;
  ``contentEncoding: base64`` -> ``binary``; ``$ref`` to ``#/definitions/..`` or ``#/$defs/..``.

Arrow (:func:`arrow_schema`) uses the types Spark's ``mapInArrow`` accepts: ``uuid`` travels as
its canonical text, ``fixed`` as ``binary``.
"""

from __future__ import annotations

import base64
import itertools
import json

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from kafka_iceberg.formats.protobuf import PB_WRAPPERS, message_descriptor
from kafka_iceberg.formats.resolver import latest

UNION_MEMBER = "member"


class UnsupportedSchemaError(ValueError):
    """A registered schema has a construct with no Iceberg mapping (recursive types, for example)."""


class _Ids:
    def __init__(self):
        self._next = itertools.count(1)

    def __call__(self) -> int:
        return next(self._next)


_AVRO_PRIMITIVES = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "bytes": BinaryType(),
    "string": StringType(),
}
_AVRO_LOGICAL = {
    "date": DateType(),
    "time-millis": TimeType(),
    "time-micros": TimeType(),
    "timestamp-millis": TimestamptzType(),
    "timestamp-micros": TimestamptzType(),
    "timestamp-nanos": TimestamptzType(),
    "local-timestamp-millis": TimestampType(),
    "local-timestamp-micros": TimestampType(),
    "uuid": UUIDType(),
}


def _fullname(t: dict, ns: str | None) -> tuple[str, str | None]:
    name = t["name"]
    space = t.get("namespace", ns)
    return (name if "." in name or not space else f"{space}.{name}"), (name.rpartition(".")[0] or space)


def _union(branches: list, ids: _Ids, named: dict, ns, stack) -> tuple[IcebergType, bool]:
    non_null = [b for b in branches if b != "null"]
    nullable = len(non_null) < len(branches)
    if len(non_null) == 1:
        typ, inner_nullable = _avro(non_null[0], ids, named, ns, stack)
        return typ, nullable or inner_nullable
    fields = [
        NestedField(ids(), f"{UNION_MEMBER}{k}", _avro(b, ids, named, ns, stack)[0], required=False)
        for k, b in enumerate(non_null)
    ]
    return StructType(*fields), nullable


def _avro(t, ids: _Ids, named: dict, ns: str | None, stack: tuple) -> tuple[IcebergType, bool]:
    """(Iceberg type, nullable) of the Avro type ``t``."""
    if isinstance(t, list):
        return _union(t, ids, named, ns, stack)
    if isinstance(t, str):
        if t in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[t], False
        if t == "null":
            return StringType(), True
        key = t if "." in t or not ns else f"{ns}.{t}"
        ref = named.get(key) or named.get(t)
        if ref is None:
            raise UnsupportedSchemaError(f"Avro type {t!r} is not defined before its use")
        return _avro(ref[0], ids, named, ref[1], stack)
    logical, kind = t.get("logicalType"), t["type"]
    if logical == "decimal" and kind in ("bytes", "fixed"):
        if kind == "fixed":
            named.setdefault(_fullname(t, ns)[0], (t, ns))
        return DecimalType(int(t["precision"]), int(t.get("scale", 0))), False
    if logical in _AVRO_LOGICAL:
        return _AVRO_LOGICAL[logical], False
    if kind in ("record", "error"):
        full, space = _fullname(t, ns)
        if full in stack:
            raise UnsupportedSchemaError(f"recursive Avro record {full} has no Iceberg mapping")
        named[full] = (t, ns)
        fields = []
        for f in t["fields"]:
            typ, nullable = _avro(f["type"], ids, named, space, stack + (full,))
            fields.append(NestedField(ids(), f["name"], typ, required=not nullable, doc=f.get("doc")))
        return StructType(*fields), False
    if kind == "enum":
        named[_fullname(t, ns)[0]] = (t, ns)
        return StringType(), False
    if kind == "fixed":
        named[_fullname(t, ns)[0]] = (t, ns)
        return FixedType(int(t["size"])), False
    if kind == "array":
        elem, nullable = _avro(t["items"], ids, named, ns, stack)
        return ListType(ids(), elem, element_required=not nullable), False
    if kind == "map":
        value, nullable = _avro(t["values"], ids, named, ns, stack)
        return MapType(ids(), StringType(), ids(), value, value_required=not nullable), False
    return _avro(kind, ids, named, ns, stack)


def avro_schema(schema_str: str) -> Schema:
    """The Iceberg schema of an Avro record schema (JSON text).

    Raises:
        UnsupportedSchemaError: the top level is not a record, or a record refers to itself.
    """
    typ, _ = _avro(json.loads(schema_str), _Ids(), {}, None, ())
    if not isinstance(typ, StructType):
        raise UnsupportedSchemaError("the top-level Avro type must be a record to become table columns")
    return Schema(*typ.fields)


# ---- Protobuf -----------------------------------------------------------------------------------


def _pb_scalar(f) -> IcebergType:
    t = f.type
    if t in (f.TYPE_INT32, f.TYPE_SINT32, f.TYPE_SFIXED32):
        return IntegerType()
    if t in (
        f.TYPE_INT64,
        f.TYPE_SINT64,
        f.TYPE_SFIXED64,
        f.TYPE_UINT32,
        f.TYPE_FIXED32,
        f.TYPE_UINT64,
        f.TYPE_FIXED64,
    ):
        return LongType()
    return {
        f.TYPE_FLOAT: FloatType(),
        f.TYPE_DOUBLE: DoubleType(),
        f.TYPE_BOOL: BooleanType(),
        f.TYPE_STRING: StringType(),
        f.TYPE_BYTES: BinaryType(),
        f.TYPE_ENUM: StringType(),
    }[t]


def _pb_value(f, ids: _Ids, stack: tuple) -> IcebergType:
    if f.message_type is None:
        return _pb_scalar(f)
    name = f.message_type.full_name
    if name in PB_WRAPPERS:
        return PB_WRAPPERS[name]
    return _pb_struct(f.message_type, ids, stack)


def _pb_struct(desc, ids: _Ids, stack: tuple) -> StructType:
    if desc.full_name in stack:
        raise UnsupportedSchemaError(f"recursive Protobuf message {desc.full_name} has no Iceberg mapping")
    stack = stack + (desc.full_name,)
    fields = []
    for f in desc.fields:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            k, v = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            typ = MapType(ids(), _pb_scalar(k), ids(), _pb_value(v, ids, stack), value_required=False)
        elif f.is_repeated:
            typ = ListType(ids(), _pb_value(f, ids, stack), element_required=True)
        else:
            typ = _pb_value(f, ids, stack)
        fields.append(NestedField(ids(), f.name, typ, required=False))
    return StructType(*fields)


def protobuf_schema(schema_str: str, message_indexes: tuple[int, ...] = (0,)) -> Schema:
    """The Iceberg schema of the message at ``message_indexes`` of a registered Protobuf schema
    (a base64 ``FileDescriptorProto``, as the registry serves it with ``format=serialized``)."""

    return Schema(*_pb_struct(message_descriptor(schema_str, message_indexes), _Ids(), ()).fields)


# ---- JSON Schema --------------------------------------------------------------------------------

_JSON_FORMATS = {"date": DateType(), "date-time": TimestamptzType(), "time": TimeType(), "uuid": UUIDType()}


def _json(node: dict, root: dict, ids: _Ids, stack: tuple) -> tuple[IcebergType, bool]:
    if "$ref" in node:
        ref = node["$ref"]
        if not ref.startswith("#/") or ref in stack:
            raise UnsupportedSchemaError(f"JSON Schema $ref {ref!r}: only local, non-recursive references map")
        target = root
        for part in ref[2:].split("/"):
            target = target[part]
        return _json(target, root, ids, stack + (ref,))
    for key in ("oneOf", "anyOf"):
        if key in node:
            return _json_union(node[key], root, ids, stack)
    kinds = node.get("type", "object" if "properties" in node else "string")
    if isinstance(kinds, list):
        return _json_union([{**node, "type": k} for k in kinds], root, ids, stack)
    if kinds == "null":
        return StringType(), True
    if kinds == "object":
        props = node.get("properties") or {}
        extra = node.get("additionalProperties")
        if not props and isinstance(extra, dict):
            value, nullable = _json(extra, root, ids, stack)
            return MapType(ids(), StringType(), ids(), value, value_required=not nullable), False
        required = set(node.get("required") or [])
        fields = []
        for name, sub in props.items():
            typ, nullable = _json(sub, root, ids, stack)
            fields.append(
                NestedField(ids(), name, typ, required=name in required and not nullable, doc=sub.get("description"))
            )
        return StructType(*fields), False
    if kinds == "array":
        elem, nullable = _json(node.get("items") or {}, root, ids, stack)
        return ListType(ids(), elem, element_required=not nullable), False
    if kinds == "string":
        if node.get("contentEncoding") == "base64":
            return BinaryType(), False
        return _JSON_FORMATS.get(node.get("format"), StringType()), False
    return {"integer": LongType(), "number": DoubleType(), "boolean": BooleanType()}[kinds], False


def _json_union(branches: list, root: dict, ids: _Ids, stack: tuple) -> tuple[IcebergType, bool]:
    non_null = [b for b in branches if b.get("type") != "null"]
    nullable = len(non_null) < len(branches)
    if len(non_null) == 1:
        typ, inner = _json(non_null[0], root, ids, stack)
        return typ, nullable or inner
    fields = [
        NestedField(ids(), f"{UNION_MEMBER}{k}", _json(b, root, ids, stack)[0], required=False)
        for k, b in enumerate(non_null)
    ]
    return StructType(*fields), nullable


def json_schema(schema_str: str) -> Schema:
    """The Iceberg schema of a JSON Schema document whose top level is an object."""
    root = json.loads(schema_str)
    typ, _ = _json(root, root, _Ids(), ())
    if not isinstance(typ, StructType):
        raise UnsupportedSchemaError("the top-level JSON Schema must be an object with properties")
    return Schema(*typ.fields)


def iceberg_schema(writer, message_indexes: tuple[int, ...] = (0,)) -> Schema:
    """The Iceberg schema of a :class:`~kafka_iceberg.formats.resolver.WriterSchema`."""
    if writer.schema_type == "AVRO":
        return avro_schema(writer.schema_str)
    if writer.schema_type == "PROTOBUF":
        return protobuf_schema(writer.schema_str, message_indexes)
    return json_schema(writer.schema_str)


def table_schema_from_subject(url: str, subject: str, registry=None) -> Schema:
    """The Iceberg table schema for the latest schema of ``subject`` (its first message for Protobuf);
    ``registry``: the credentials (:class:`~kafka_iceberg.config.models.RegistrySettings`, default: the environment's).

    Raises:
        SchemaNotFoundError, RegistryUnavailableError: see :mod:`kafka_iceberg.formats.resolver`.
        UnsupportedSchemaError: the schema has no Iceberg mapping.
    """

    return iceberg_schema(latest(url, subject, registry))


# ---- Arrow --------------------------------------------------------------------------------------


def arrow_type(t: IcebergType) -> pa.DataType:
    """The Arrow type the decoders produce for Iceberg type ``t``."""
    if isinstance(t, StructType):
        return pa.struct([arrow_field(f) for f in t.fields])
    if isinstance(t, ListType):
        return pa.list_(pa.field("element", arrow_type(t.element_type), nullable=not t.element_required))
    if isinstance(t, MapType):
        return pa.map_(
            arrow_type(t.key_type), pa.field("value", arrow_type(t.value_type), nullable=not t.value_required)
        )
    if isinstance(t, DecimalType):
        return pa.decimal128(t.precision, t.scale)
    return {
        BooleanType: pa.bool_(),
        IntegerType: pa.int32(),
        LongType: pa.int64(),
        FloatType: pa.float32(),
        DoubleType: pa.float64(),
        DateType: pa.date32(),
        TimeType: pa.time64("us"),
        TimestampType: pa.timestamp("us"),
        TimestamptzType: pa.timestamp("us", tz="UTC"),
        StringType: pa.string(),
        UUIDType: pa.string(),
        BinaryType: pa.binary(),
        FixedType: pa.binary(),
    }[type(t)]


def arrow_field(f: NestedField) -> pa.Field:
    return pa.field(f.name, arrow_type(f.field_type), nullable=not f.required)


def arrow_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema of the rows the decoders produce for a table with Iceberg ``schema``."""
    return pa.schema([arrow_field(f) for f in schema.fields])


def b64(data: bytes) -> str:
    """Base64 text (the registry's form of a serialized Protobuf descriptor)."""
    return base64.b64encode(data).decode("ascii")
