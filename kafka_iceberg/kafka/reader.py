"""Reading explicit offset ranges from Kafka, in Spark tasks or in the driver.

For a Spark job the driver turns the plan's ranges (split so no task reads more than
``max_records_per_task`` offsets) into a one-row-per-range DataFrame with one Spark
partition per row; ``mapInArrow`` then runs :func:`read_range` in each task. A task assigns
its topic partition, seeks to ``start`` and stops at ``end``: it never joins a consumer
group and never commits. The driver's own read (:mod:`kafka_iceberg.batch.driver_read`) reads
every partition's range at once with one consumer (:func:`read_ranges`).

Gaps are tolerated: offsets taken by transaction markers, aborted transactional records
(``read_committed``) or compaction are simply absent. Data loss is not: the consumer runs
with ``auto.offset.reset=error``, so a range whose start was deleted by retention raises
:class:`~kafka_iceberg.errors.DataLossError` instead of silently jumping ahead.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.accumulators import AccumulatorParam

from kafka_iceberg.errors import DataLossError, NotAuthorizedError, ReadTimeoutError
from kafka_iceberg.kafka.consumers import ConsumerPool, new_consumer
from kafka_iceberg.kafka.records import Chunk

CHUNK_RECORDS = 50_000
"""Records per Arrow batch a read yields (to Spark, or to the driver's parse pool)."""


def read_range(
    conf: Mapping[str, object],
    table: str,
    topic: str,
    partition: int,
    start: int,
    end: int,
    timeout_s: float,
    consumers: ConsumerPool | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield every record of ``topic``/``partition`` with ``start <= offset < end`` as Arrow batches.

    ``conf`` is a librdkafka consumer configuration (bootstrap servers and security); a
    ``group.id`` is set but never joined or committed. Records arrive in offset order, in batches of
    about :data:`CHUNK_RECORDS` records. The consumer is new, or taken from ``consumers`` and given back once the
    range is read (closed instead if the read failed); either way its fetches stop before the last batch
    is yielded.

    Raises:
        DataLossError: ``start`` (or a later offset of the range) no longer exists in the log.
        ReadTimeoutError: no progress for ``timeout_s`` seconds before reaching ``end``.
        KafkaException: any other consumer error (broker down beyond librdkafka's retries).
    """
    yield from read_ranges(conf, table, [(topic, partition, start, end)], timeout_s, consumers)


def read_ranges(
    conf: Mapping[str, object],
    table: str,
    ranges: Sequence[tuple[str, int, int, int]],
    timeout_s: float,
    consumers: ConsumerPool | None = None,
) -> Iterator[pa.RecordBatch]:
    """:func:`read_range` for several (topic, partition, start, end) ranges, at most one per topic
    partition, read by one consumer at once (librdkafka fetches every assigned partition in one request,
    where reading them one after another starts each with a fetch of its own). Each batch holds records of
    one partition, in offset order; batches of different partitions interleave. A partition whose range is
    read is paused (its fetches stop) while the others are read; its last batch follows at once.

    Raises what :func:`read_range` raises (ReadTimeoutError: no range progressed for ``timeout_s``
    seconds), and ValueError for two ranges of one topic partition.
    """
    from confluent_kafka import TopicPartition

    todo = _todo(table, ranges)
    if not todo:
        return
    consumer = consumers.take(table) if consumers is not None else new_consumer(conf, table)
    paused, last, read = [], None, False
    try:
        consumer.assign([TopicPartition(r.topic, r.partition, r.position) for r in todo.values()])
        deadline = time.monotonic() + timeout_s
        while todo:
            # never ask for more than the ranges still hold, or consume() waits out its timeout
            left = sum(r.end - r.position for r in todo.values())
            msgs = consumer.consume(num_messages=max(1, min(10_000, CHUNK_RECORDS, left)), timeout=1.0)
            progressed = False
            for key, run in _runs(msgs, todo):
                r = todo.get(key)
                if r is None:
                    continue  # records past the end of a range read in this same consume
                before = r.position
                r.position, done = _take(run, r.end, r.position, r.chunk, (table, *key))
                progressed = progressed or r.position > before
                if done:
                    del todo[key]
                    if not todo:
                        last = r
                        break
                    paused.append(TopicPartition(*key))
                    consumer.pause(paused[-1:])
                if r.chunk.records >= CHUNK_RECORDS or (done and r.chunk.records):
                    yield r.chunk.batch(*key)
            if progressed:
                deadline = time.monotonic() + timeout_s
            elif todo and time.monotonic() > deadline:  # only real records count as progress
                raise _no_progress(table, todo.values(), timeout_s)
        read = True
    finally:
        # released before the last batch goes to the caller: a consumer left assigned while the caller
        # parses and writes that batch keeps fetching past the range (at the log end, empty fetches in a loop)
        _release(consumer, consumers if read else None, table, paused)
    if last is not None and last.chunk.records:
        yield last.chunk.batch(last.topic, last.partition)


def _release(consumer, consumers: ConsumerPool | None, table: str, paused: list) -> None:
    """Give ``consumer`` back to ``consumers`` (None: close it; a read that failed passes None) with the
    ``paused`` partitions resumed: a pooled consumer assigned one of them again must fetch it."""
    if consumers is None:
        consumer.close()
        return
    if paused:
        consumer.resume(paused)
    consumers.give_back(table, consumer)


def _todo(table: str, ranges: Sequence[tuple[str, int, int, int]]) -> dict[tuple, _Range]:
    """The non-empty ``ranges`` by (topic, partition). Raises ValueError for two ranges of one partition."""
    todo = {(t, p): _Range(t, p, s, e) for t, p, s, e in ranges if e > s}
    if len(todo) < sum(1 for r in ranges if r[3] > r[2]):
        raise ValueError(f"table {table}: two ranges of one topic partition in {list(ranges)}")
    return todo


def _no_progress(table: str, todo, timeout_s: float) -> ReadTimeoutError:
    """The error of a read whose ranges ``todo`` made no progress for ``timeout_s`` seconds."""
    return ReadTimeoutError(
        f"table {table}: reading "
        + ", ".join(f"topic {r.topic} partition {r.partition} to offset {r.end}" for r in todo)
        + f" made no progress for {timeout_s:.0f} s; next offsets to read: "
        + ", ".join(str(r.position) for r in todo)
    )


class _Range:
    """One range being read: its topic partition, end offset (exclusive), next offset to read and the
    records read since its last batch."""

    def __init__(self, topic: str, partition: int, start: int, end: int):
        self.topic, self.partition, self.position, self.end = topic, partition, start, end
        self.chunk = Chunk()


def _runs(msgs: list, todo: Mapping[tuple, _Range]) -> list[tuple[tuple, list]]:
    """``msgs`` cut into runs of one topic partition, each with the key of ``todo`` it belongs to: an event
    of no partition (None, -1) goes to the first range still read, a run of a partition not in ``todo``
    (read already, or left from an earlier read of a pooled consumer) is dropped."""
    if not msgs:
        return []
    parts = [m.partition() for m in msgs]  # a list comprehension: a third of map(methodcaller)'s time
    topics = [m.topic() for m in msgs] if len({t for t, _ in todo}) > 1 else None
    if topics is None and parts.count(parts[0]) == len(parts):
        cuts = [0, len(parts)]  # the common case: one fetch's records of one partition
    else:
        cuts = [0, *(i for i in range(1, len(parts)) if _cut(parts, topics, i)), len(parts)]
    first = next(iter(todo))
    out = []
    for a, b in zip(cuts, cuts[1:]):
        key = (topics[a] if topics else first[0], parts[a])
        if key in todo:
            out.append((key, msgs[a:b]))
        elif parts[a] in (None, -1):
            out.append((first, msgs[a:b]))
    return out


def _cut(parts: list, topics: list | None, i: int) -> bool:
    return parts[i] != parts[i - 1] or (topics is not None and topics[i] != topics[i - 1])


def _take(msgs, end: int, position: int, chunk: Chunk, where: tuple) -> tuple[int, bool]:
    """Add the records of ``msgs`` below ``end`` to ``chunk``; returns (next offset to read, range done).
    ``where`` is (table, topic, partition) for errors.

    Raises:
        DataLossError: the next offset is gone. NotAuthorizedError: the topic's ACL refuses the read.
        KafkaException: another fatal or non-retriable error.
    """
    from confluent_kafka import KafkaError, KafkaException

    partition = where[2]
    if (
        msgs
        and not any([m.error() for m in msgs])
        and _current(msgs[0], partition, position)
        and _current(msgs[-1], partition)
    ):
        return _take_records(msgs, end, position, chunk)  # records of this read only: the common case
    transient = (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT)
    good: list = []
    try:
        for m in msgs:
            err = m.error()
            if m.partition() not in (partition, None, -1):  # None, -1: an event of no partition
                continue  # left from an earlier read of a pooled consumer
            if err is not None:
                code = err.code()
                if code == KafkaError._PARTITION_EOF:
                    if m.offset() >= end:
                        return position, True
                    continue
                if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    raise DataLossError(*where, position, -1)
                if code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED):
                    raise NotAuthorizedError(
                        f"table {where[0]}: read of topic {where[1]} partition {where[2]} at offset {position}: "
                        f"not authorized ({err.name()}); nothing was committed"
                    )
                if err.fatal() or not (err.retriable() or code in transient):
                    raise KafkaException(err)
                # a broker blip: librdkafka reconnects and refetches on its own; the
                # no-progress deadline of read_range bounds how long we wait for it
                continue
            off = m.offset()
            if off < position:  # already taken (librdkafka drops outdated fetches: never seen)
                continue
            if off >= end:
                return position, True
            good.append(m)
            position = off + 1
            if off == end - 1:
                return position, True
        return position, False
    finally:
        chunk.extend(good)  # the records taken before a return or an error


def _current(msg, partition: int, position: int = -1) -> bool:
    """Whether ``msg`` (a record) is of ``partition`` at ``position`` or later: a pooled consumer's
    earlier read left nothing behind."""
    return msg.partition() == partition and msg.offset() >= position


def _take_records(msgs: list, end: int, position: int, chunk: Chunk) -> tuple[int, bool]:
    """:func:`_take` for error-free ``msgs`` (offsets increasing, gaps allowed): everything below
    ``end`` in one slice, found by bisection instead of a Python loop over every record."""
    import bisect

    last = msgs[-1].offset()
    if last < end - 1:
        chunk.extend(msgs)
        return last + 1, False
    cut = bisect.bisect_left(msgs, end, key=lambda m: m.offset())
    chunk.extend(msgs[:cut])
    return (msgs[cut - 1].offset() + 1 if cut else position), True


def make_task_reader(
    conf: Mapping[str, object],
    table: str,
    timeout_s: float,
    parser=None,
    stats=None,
    writer=None,
    written=None,
):
    """Build the ``mapInArrow`` function: input batches of (topic, partition, start, end)
    rows, output batches in :data:`~kafka_iceberg.kafka.records.RAW_SCHEMA_DDL`; with ``parser`` (a
    :class:`kafka_iceberg.formats.arrow_json.Parser`) each batch also carries ``j`` and ``_arrow``
    (:func:`kafka_iceberg.formats.arrow_json.j_ddl`), parsed in the task. With ``stats`` (a Spark
    accumulator of :class:`PieceStatsParam`) each range piece adds its :class:`PieceStats`.
    With ``writer`` (a :class:`kafka_iceberg.batch.files.FileWriter`; needs ``parser``) the
    records pyarrow claimed are written as data files in the task instead of being output, and
    the task adds ``{(partition, start) of its first piece: [DataFile, ...]}`` to ``written``
    (an accumulator of :class:`PieceStatsParam`). The driver reads through
    :mod:`kafka_iceberg.batch.driver_read` instead."""
    conf = dict(conf)

    def read_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        sink, first = (writer.sink() if writer is not None else None), None
        for batch in batches:
            for row in batch.to_pylist():
                first = first or (row["partition"], row["start"])
                tally = PieceStats(row["partition"])
                ranged = (row["topic"], row["partition"], row["start"], row["end"])
                for raw in read_range(conf, table, *ranged, timeout_s):
                    out = raw if parser is None else parser.parse_batch(raw)
                    tally.add(out)
                    out = out if sink is None else sink.take(out)
                    if out.num_rows:
                        yield out
                if stats is not None:
                    stats.add({(row["partition"], row["start"]): tally})
        if sink is not None and first is not None:
            written.add({first: sink.close()})

    return read_partition


class PieceStats:
    """What one read task saw of one range piece: records, the largest offset and record timestamp
    (ms since epoch; None without records), key + value bytes, and records pyarrow parsed as good
    (``_arrow``; 0 without a parser)."""

    def __init__(self, partition: int):
        self.partition, self.records, self.max_offset, self.max_timestamp_ms = partition, 0, -1, None
        self.bytes = self.arrow_good = 0

    def add(self, batch: pa.RecordBatch) -> None:
        import pyarrow.compute as pc

        if batch.num_rows == 0:
            return
        self.records += batch.num_rows
        self.max_offset = max(self.max_offset, pc.max(batch.column("offset")).as_py())
        ts = pc.max(batch.column("timestamp_ms")).as_py()
        if ts is not None:
            self.max_timestamp_ms = ts if self.max_timestamp_ms is None else max(self.max_timestamp_ms, ts)
        for name in ("key", "value"):
            self.bytes += pc.sum(pc.binary_length(batch.column(name))).as_py() or 0
        if "_arrow" in batch.schema.names:
            self.arrow_good += pc.sum(pc.cast(batch.column("_arrow"), pa.int64())).as_py() or 0


class PieceStatsParam(AccumulatorParam):
    """Accumulates ``{(partition, start offset): PieceStats}``; a piece reported twice (a retried
    task) replaces itself instead of counting twice."""

    def zero(self, value):
        return {}

    def addInPlace(self, value1, value2):  # noqa: N802 - PySpark's name
        value1.update(value2)
        return value1


def stats_accumulator(spark):
    """A new accumulator for :func:`make_task_reader`'s ``stats``."""
    return spark.sparkContext.accumulator({}, PieceStatsParam())
