"""The consumers that read offset ranges (:func:`kafka_iceberg.kafka.reader.read_range`), and the pool a
long-lived process keeps them in between micro-batches.

A consumer is made for one table (``group.id=lake-reader.<identifier>``, never joined or committed) and
reads one range at a time: ``assign`` at the range's start, consume to its end, ``unassign``. A new
consumer per range costs a connection, a metadata request and a coordinator lookup (about 9 ms of wall
and 3 ms of CPU per two-partition micro-batch against the dev broker, measured beside a reused one at
0.5 ms); a worker run serving a hundred tables starts ten to twenty micro-batches a second, so it keeps
its consumers in a :class:`ConsumerPool` owned by its :class:`~kafka_iceberg.kafka.admin.KafkaMetadata`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping

MAX_IDLE = 128
"""Idle consumers one pool keeps (about 4 librdkafka threads, one connection per broker and 0.1 ms of CPU a
second each, measured idle); past it the least recently returned is closed, so a process serving more
tables than this reads with a new consumer per range, as Spark tasks always do."""


def new_consumer(conf: Mapping[str, object], table: str):
    """A librdkafka consumer of ``table``'s ranges with ``conf`` (bootstrap servers, security,
    ``KAFKA_CLIENT_CONFIG``) under the settings exactly-once reading depends on, which ``conf`` cannot
    override. Raises ``KafkaException`` on an invalid configuration."""
    from confluent_kafka import Consumer

    return Consumer(
        {
            # tunable through KAFKA_CLIENT_CONFIG
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
            # a broker that ignores the fetch limits (the dev broker does) can answer with more
            # than librdkafka's 100 MB default response size
            "receive.message.max.bytes": 512 * 1024 * 1024,
            # a pooled consumer's idle connection closed by the broker (connections.max.idle.ms) is normal
            "log.connection.close": False,
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


class ConsumerPool:
    """Idle consumers of one cluster, per table, for the reads of one process (a worker run's driver).

    :meth:`take` hands out an idle consumer of the table (or a new one) for one range; :meth:`give_back`
    unassigns it (its fetches stop) and keeps it, up to :data:`MAX_IDLE` in all. A reader that failed
    closes its consumer instead. Thread-safe: every structure is changed under one lock, and a consumer
    is used by one reader at a time. :meth:`close` closes the idle ones; consumers given back later are
    closed too."""

    def __init__(self, conf: Mapping[str, object], max_idle: int = MAX_IDLE):
        self._conf, self._max_idle = dict(conf), max_idle
        self._idle: OrderedDict[str, list] = OrderedDict()  # table -> idle consumers, least recent first
        self._lock = threading.Lock()
        self._closed = False

    def take(self, table: str):
        """An idle consumer of ``table``, else a new one (:func:`new_consumer`), unassigned."""
        with self._lock:
            idle = self._idle.get(table)
            if idle:
                consumer = idle.pop()
                if not idle:
                    del self._idle[table]
                return consumer
        return new_consumer(self._conf, table)

    def give_back(self, table: str, consumer) -> None:
        """Unassign ``consumer`` (a reader of ``table`` that read its range to the end) and keep it; closed
        instead when the pool is closed or the unassign fails (the range was read: never an error of the read),
        and the least recently returned is closed past :data:`MAX_IDLE`."""
        from confluent_kafka import KafkaException

        try:
            consumer.unassign()
        except KafkaException:
            consumer.close()
            return
        evicted = []
        with self._lock:
            if self._closed:
                evicted.append(consumer)
            else:
                self._idle.setdefault(table, []).append(consumer)
                self._idle.move_to_end(table)
                while self.idle_count_locked() > self._max_idle:
                    oldest, consumers = next(iter(self._idle.items()))
                    evicted.append(consumers.pop(0))
                    if not consumers:
                        del self._idle[oldest]
        for c in evicted:
            c.close()

    def idle_count_locked(self) -> int:
        """Idle consumers now (call with the lock held, or for a figure that may be stale)."""
        return sum(map(len, self._idle.values()))

    def close(self) -> None:
        """Close every idle consumer; later :meth:`give_back` calls close theirs. Idempotent."""
        with self._lock:
            self._closed = True
            idle = [c for consumers in self._idle.values() for c in consumers]
            self._idle.clear()
        for c in idle:
            c.close()


__all__ = ["MAX_IDLE", "ConsumerPool", "new_consumer"]
