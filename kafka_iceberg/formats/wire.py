"""The Confluent wire format, and the per-record verdicts of the decoders.

A framed value is ``0x00`` (the magic byte), a 4-byte big-endian schema id, then the payload.
For Protobuf the payload starts with the message-index list: a zigzag varint count followed by
that many zigzag varints (the path of the message type inside the .proto file; the single byte
``0x00`` means ``[0]``, the first top-level message), then the serialized message.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = 0
HEADER_BYTES = 5

MISSING_MAGIC_BYTE = "missing_magic_byte"
UNKNOWN_SCHEMA_ID = "unknown_schema_id"
UNDECODABLE = "undecodable"
SCHEMA = "schema"
UNKNOWN_FIELD = "unknown_field"
BAD_KINDS = (MISSING_MAGIC_BYTE, UNKNOWN_SCHEMA_ID, UNDECODABLE, SCHEMA, UNKNOWN_FIELD)
"""Kinds of bad records the formats report. ``schema`` (does not fit the table, or its schema id
is blocked) and ``unknown_field`` (its schema id has fields the table lacks, under
``unknown_fields: reject``) are the kinds the JSON path uses, so the ``quarantine`` check treats
both paths alike."""


@dataclass(frozen=True)
class BadRecord:
    """One record that did not become a row: its position in the decoded group (0-based),
    its kind (one of :data:`BAD_KINDS`) and a reason for the dead-letter table."""

    index: int
    kind: str
    reason: str


class WireError(ValueError):
    """A value that is not in the Confluent wire format; ``kind`` is one of :data:`BAD_KINDS`."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind


def schema_id_of(value: bytes | None) -> int:
    """The schema id of a framed value.

    Raises:
        WireError: (``missing_magic_byte``) the value is null, shorter than 5 bytes or does not
            start with ``0x00``.
    """
    if value is None or len(value) < HEADER_BYTES or value[0] != MAGIC:
        first = "null" if value is None else ("empty" if not value else f"first byte 0x{value[0]:02x}")
        size = 0 if value is None else len(value)
        raise WireError(
            MISSING_MAGIC_BYTE,
            f"not in the Confluent wire format (magic byte 0x00 and a 4-byte "
            f"schema id expected; {size} bytes, {first})",
        )
    return struct.unpack_from(">I", value, 1)[0]


def frame(schema_id: int, payload: bytes, message_indexes: list[int] | None = None) -> bytes:
    """``payload`` framed for ``schema_id``; Protobuf payloads pass their ``message_indexes``."""
    head = bytes([MAGIC]) + struct.pack(">I", schema_id)
    if message_indexes is None:
        return head + payload
    if message_indexes == [0]:
        return head + b"\x00" + payload
    return head + zigzag_varint(len(message_indexes)) + b"".join(zigzag_varint(i) for i in message_indexes) + payload


def zigzag_varint(n: int) -> bytes:
    """``n`` as a zigzag varint: Avro's ``long`` encoding, and Confluent's Protobuf message indexes."""
    n = (n << 1) ^ (n >> 63)  # zigzag
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(buf):
            raise WireError(UNDECODABLE, "truncated Protobuf message-index list")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise WireError(UNDECODABLE, "malformed varint in the Protobuf message-index list")


def protobuf_indexes(value: bytes) -> tuple[tuple[int, ...], int]:
    """(message indexes, offset of the serialized message) of a framed Protobuf value.

    Raises:
        WireError: (``undecodable``) the index list is truncated or malformed.
    """
    count, pos = _read_varint(value, HEADER_BYTES)
    if count == 0:
        return (0,), pos
    if count < 0 or count > 64:
        raise WireError(UNDECODABLE, f"implausible Protobuf message-index count {count}")
    indexes = []
    for _ in range(count):
        i, pos = _read_varint(value, pos)
        indexes.append(i)
    return tuple(indexes), pos
