"""Kafka records as Arrow columns: the raw batches a read yields (:data:`RAW_SCHEMA_DDL`, one row per
record), built from librdkafka ``Message`` objects a consume call returned."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

RAW_SCHEMA_DDL = (
    "topic STRING, partition INT, offset BIGINT, timestamp_ms BIGINT, "
    "key BINARY, value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
)
"""Spark schema of the raw records a read yields, one row per Kafka record."""

HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
RAW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp_ms", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", HEADER_TYPE),
    ]
)


def raw_batch(topic, partition, offsets, timestamps, keys, values, headers: pa.Array) -> pa.RecordBatch:
    """One :data:`RAW_SCHEMA` batch of ``topic``/``partition``'s records: ``offsets`` (a list or a numpy
    int64 array), the lists ``timestamps`` (ms since epoch), ``keys`` and ``values`` (bytes or None), one item per record, and
    their ``headers`` (:func:`header_array` or :func:`no_headers`)."""
    n = len(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.array(offsets, pa.int64()),
            pa.array(timestamps, pa.int64()),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            headers,
        ],
        schema=RAW_SCHEMA,
    )


class Chunk:
    """Columns of one partition's records read so far, handed on (to Spark, or to the driver's parse
    pool) as one Arrow batch; ``records`` counts them."""

    def __init__(self):
        self.records = 0
        self.offsets: list = []  # numpy int64 arrays, one per extend
        self.timestamps, self.keys, self.values, self.headers = [], [], [], []
        self.any_headers = False

    def extend(self, msgs: list) -> None:
        """Add error-free messages of one partition, offsets increasing (one list comprehension per column:
        this runs for every record of a micro-batch, under the GIL). Offsets without a gap (no compaction,
        no transaction markers between them) are taken from the first and last record alone."""
        if not msgs:
            return
        first, last = msgs[0].offset(), msgs[-1].offset()
        if last - first == len(msgs) - 1:
            self.offsets.append(np.arange(first, last + 1, dtype=np.int64))
        else:
            self.offsets.append(np.array([m.offset() for m in msgs], dtype=np.int64))
        self.records += len(msgs)
        self.timestamps += [m.timestamp()[1] for m in msgs]
        self.keys += [m.key() for m in msgs]
        self.values += [m.value() for m in msgs]
        headers = [m.headers() for m in msgs]  # librdkafka says None for a record without headers
        self.headers += headers
        self.any_headers = self.any_headers or any(headers)

    def batch(self, topic: str, partition: int) -> pa.RecordBatch:
        """The records so far as one :data:`RAW_SCHEMA` batch; the chunk is empty afterwards."""
        offsets = np.concatenate(self.offsets) if self.offsets else np.zeros(0, dtype=np.int64)
        out = raw_batch(
            topic,
            partition,
            offsets,
            self.timestamps,
            self.keys,
            self.values,
            header_array(self.headers) if self.any_headers else no_headers(self.records),
        )
        self.__init__()
        return out


def header_array(headers: list) -> pa.Array:
    """Kafka headers as ``list<struct<key, value>>``: a record always has a header array (Kafka's
    record format), so one without headers gets an empty list, never null."""
    return pa.array([[{"key": k, "value": v} for k, v in h] if h else [] for h in headers], HEADER_TYPE)


def no_headers(n: int) -> pa.Array:
    """``n`` empty header lists (no Python object per record)."""
    return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], HEADER_TYPE.value_type))
