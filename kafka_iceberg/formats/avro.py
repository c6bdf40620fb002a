"""Avro payloads -> Python rows with fastavro, a group at a time.

:meth:`AvroDecoder.decode_block` joins the bodies of a group into ONE Avro container block and
lets fastavro's compiled reader decode it in one call. Each body is followed by a 4-byte sentinel
read through a wrapper record ``{v: <writer schema>, s: fixed(4)}``: a body that decodes to fewer
or more bytes than it has shifts the sentinel, so a bad record can never pass silently by
misaligning its neighbours. On any failure the group is decoded again per record
(:meth:`AvroDecoder.decode_one`, ``schemaless_reader`` with a check that every byte was used) to
isolate the bad records. fastavro handles maps, multi-type unions and named-type references,
which polars' block reader does not (measured in :mod:`devtools.formats_bench`).

The ``uuid`` logical type is read as its text (the form Spark carries for Iceberg ``uuid``).
"""

from __future__ import annotations

import io
import json

_SENTINEL = b"\xa5lk\x5a"
_WRAPPER = "lake_frame_"


def _strip_uuid(t):
    if isinstance(t, list):
        return [_strip_uuid(b) for b in t]
    if isinstance(t, dict):
        out = {k: _strip_uuid(v) for k, v in t.items()}
        if out.get("logicalType") == "uuid":
            out.pop("logicalType")
        return out
    return t


def _long(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class AvroDecoder:
    """Decodes the Avro bodies (no wire header) written with one writer schema (JSON text)."""

    _OPTS = {"return_record_name": True, "return_record_name_override": True}

    def __init__(self, schema_str: str):
        import fastavro

        writer = _strip_uuid(json.loads(schema_str))
        self._schema = fastavro.parse_schema(writer)
        wrapper = {"type": "record", "name": _WRAPPER, "fields": [
            {"name": "v", "type": writer},
            {"name": "s", "type": {"type": "fixed", "name": _WRAPPER + "s", "size": len(_SENTINEL)}}]}
        buf = io.BytesIO()
        fastavro.writer(buf, fastavro.parse_schema(wrapper), [], codec="null")
        self._header = buf.getvalue()
        self._sync = self._header[-16:]

    def decode_one(self, body: bytes):
        """One body -> its value. Raises ValueError (or fastavro's errors) when it does not decode
        or leaves bytes unread."""
        import fastavro

        fo = io.BytesIO(body)
        value = fastavro.schemaless_reader(fo, self._schema, None, **self._OPTS)
        if fo.tell() != len(body):
            raise ValueError(f"{len(body) - fo.tell()} trailing bytes after the Avro record")
        return value

    def decode_block(self, bodies: list[bytes]) -> list | None:
        """All bodies -> their values in one container-block read, or None when any record is bad
        (the caller then uses :meth:`decode_one` per record)."""
        import fastavro

        data = _SENTINEL.join(bodies) + _SENTINEL
        block = self._header + _long(len(bodies)) + _long(len(data)) + data + self._sync
        try:
            rows = list(fastavro.reader(io.BytesIO(block), **self._OPTS))
        except Exception:  # noqa: BLE001 - any decode failure means: isolate per record
            return None
        if len(rows) != len(bodies) or any(r["s"] != _SENTINEL for r in rows):
            return None
        return [r["v"] for r in rows]
