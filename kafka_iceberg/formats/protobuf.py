"""Protobuf payloads -> Python rows, with descriptors built from the registered schema.

As confluent-kafka's ``ProtobufDeserializer`` does, the registered schema (a base64
``FileDescriptorProto``, the registry's ``format=serialized`` form) is added to a fresh
``DescriptorPool`` preloaded with the well-known types, and the message class comes from
``message_factory.GetMessageClass``. Schema references (imports of other subjects) are not
resolved: a schema that imports anything but the well-known types fails to build.
"""

from __future__ import annotations

import base64
import functools
from datetime import timezone

from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    TimestamptzType,
)

PB_WRAPPERS = {
    "google.protobuf.DoubleValue": DoubleType(),
    "google.protobuf.FloatValue": FloatType(),
    "google.protobuf.Int64Value": LongType(),
    "google.protobuf.UInt64Value": LongType(),
    "google.protobuf.Int32Value": IntegerType(),
    "google.protobuf.UInt32Value": LongType(),
    "google.protobuf.BoolValue": BooleanType(),
    "google.protobuf.StringValue": StringType(),
    "google.protobuf.BytesValue": BinaryType(),
    "google.protobuf.Timestamp": TimestamptzType(),
}
"""Well-known wrapper messages read as their (nullable) scalar, with the Iceberg type of each."""


@functools.lru_cache(maxsize=256)
def _pool(schema_str: str):
    from google.protobuf import (
        any_pb2,
        api_pb2,
        descriptor_pb2,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        source_context_pb2,
        struct_pb2,
        timestamp_pb2,
        type_pb2,
        wrappers_pb2,
    )
    from google.protobuf.descriptor_pool import DescriptorPool

    pool = DescriptorPool()
    for mod in (
        any_pb2,
        source_context_pb2,
        type_pb2,
        api_pb2,
        descriptor_pb2,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    ):
        pool.AddSerializedFile(mod.DESCRIPTOR.serialized_pb)
    fd = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema_str))
    if pool_has(pool, fd.name):
        fd.name = f"registered/{fd.name or 'schema'}.proto"
    pool.Add(fd)
    return pool, fd


def pool_has(pool, name: str) -> bool:
    try:
        pool.FindFileByName(name)
        return True
    except KeyError:
        return False


def message_descriptor(schema_str: str, indexes: tuple[int, ...] = (0,)):
    """The message ``Descriptor`` at ``indexes`` (top-level message, then nested) of the schema.

    Raises:
        ValueError: an index is out of range, or the schema is not a serialized descriptor.
    """
    pool, fd = _pool(schema_str)
    messages, path = fd.message_type, []
    for i in indexes:
        if not 0 <= i < len(messages):
            raise ValueError(f"message index {list(indexes)} is out of range for the registered schema")
        path.append(messages[i].name)
        messages = messages[i].nested_type
    name = ".".join(([fd.package] if fd.package else []) + path)
    return pool.FindMessageTypeByName(name)


def _scalar_reader(f):
    if f.enum_type is not None:
        values = f.enum_type.values_by_number
        return lambda v: values[v].name if v in values else str(v)
    return None


def _value_reader(f):
    """How to turn one (non-repeated) value of field ``f`` into Python: None means as it is."""
    if f.message_type is None:
        return _scalar_reader(f)
    full = f.message_type.full_name
    if full == "google.protobuf.Timestamp":
        return lambda m: m.ToDatetime(tzinfo=timezone.utc)
    if full in PB_WRAPPERS:
        return lambda m: m.value
    return message_reader(f.message_type)


def _field_reader(f):
    name = f.name
    conv = _value_reader(f)
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        vconv = _value_reader(f.message_type.fields_by_name["value"])
        if vconv is None:
            return lambda m: dict(getattr(m, name))
        return lambda m: {k: vconv(v) for k, v in getattr(m, name).items()}
    if f.is_repeated:
        if conv is None:
            return lambda m: list(getattr(m, name))
        return lambda m: [conv(v) for v in getattr(m, name)]
    if f.has_presence:
        if conv is None:
            return lambda m: getattr(m, name) if m.HasField(name) else None
        return lambda m: conv(getattr(m, name)) if m.HasField(name) else None
    if conv is None:
        return lambda m: getattr(m, name)
    return lambda m: conv(getattr(m, name))


@functools.lru_cache(maxsize=1024)
def message_reader(desc):
    """A function: message of type ``desc`` -> dict of its fields in the mapping of
    :mod:`kafka_iceberg.formats.types` (unset optional fields are None)."""
    readers = [(f.name, _field_reader(f)) for f in desc.fields]
    return lambda m: {name: read(m) for name, read in readers}


class ProtobufDecoder:
    """Decodes the serialized messages of one (schema, message indexes) pair into dicts."""

    def __init__(self, schema_str: str, indexes: tuple[int, ...]):
        from google.protobuf.message_factory import GetMessageClass

        desc = message_descriptor(schema_str, indexes)
        self._cls = GetMessageClass(desc)
        self._read = message_reader(desc)

    def decode_one(self, payload: bytes) -> dict:
        """One message -> dict. Raises ``google.protobuf.message.DecodeError`` on a bad payload."""
        msg = self._cls()
        msg.ParseFromString(payload)
        return self._read(msg)
