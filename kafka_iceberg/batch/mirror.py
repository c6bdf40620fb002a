"""The consumer-group mirror of a run that commits many micro-batches, deferred and coalesced.

After each commit the table's committed offsets are mirrored into its consumer group, so standard lag
tools (kafka-consumer-groups, Burrow, kafka-lag-exporter) see them
(:func:`kafka_iceberg.batch.pipeline.mirror_group`). The table's snapshot is the source of truth; the
group is only a copy. A worker run (:mod:`kafka_iceberg.lake_assets.worker`) commits up to several
micro-batches a second over many tables, and an offset commit per micro-batch is a write to the group
coordinator each time (on the dev broker, a save of its whole state). So a worker run notes each
commit's offsets in a :class:`GroupMirror` and commits the latest ones of every group at most every
``GROUP_MIRROR_S`` seconds (lake_assets/worker.py), and all of them when it stops serving, as Kafka Connect commits its
offsets every ``offset.flush.interval.ms``. A run that dies before that leaves the group behind the
table until the table's next micro-batch mirrors it; nothing is read again because of it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from kafka_iceberg.errors import LakeError

log = logging.getLogger(__name__)

MIRROR_THREADS = 8
"""Groups one flush commits at once: each commit is a consumer's connection, coordinator lookup and
OffsetCommit (about 10 ms, :mod:`kafka_iceberg.kafka.groups`): a hundred groups took 0.7 s on the mock cluster
beside a soak on 2 cores."""


class GroupMirror:
    """The latest committed offsets per (consumer group, topic), committed to ``kafka``
    (:class:`~kafka_iceberg.kafka.admin.KafkaMetadata`) by :meth:`flush` at most every ``interval_s``
    seconds. :meth:`note` may be called from several threads at once; :meth:`flush` from one, which commits
    up to :data:`MIRROR_THREADS` groups at once in threads of its own, shut down before it returns."""

    def __init__(self, kafka, interval_s: float, clock: Callable[[], float] = time.monotonic):
        self.kafka, self.interval_s, self.clock = kafka, interval_s, clock
        self._pending: dict[tuple[str, str], tuple[str, dict[int, int]]] = {}  # (group, topic) -> (table, offsets)
        self._lock = threading.Lock()
        self._flushed = clock()

    def note(self, identifier: str, group: str | None, topic: str, offsets: Mapping[int, int]) -> None:
        """Table ``identifier`` committed ``offsets`` (partition -> next offset to read) of ``topic``; its
        consumer ``group`` (None: the table has no mirror) gets them at the next flush."""
        if group is None or not offsets:
            return
        with self._lock:
            self._pending[(group, topic)] = (identifier, dict(offsets))

    def flush(self, final: bool = False) -> dict[str, str]:
        """Commit the noted offsets of every group (the latest per group and topic) if ``interval_s`` has
        passed since the last flush, or if ``final``. Returns table identifier -> error text for each
        group the cluster refused or did not answer for (logged; never raised: the table is the source
        of truth, and its next micro-batch mirrors again)."""
        if not final and self.clock() - self._flushed < self.interval_s:
            return {}
        with self._lock:
            batch, self._pending = self._pending, {}
        self._flushed = self.clock()
        if not batch:
            return {}
        with ThreadPoolExecutor(min(MIRROR_THREADS, len(batch)), thread_name_prefix="lake-mirror") as pool:
            failed = pool.map(self._commit, batch.items())
            return {identifier: error for identifier, error in failed if error is not None}

    def _commit(self, item: tuple[tuple[str, str], tuple[str, dict[int, int]]]) -> tuple[str, str | None]:
        """(table identifier, the error text or None) of one group's commit; runs in a flush's thread."""
        (group, topic), (identifier, offsets) = item
        try:
            self.kafka.commit_group_offsets(group, topic, offsets)
        except LakeError as exc:
            log.warning("table %s: consumer group %s not updated: %s", identifier, group, exc)
            return identifier, str(exc)
        return identifier, None

    @property
    def pending(self) -> int:
        """Groups with offsets noted and not committed yet."""
        return len(self._pending)


__all__ = ["GroupMirror"]
