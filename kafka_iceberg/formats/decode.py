"""Framed values -> Arrow rows of the table's schema, with a verdict for every bad record.

:func:`decode_values` is what a Spark task calls (inside ``mapInArrow``) with the values of a
batch, the writer schemas the driver resolved (:func:`kafka_iceberg.formats.resolver.resolve`)
and the table's Arrow schema (:func:`kafka_iceberg.formats.types.arrow_schema`). Records are
grouped by schema id (and Protobuf message indexes); each group is decoded at once (Avro: one
container block) and the whole batch becomes one Arrow struct array; per-record work happens
only to isolate bad records.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from cachetools import LRUCache

from kafka_iceberg.formats.avro import AvroDecoder
from kafka_iceberg.formats.protobuf import ProtobufDecoder
from kafka_iceberg.formats.resolver import SCHEMA_TYPES, WriterSchema
from kafka_iceberg.formats.values import FitError, converter
from kafka_iceberg.formats.wire import (
    SCHEMA,
    UNDECODABLE,
    UNKNOWN_SCHEMA_ID,
    BadRecord,
    WireError,
    protobuf_indexes,
    schema_id_of,
)

DECODER_CACHE_SIZE = 1024
"""Decoders a process keeps (least recently used dropped first): one per writer schema (and Protobuf
message) it decoded, over every table it serves; a dropped one is parsed again when next needed."""

_DECODERS: LRUCache = LRUCache(maxsize=DECODER_CACHE_SIZE)  # (format, schema id, schema text, indexes) -> decoder
_DECODERS_LOCK = threading.Lock()
"""Guards :data:`_DECODERS`: the micro-batches of a worker's threads decode in one process. A decoder is
immutable once built, so threads share it."""


@dataclass
class Decoded:
    """The result of :func:`decode_values` for ``n`` input values.

    ``rows``: the good records as a table with the target schema, in input order;
    ``row_index[i]``: the input position (0-based) of ``rows`` row ``i``; ``bad``: one
    :class:`~kafka_iceberg.formats.wire.BadRecord` per bad input, in input order;
    ``schema_ids``: records per schema id seen (for the snapshot summary).
    """

    rows: pa.Table
    row_index: list[int]
    bad: list[BadRecord]
    schema_ids: dict[int, int] = field(default_factory=dict)


def _decoder(fmt: str, writer: WriterSchema, indexes: tuple[int, ...]):
    """The decoder of ``fmt`` values written with ``writer`` (Protobuf: the message at ``indexes``), built
    once per process and kept in :data:`_DECODERS` (schema ids are immutable). Raises what parsing the
    schema raises."""
    key = (fmt, writer.schema_id, writer.schema_str, indexes)
    with _DECODERS_LOCK:
        decoder = _DECODERS.get(key)
    if decoder is None:  # parsed outside the lock: two threads may both parse it, one is kept
        if fmt == "avro":
            decoder = AvroDecoder(writer.schema_str)
        elif fmt == "protobuf":
            decoder = ProtobufDecoder(writer.schema_str, indexes)
        else:
            decoder = _JsonDecoder()
        with _DECODERS_LOCK:
            decoder = _DECODERS.setdefault(key, decoder)
    return decoder


class _JsonDecoder:
    def decode_one(self, payload: bytes):
        import json

        value = json.loads(payload)
        if not isinstance(value, dict):
            raise ValueError(f"a JSON {type(value).__name__}, not an object")
        return value


def _group(
    values: Sequence[bytes | None],
    writers: Mapping[int, WriterSchema | None],
    fmt: str,
    bad: list[BadRecord],
    refused: Mapping[int, tuple[str, str]],
) -> dict[tuple, list[int]]:
    """Input positions by (schema id, message indexes); wire-level problems go to ``bad``."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, v in enumerate(values):
        try:
            sid = schema_id_of(v)
            writer = writers.get(sid)
            if writer is None:
                raise WireError(UNKNOWN_SCHEMA_ID, f"schema id {sid} is not in the schema registry")
            if sid in refused:
                raise WireError(*refused[sid])
            if writer.schema_type != SCHEMA_TYPES[fmt]:
                raise WireError(UNDECODABLE, f"schema id {sid} is a {writer.schema_type} schema; the table reads {fmt}")
            indexes, _ = protobuf_indexes(v) if fmt == "protobuf" else ((), 5)
            groups[(sid, indexes)].append(i)
        except WireError as e:
            bad.append(BadRecord(i, e.kind, str(e)))
    return groups


def _decode_group(dec, fmt: str, values, positions: list[int], raw: bool, bad: list[BadRecord]) -> dict[int, object]:
    """Position -> decoded value of one group; undecodable records go to ``bad``."""
    if fmt == "protobuf":
        payloads = [values[i][protobuf_indexes(values[i])[1] :] for i in positions]
    else:
        payloads = [values[i][5:] for i in positions]
    if fmt == "avro":
        decoded = dec.decode_block(payloads, raw)
        if decoded is not None:
            return dict(zip(positions, decoded))
    out = {}
    for i, p in zip(positions, payloads):
        try:
            out[i] = dec.decode_one(p, raw) if raw else dec.decode_one(p)
        except Exception as e:  # noqa: BLE001 - every library error of a bad payload is a verdict
            bad.append(
                BadRecord(
                    i,
                    UNDECODABLE,
                    f"undecodable {fmt} payload for schema id {schema_id_of(values[i])}: {type(e).__name__}: {e}",
                )
            )
    return out


def decode_values(
    values: Sequence[bytes | None],
    writers: Mapping[int, WriterSchema | None],
    target: pa.Schema,
    fmt: str,
    refused: Mapping[int, tuple[str, str]] | None = None,
) -> Decoded:
    """Decode framed ``values`` (Confluent wire format) of format ``fmt`` (``avro``, ``protobuf``
    or ``json_schema``) into rows of ``target``.

    Fields the table lacks are dropped (the write path decides on them before, with
    :func:`kafka_iceberg.formats.evolution.classify`); columns the record lacks are null. A
    record is bad (``schema``) when a value does not convert to its column's type or a required
    column is null. ``refused``: schema id -> (kind, reason) whose records are bad without
    decoding (``BatchPlan.refused`` of :func:`kafka_iceberg.formats.evolution.plan_batch`).
    Never raises for bad input.
    """
    bad: list[BadRecord] = []
    groups = _group(values, writers, fmt, bad, refused or {})
    typ = pa.struct(list(target))
    parts: list[tuple[pa.StructArray, list[int]]] = []
    for (sid, indexes), positions in groups.items():
        try:
            dec = _decoder(fmt, writers[sid], indexes)
        except Exception as e:  # noqa: BLE001 - a schema the decoder cannot build
            bad.extend(BadRecord(i, UNDECODABLE, f"schema id {sid} cannot be used to decode: {e}") for i in positions)
            continue
        raw = dec.raw_type(typ) if fmt == "avro" else None
        decoded = _decode_group(dec, fmt, values, positions, raw is not None, bad)
        order = sorted(decoded)
        arr, index = _to_arrow([decoded[i] for i in order], order, raw or typ, fmt, bad)
        parts.append((arr.cast(typ) if raw is not None else arr, index))
    rows, index = _merge(parts, typ)
    bad.sort(key=lambda b: b.index)
    counts = Counter(sid for (sid, _), pos in groups.items() for _ in pos)
    return Decoded(pa.Table.from_struct_array(rows) if len(rows) else target.empty_table(), index, bad, dict(counts))


def _merge(parts: list[tuple[pa.StructArray, list[int]]], typ: pa.StructType) -> tuple[pa.StructArray, list[int]]:
    """The groups' rows as one array in input order."""
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return pa.array([], type=typ), []
    index = [i for _, idx in parts for i in idx]
    order = np.argsort(np.array(index, dtype=np.int64), kind="stable")
    return pa.concat_arrays([a for a, _ in parts]).take(pa.array(order)), [index[k] for k in order]


def _convert(items: list, positions: list[int], conv, bad: list[BadRecord]) -> tuple[list, list[int]]:
    if conv is None:
        return items, positions
    keep, where = [], []
    for v, i in zip(items, positions):
        try:
            keep.append(conv(v))
            where.append(i)
        except FitError as e:
            bad.append(BadRecord(i, SCHEMA, f"the value does not fit the table schema: {e}"))
    return keep, where


def _to_arrow(
    items: list, positions: list[int], typ: pa.StructType, fmt: str, bad: list[BadRecord]
) -> tuple[pa.StructArray, list[int]]:
    items, positions = _convert(items, positions, converter(typ, text=fmt == "json_schema"), bad)
    try:
        arr = pa.array(items, type=typ)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        arr = None
    if arr is None:  # isolate the records pyarrow refuses
        keep, where = [], []
        for v, i in zip(items, positions):
            try:
                pa.array([v], type=typ)
                keep.append(v)
                where.append(i)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
                bad.append(BadRecord(i, SCHEMA, f"the value does not fit the table schema: {e}"))
        items, positions = keep, where
        arr = pa.array(items, type=typ)
    violations = _required_nulls(arr, typ, "")
    if not violations:
        return arr, positions
    for row, path in sorted(violations.items()):
        bad.append(
            BadRecord(
                positions[row],
                SCHEMA,
                f"the value does not fit the table schema: required field {path} is missing or null",
            )
        )
    keep_mask = pa.array([r not in violations for r in range(len(arr))])
    return arr.filter(keep_mask), [p for r, p in enumerate(positions) if r not in violations]


def _required_nulls(arr: pa.Array, typ: pa.DataType, path: str) -> dict[int, str]:
    """Row -> path of the first required (non-nullable) field that is null, over nested structs,
    list elements and map values; rows are positions in ``arr``."""
    out: dict[int, str] = {}
    if pa.types.is_struct(typ):
        valid = pc.is_valid(arr)
        for k in range(typ.num_fields):
            f = typ.field(k)
            child = arr.field(k)
            name = f"{path}.{f.name}" if path else f.name
            if not f.nullable:
                rows = pc.and_(valid, pc.is_null(child))
                for r in pc.indices_nonzero(rows).to_pylist():
                    out.setdefault(r, name)
            for r, p in _required_nulls(child, f.type, name).items():
                out.setdefault(r, p)
    elif pa.types.is_list(typ) or pa.types.is_map(typ):
        inner_field = typ.value_field if pa.types.is_list(typ) else typ.item_field
        offsets = arr.offsets.to_numpy()
        start, end = int(offsets[0]), int(offsets[-1])
        if end == start:
            return out
        flat = (arr.values if pa.types.is_list(typ) else arr.items).slice(start, end - start)
        parents = np.repeat(np.arange(len(arr)), np.diff(offsets))
        name = f"{path}[]"
        if not inner_field.nullable:
            for j in pc.indices_nonzero(pc.is_null(flat)).to_pylist():
                out.setdefault(int(parents[j]), name)
        for j, p in _required_nulls(flat, inner_field.type, name).items():
            out.setdefault(int(parents[j]), p)
    return out


def as_struct_column(rows: pa.Table) -> pa.StructArray:
    """``rows`` (e.g. decoded keys) as ONE struct column with the same fields and nullability:
    for ``key_format`` declarations that keep a parsed key as a struct rather than as columns."""
    return pa.StructArray.from_arrays([c.combine_chunks() for c in rows.columns], fields=list(rows.schema))
