"""The driver's read of a pyarrow-parsed micro-batch (:func:`kafka_iceberg.batch.read.read_by_driver`): no
Spark job; the records are consumed, parsed and written as data files in the driver process.

Consuming is bound by Python's GIL (librdkafka makes one Python ``Message`` per record, and the reader takes
five fields of each); pyarrow's JSON parser and the Parquet writer release it. So one thread consumes the
plan's ranges, every partition at once with one consumer (:func:`~kafka_iceberg.kafka.reader.read_ranges`),
and hands each chunk of about 50,000 records of one partition to a pool that parses and writes while the
next chunk is consumed. A micro-batch of 1,000,000 flights records took 4.6-5.1 s on d0673ab, 6.0 s on
bb49983 reading the partitions one after another (docs/architecture.md).
A micro-batch of one read task (:meth:`~kafka_iceberg.batch.planning.BatchPlan.one_read_task`) runs in the
calling thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from kafka_iceberg.batch.files import FileWriter, Sink, discard
from kafka_iceberg.kafka.consumers import ConsumerPool
from kafka_iceberg.kafka.reader import PieceStats, read_ranges

IN_FLIGHT_PER_THREAD = 2
"""Consumed chunks waiting for or in a parse thread, per thread: bounds the read's memory to about
``(threads * 2 + 1) * 50,000`` raw records ahead of the parsers."""


@dataclass(frozen=True)
class DriverRead:
    """What the driver read: one :class:`~kafka_iceberg.kafka.reader.PieceStats` per consumed chunk
    (records, largest offset and record timestamp in ms since epoch, key + value bytes), the data files
    written (pyiceberg ``DataFile`` s) and the records pyarrow did not claim (``leftovers``)."""

    stats: tuple
    files: tuple
    leftovers: int


@dataclass(frozen=True)
class Source:
    """Where the ranges come from: librdkafka consumer ``conf``, the reading ``table`` (its consumer
    group name), the no-progress timeout in seconds and the driver's consumer pool (or None)."""

    conf: dict
    table: str
    timeout_s: float
    consumers: ConsumerPool | None = None


def read_and_write(source: Source, ranges: Sequence[tuple], parser, writer: FileWriter, threads: int) -> DriverRead:
    """Consume ``ranges`` ((topic, partition, start, end), at most one per topic partition), parse each chunk with ``parser``
    (:class:`kafka_iceberg.formats.arrow_json.Parser`) and write the records it claims through ``writer``;
    with ``threads`` > 1 a pool of that many threads parses and writes while this thread consumes.

    Raises what :func:`~kafka_iceberg.kafka.reader.read_ranges`, the parser or the writer raise, after
    deleting the data files already written (best effort, :func:`~kafka_iceberg.batch.files.discard`).
    """
    sinks: queue.SimpleQueue = queue.SimpleQueue()
    made = [writer.sink() for _ in range(max(1, threads))]
    for sink in made:
        sinks.put(sink)
    try:
        if threads <= 1:
            results = [_parse_and_keep(raw, parser, sinks) for raw in _chunks(source, ranges)]
            files = tuple(made[0].close())
        else:
            results, files = _pipelined(source, ranges, parser, sinks, made)
    except BaseException:
        discard(writer.io(), [f for sink in made for f in sink.files])
        raise
    return DriverRead(tuple(s for s, _ in results), files, sum(left for _, left in results))


def _chunks(source: Source, ranges: Sequence[tuple]):
    """The raw chunks of every range, one partition each (:func:`~kafka_iceberg.kafka.reader.read_ranges`)."""
    return read_ranges(source.conf, source.table, ranges, source.timeout_s, source.consumers)


def _pipelined(source: Source, ranges: Sequence[tuple], parser, sinks: queue.SimpleQueue, made: list) -> tuple:
    """:func:`read_and_write` with a parse pool of one thread per sink in ``made``: this thread consumes, at
    most :data:`IN_FLIGHT_PER_THREAD` chunks per thread ahead of the pool; the pool then writes what the
    sinks hold, in parallel. Returns (chunk results, data files)."""
    threads = len(made)
    slots = threading.BoundedSemaphore(threads * IN_FLIGHT_PER_THREAD)
    failed = threading.Event()
    futures: list[Future] = []

    def task(raw):
        try:
            return _parse_and_keep(raw, parser, sinks)
        except BaseException:
            failed.set()
            raise
        finally:
            slots.release()

    with ThreadPoolExecutor(threads, thread_name_prefix="driver-parse") as pool:
        try:
            for raw in _chunks(source, ranges):
                slots.acquire()
                futures.append(pool.submit(task, raw))
                if failed.is_set():
                    break  # a parse or write failed: stop consuming; result() below raises it
            results = [f.result() for f in futures]
            return results, tuple(f for files in pool.map(Sink.close, made) for f in files)
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def _parse_and_keep(raw, parser, sinks: queue.SimpleQueue) -> tuple[PieceStats, int]:
    """Parse one raw chunk, keep what pyarrow claimed in a free sink (writing a data file once it holds
    :data:`~kafka_iceberg.batch.files.FLUSH_ROWS` rows); returns the chunk's statistics and how many of its
    records pyarrow did not claim."""
    parsed = parser.parse_batch(raw)
    stats = PieceStats(raw.column("partition")[0].as_py() if raw.num_rows else -1)
    stats.add(parsed)
    sink: Sink = sinks.get()
    try:
        rest = sink.take(parsed)
    finally:
        sinks.put(sink)
    return stats, rest.num_rows
