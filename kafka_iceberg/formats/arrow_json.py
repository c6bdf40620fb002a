"""JSON values parsed with pyarrow inside the read task, with Spark's ``from_json`` as the fallback.

The read task (:mod:`kafka_iceberg.kafka.reader`) hands each Arrow batch of raw records to
:func:`parse_batch`, which adds two columns: ``j`` (the value parsed into the table's value
columns, the struct :func:`kafka_iceberg.formats.transform.classify` makes) and ``_arrow`` (True where
pyarrow decided the record is good). Spark then classifies only the other records, with the
same expression as before (:func:`kafka_iceberg.formats.transform.classify_parsed`), so a bad record
gets the same problem kind and reason whichever path it takes.

pyarrow claims a record only when all of this holds, so Spark would find it good and parse it
to the same values:

* the value is not null, key + value are within ``bad_records.max_record_bytes``, and the value
  is one JSON object on one line (first byte ``{``, last byte ``}``, no CR or LF);
* its block parsed with ``pyarrow.json`` against the columns' types with unknown fields an
  error (``unknown_fields: reject``) or ignored (``ignore``), one row per record; a block that
  fails is halved, recursively, and only the blocks of at most :data:`FALLBACK_BLOCK` records
  that still fail go to Spark record by record;
* every ``timestamp`` string has the form ``yyyy-MM-ddTHH:mm:ss[.SSS]`` with ``Z`` or a
  ``+HH:MM`` offset (the form Spark's JSON timestamp format parses; numbers and other forms go
  to Spark), and every required column is non-null.

Only tables whose value columns are all of :data:`ARROW_TYPES` take this path
(:func:`supported`); others keep Spark's ``from_json`` for every record.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pyarrow as pa

ARROW_TYPES = {
    "int": pa.int32(),
    "bigint": pa.int64(),
    "double": pa.float64(),
    "string": pa.string(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}
"""Spark SQL type of a value column -> its Arrow type in ``j``."""

CORRUPT = "_corrupt_record"  # the struct field from_json fills for a value that does not fit
ARROW_FLAG = "_arrow"
FALLBACK_BLOCK = 32  # a block that fails is halved until it has this many records; those go to Spark
_TIMESTAMP = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,3})?(Z|[+-]\d{2}:\d{2})$"


def supported(columns: Iterable) -> bool:
    """Whether every value column (``ValueColumn``: name, Spark SQL type, required) has an Arrow type here."""
    cols = list(columns)
    return bool(cols) and all(c.type in ARROW_TYPES for c in cols)


def j_type(columns: Sequence[tuple]) -> pa.StructType:
    """The Arrow struct of ``j`` for (name, Spark SQL type, ...) ``columns``: the value columns, then
    ``_corrupt_record`` (always null here)."""
    return pa.struct([pa.field(c[0], ARROW_TYPES[c[1]]) for c in columns] + [pa.field(CORRUPT, pa.string())])


def j_ddl(columns: Sequence[tuple]) -> str:
    """``j`` and ``_arrow`` as Spark DDL (to append to the raw record schema), for (name, Spark SQL type, ...) ``columns``."""
    fields = ", ".join(f"`{c[0]}`: {c[1]}" for c in columns)
    return f"j STRUCT<{fields}, `{CORRUPT}`: string>, `{ARROW_FLAG}` BOOLEAN"


class Parser:
    """Parses one task's raw batches (picklable: built on the driver, run in the read task).

    ``columns``: the table's value columns; ``max_record_bytes``: the oversize bound (bytes of
    key + value); ``reject_unknown``: unknown top-level fields make a block fail (they go to
    Spark, which quarantines them) instead of being ignored.
    """

    def __init__(self, columns: Sequence, max_record_bytes: int, reject_unknown: bool):
        self.columns = [(c.name, c.type, c.required) for c in columns]  # (name, Spark SQL type, required)
        self.bound = max_record_bytes
        self.reject_unknown = reject_unknown

    def _parse_schema(self) -> pa.Schema:
        # timestamps are read as strings and checked against the one form both parsers agree on
        return pa.schema([pa.field(n, pa.string() if t == "timestamp" else ARROW_TYPES[t]) for n, t, _ in self.columns])

    def parse_batch(self, raw: pa.RecordBatch) -> pa.RecordBatch:
        """``raw`` (:data:`kafka_iceberg.kafka.records.RAW_SCHEMA_DDL`) plus ``j`` and ``_arrow``."""
        import numpy as np
        import pyarrow.compute as pc

        n = raw.num_rows
        chosen = np.flatnonzero(self._candidates(raw.column("key"), raw.column("value")))
        values = raw.column("value") if len(chosen) == n else pc.take(raw.column("value"), pa.array(chosen))
        blocks = list(self._blocks(values, chosen))
        fields = j_type(self.columns)
        if not blocks:
            return self._with_j(raw, pa.nulls(n, fields), pa.array(np.zeros(n, dtype=bool)))
        positions = np.concatenate([np.asarray(idx, dtype=np.int64) for idx, _ in blocks])
        cols = [pa.concat_arrays([part[c] for _, part in blocks]) for c in range(len(self.columns))]
        ok = pa.array(np.ones(len(positions), dtype=bool))
        for c, (_, _, req) in enumerate(self.columns):
            if req:  # a required column that is null: Spark words the reason
                ok = pc.and_(ok, pc.is_valid(cols[c]))
        if len(positions) != n or not np.array_equal(positions, np.arange(n)):
            where = np.full(n, -1, dtype=np.int64)
            where[positions] = np.arange(len(positions))
            take = pa.array(where, mask=where < 0)
            cols = [pc.take(col, take) for col in cols]
            ok = pc.fill_null(pc.take(ok, take), False)
        cols.append(pa.nulls(n, pa.string()))
        j = pa.StructArray.from_arrays(cols, fields=list(fields), mask=pc.invert(ok))
        return self._with_j(raw, j, ok)

    @staticmethod
    def _with_j(raw: pa.RecordBatch, j, ok) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([*raw.columns, j, ok], names=[*raw.schema.names, "j", ARROW_FLAG])

    def _candidates(self, keys: pa.Array, values: pa.Array):
        """Records pyarrow may parse (a numpy bool array): a value within the bound that starts with ``{``
        and ends with ``}`` (that it holds no CR or LF is checked per block, in :meth:`_parse`)."""
        import numpy as np
        import pyarrow.compute as pc

        size = pc.add(pc.fill_null(pc.binary_length(keys), 0), pc.fill_null(pc.binary_length(values), 0))
        ok = pc.and_(pc.is_valid(values), pc.less_equal(size, self.bound))
        ok = pc.and_(ok, pc.equal(pc.binary_slice(values, 0, 1), pa.scalar(b"{", pa.binary())))
        ok = pc.and_(ok, pc.equal(pc.binary_slice(values, -1, 2**31 - 1), pa.scalar(b"}", pa.binary())))
        # CR and LF are checked per block in _parse (one scan of the joined block)
        return np.asarray(pc.fill_null(ok, False).to_numpy(zero_copy_only=False), dtype=bool)

    def _blocks(self, values: pa.Array, idx):
        """(record indexes, parsed columns) of every block that parsed: the whole batch, or after a
        failure its halves, recursively, down to :data:`FALLBACK_BLOCK` records (left to Spark)."""
        if not values:
            return
        table = self._parse(values)
        if table is not None:
            yield idx, table
        elif len(values) > FALLBACK_BLOCK:
            half = len(values) // 2
            yield from self._blocks(values[:half], idx[:half])
            yield from self._blocks(values[half:], idx[half:])

    def _parse(self, values: pa.Array):
        import numpy as np
        import pyarrow.compute as pc
        import pyarrow.json as pajson

        options = pajson.ParseOptions(
            explicit_schema=self._parse_schema(), unexpected_field_behavior="error" if self.reject_unknown else "ignore"
        )
        # one newline-delimited buffer, joined by Arrow (no Python object per record, the GIL released)
        listed = pa.ListArray.from_arrays(pa.array([0, len(values)], pa.int32()), values)
        buf = pc.binary_join(listed, pa.scalar(b"\n", pa.binary()))[0].as_buffer()
        raw = np.frombuffer(buf, dtype=np.uint8)
        if np.count_nonzero(raw == 10) != len(values) - 1 or (raw == 13).any():
            return None  # a value spans lines: the block fails, its records are isolated by halving
        try:
            table = pajson.read_json(
                pa.BufferReader(buf),
                read_options=pajson.ReadOptions(use_threads=False, block_size=max(1 << 20, buf.size + 1)),
                parse_options=options,
            )
            if table.num_rows != len(values):
                return None
            out = []
            for name, typ, _ in self.columns:
                col = table.column(name)
                if typ == "timestamp":
                    if pc.all(pc.match_substring_regex(col, _TIMESTAMP)).as_py() is False:
                        return None
                    col = pc.cast(col, ARROW_TYPES[typ])
                out.append(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
            return out
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
