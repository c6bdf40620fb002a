"""Reading explicit offset ranges from Kafka inside Spark tasks.

The driver turns the plan's ranges (split so no task reads more than
``max_records_per_task`` offsets) into a one-row-per-range DataFrame with one Spark
partition per row; ``mapInArrow`` then runs :func:`read_range` in each task. A task assigns
its topic partition, seeks to ``start`` and stops at ``end``: it never joins a consumer
group and never commits.

Gaps are tolerated: offsets taken by transaction markers, aborted transactional records
(``read_committed``) or compaction are simply absent. Data loss is not: the consumer runs
with ``auto.offset.reset=error``, so a range whose start was deleted by retention raises
:class:`~kafka_iceberg.errors.DataLossError` instead of silently jumping ahead.
"""

from __future__ import annotations

import time
from typing import Iterator, Mapping

import pyarrow as pa

RAW_SCHEMA_DDL = (
    "topic STRING, partition INT, offset BIGINT, timestamp_ms BIGINT, "
    "key BINARY, value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
)
"""Spark schema of the raw records a task yields, one row per Kafka record."""

_HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp_ms", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", _HEADER_TYPE),
    ]
)
_CHUNK = 50_000  # records per Arrow batch handed back to Spark


def _batch(topic, partition, offsets, timestamps, keys, values, headers) -> pa.RecordBatch:
    n = len(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array(timestamps, pa.int64()),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(headers, _HEADER_TYPE),
        ],
        schema=_ARROW_SCHEMA,
    )


def read_range(
    conf: Mapping[str, object], table: str, topic: str, partition: int, start: int, end: int, timeout_s: float
) -> Iterator[pa.RecordBatch]:
    """Yield every record of ``topic``/``partition`` with ``start <= offset < end`` as Arrow batches.

    ``conf`` is a librdkafka consumer configuration (bootstrap servers and security); a
    ``group.id`` is set but never joined or committed. Records arrive in offset order.

    Raises:
        DataLossError: ``start`` (or a later offset of the range) no longer exists in the log.
        ReadTimeoutError: no progress for ``timeout_s`` seconds before reaching ``end``.
        KafkaException: any other consumer error (broker down beyond librdkafka's retries).
    """
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    from kafka_iceberg.errors import DataLossError, ReadTimeoutError

    if end <= start:
        return
    transient = (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT)
    consumer = Consumer(
        {
            # tunable through KAFKA_CLIENT_CONFIG
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
            # a broker that ignores the fetch limits (the dev broker does) can answer with more
            # than librdkafka's 100 MB default response size
            "receive.message.max.bytes": 512 * 1024 * 1024,
            **conf,
            # what exactly-once reading depends on: not tunable
            "group.id": f"lake-reader.{table}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "isolation.level": "read_committed",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        offsets: list[int] = []
        timestamps: list[int] = []
        keys: list = []
        values: list = []
        headers: list = []
        position = start  # the next offset this task expects
        deadline = time.monotonic() + timeout_s
        done = False
        while not done:
            # never ask for more than the range still holds, or consume() waits out its timeout
            remaining = end - position
            msgs = consumer.consume(num_messages=max(1, min(10_000, remaining)), timeout=1.0)
            before = position
            for m in msgs:
                err = m.error()
                if err is not None:
                    code = err.code()
                    if code == KafkaError._PARTITION_EOF:
                        if m.offset() >= end:
                            done = True
                            break
                        continue
                    if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        raise DataLossError(table, topic, partition, position, -1)
                    if err.fatal() or not (err.retriable() or code in transient):
                        raise KafkaException(err)
                    # a broker blip: librdkafka reconnects and refetches on its own; the
                    # no-progress deadline above bounds how long we wait for it
                    continue
                off = m.offset()
                if off >= end:
                    done = True
                    break
                offsets.append(off)
                position = off + 1
                timestamps.append(m.timestamp()[1])
                keys.append(m.key())
                values.append(m.value())
                h = m.headers()
                headers.append([{"key": k, "value": v} for k, v in h] if h else None)
                if off == end - 1:
                    done = True
                    break
            if position > before:
                deadline = time.monotonic() + timeout_s
            elif not done and time.monotonic() > deadline:  # only real records count as progress
                raise ReadTimeoutError(
                    f"table {table}: reading topic {topic} partition {partition} offsets [{start}, {end}) "
                    f"made no progress for {timeout_s:.0f} s; next offset to read: {position}"
                )
            if len(offsets) >= _CHUNK:
                yield _batch(topic, partition, offsets, timestamps, keys, values, headers)
                offsets, timestamps, keys, values, headers = [], [], [], [], []
        if offsets:
            yield _batch(topic, partition, offsets, timestamps, keys, values, headers)
    finally:
        consumer.close()


def make_task_reader(conf: Mapping[str, object], table: str, timeout_s: float):
    """Build the ``mapInArrow`` function: input batches of (topic, partition, start, end)
    rows, output batches in :data:`RAW_SCHEMA_DDL`."""
    conf = dict(conf)

    def read_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for row in batch.to_pylist():
                yield from read_range(conf, table, row["topic"], row["partition"], row["start"], row["end"], timeout_s)

    return read_partition
