"""Avro payloads -> Python rows with fastavro, a group at a time.

:meth:`AvroDecoder.decode_block` joins the bodies of a group into ONE Avro container block and
lets fastavro's compiled reader decode it in one call. Each body is followed by a 4-byte sentinel
read through a wrapper record ``{v: <writer schema>, s: fixed(4)}``: a body that decodes to fewer
or more bytes than it has shifts the sentinel, so a bad record can never pass silently by
misaligning its neighbours. On any failure the group is decoded again per record
(:meth:`AvroDecoder.decode_one`, ``schemaless_reader`` with a check that every byte was used) to
isolate the bad records. fastavro handles maps, multi-type unions and named-type references,
which polars' block reader does not (measured in :mod:`devtools.bench.formats`).

The ``uuid`` logical type is read as its text (the form Spark carries for Iceberg ``uuid``).
Timestamps, dates and times are read as their raw numbers when the writer schema has no
multi-type union (:meth:`AvroDecoder.raw_type`): Arrow takes the numbers in the writer's unit and a
cast brings them to the table's, which saves fastavro building a ``datetime`` per value (about
40 % of the decode time of a flat record with one timestamp).
"""

from __future__ import annotations

import io
import json

import pyarrow as pa

from kafka_iceberg.formats.wire import zigzag_varint

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


_RAW_UNITS = {
    "timestamp-millis": "ms",
    "timestamp-micros": "us",
    "timestamp-nanos": "ns",
    "local-timestamp-millis": "ms",
    "local-timestamp-micros": "us",
    "date": "date",
    "time-millis": "time-ms",
    "time-micros": "time-us",
}


def _strip_time(t, named: dict):
    """(``t`` without its time logical types, info): info mirrors the records (field -> info),
    arrays and maps (``("items", info)``) down to the stripped leaves' units; None when nothing
    was stripped. Raises LookupError on a multi-type union (no raw decoding then)."""
    if isinstance(t, list):
        non_null = [b for b in t if b != "null"]
        if len(non_null) > 1:
            raise LookupError("multi-type union")
        stripped = [_strip_time(b, named) if b != "null" else ("null", None) for b in t]
        return [x for x, _ in stripped], next((i for _, i in stripped if i is not None), None)
    if isinstance(t, str):
        return t, named.get(t.rpartition(".")[2])
    if t.get("logicalType") in _RAW_UNITS and t["type"] in ("int", "long"):
        return t["type"], _RAW_UNITS[t["logicalType"]]
    kind = t["type"]
    if kind in ("record", "error"):
        fields, info = [], {}
        for f in t["fields"]:
            ft, fi = _strip_time(f["type"], named)
            fields.append({**f, "type": ft})
            if fi is not None:
                info[f["name"]] = fi
        named[t["name"].rpartition(".")[2]] = info or None
        return {**t, "fields": fields}, info or None
    if kind in ("array", "map"):
        key = "items" if kind == "array" else "values"
        inner, info = _strip_time(t[key], named)
        return {**t, key: inner}, None if info is None else ("items", info)
    return t, None


def _raw_arrow(target: pa.DataType, info):
    """``target`` with the stripped leaves in their raw unit, or None when a leaf does not match."""
    if info is None:
        return target
    if isinstance(info, dict):
        if not pa.types.is_struct(target):
            return None
        fields = []
        for f in target:
            t = _raw_arrow(f.type, info.get(f.name))
            if t is None:
                return None
            fields.append(f.with_type(t))
        return pa.struct(fields)
    if isinstance(info, tuple):
        if pa.types.is_list(target):
            inner = _raw_arrow(target.value_type, info[1])
            return None if inner is None else pa.list_(target.value_field.with_type(inner))
        if pa.types.is_map(target):
            inner = _raw_arrow(target.item_type, info[1])
            return None if inner is None else pa.map_(target.key_type, target.item_field.with_type(inner))
        return None
    if info in ("ms", "us", "ns") and pa.types.is_timestamp(target):
        return pa.timestamp(info, tz=target.tz)
    if info == "date" and pa.types.is_date32(target):
        return target
    if info.startswith("time-") and pa.types.is_time(target):
        return pa.time32("ms") if info == "time-ms" else pa.time64("us")
    return None


class AvroDecoder:
    """Decodes the Avro bodies (no wire header) written with one writer schema (JSON text)."""

    _OPTS = {"return_record_name": True, "return_record_name_override": True}

    def __init__(self, schema_str: str):

        writer = _strip_uuid(json.loads(schema_str))
        try:
            raw, self._raw_info = _strip_time(writer, {})
        except LookupError:
            raw, self._raw_info = None, None
        self._modes = {False: self._parse(writer)}
        if self._raw_info is not None:
            self._modes[True] = self._parse(raw)

    @staticmethod
    def _parse(writer) -> tuple:
        """(parsed schema, container header, sync marker) for ``writer`` (JSON)."""
        import fastavro

        wrapper = {
            "type": "record",
            "name": _WRAPPER,
            "fields": [
                {"name": "v", "type": writer},
                {"name": "s", "type": {"type": "fixed", "name": _WRAPPER + "s", "size": len(_SENTINEL)}},
            ],
        }
        buf = io.BytesIO()
        fastavro.writer(buf, fastavro.parse_schema(wrapper), [], codec="null")
        header = buf.getvalue()
        return fastavro.parse_schema(writer), header, header[-16:]

    def raw_type(self, target: pa.StructType) -> pa.StructType | None:
        """The Arrow type to build from ``decode_*(raw=True)`` values before a cast to ``target``,
        or None when raw decoding does not apply (no time logical types, a multi-type union, or a
        column of another kind than the writer's)."""
        if self._raw_info is None:
            return None
        return _raw_arrow(target, self._raw_info)

    def decode_one(self, body: bytes, raw: bool = False):
        """One body -> its value. Raises ValueError (or fastavro's errors) when it does not decode
        or leaves bytes unread."""
        import fastavro

        fo = io.BytesIO(body)
        value = fastavro.schemaless_reader(fo, self._modes[raw][0], None, **self._OPTS)
        if fo.tell() != len(body):
            raise ValueError(f"{len(body) - fo.tell()} trailing bytes after the Avro record")
        return value

    def decode_block(self, bodies: list[bytes], raw: bool = False) -> list | None:
        """All bodies -> their values in one container-block read, or None when any record is bad
        (the caller then uses :meth:`decode_one` per record)."""
        import fastavro

        _, header, sync = self._modes[raw]
        data = _SENTINEL.join(bodies) + _SENTINEL
        block = header + zigzag_varint(len(bodies)) + zigzag_varint(len(data)) + data + sync
        try:
            rows = list(fastavro.reader(io.BytesIO(block), **self._OPTS))
        except Exception:  # noqa: BLE001 - any decode failure means: isolate per record
            return None
        if len(rows) != len(bodies) or any(r["s"] != _SENTINEL for r in rows):
            return None
        return [r["v"] for r in rows]
