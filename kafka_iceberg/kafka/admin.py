"""Kafka cluster metadata through confluent-kafka's AdminClient.

Watermarks and timestamp lookups go through the admin API (``list_offsets``, ``describe_topics``);
consumer-group offsets through a consumer of the group (:mod:`kafka_iceberg.kafka.groups`). High watermarks
are read with ``read_committed`` isolation, so "high" is the last stable offset: records
of open transactions are never planned.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay, wait_fixed

from kafka_iceberg.batch.planning import Watermarks
from kafka_iceberg.config.models import RuntimeSettings
from kafka_iceberg.errors import BrokerUnavailableError, TopicNotFoundError
from kafka_iceberg.kafka.acl import not_authorized
from kafka_iceberg.kafka.consumers import ConsumerPool
from kafka_iceberg.kafka.groups import commit_offsets, committed_offsets

log = logging.getLogger(__name__)

LEADER_MOVED = (
    KafkaError.NOT_LEADER_FOR_PARTITION,  # NOT_LEADER_OR_FOLLOWER
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError._NOENT,  # librdkafka: "Failed to query partition leaders: No leaders found" (none elected yet)
)
"""ListOffsets errors that mean "the partition's leader is moving, ask its new leader": sent again."""


PARTITIONS_MAX_AGE_S = 30.0
"""Seconds :meth:`KafkaMetadata.watermarks_many` trusts its list of every topic's partitions before it lists
them again (a worker polls four times a second, and the answer names every topic of the cluster). So a
partition added to a topic is read at most this late. A topic not in the list is described at each poll
(it may just have been created), and a listed topic that is gone makes the next call list them at once."""


def _leader_moved(exc: BaseException) -> KafkaError | None:
    """The Kafka error of a :class:`BrokerUnavailableError` raised because a partition's leader moved, else None."""
    if not isinstance(exc, BrokerUnavailableError) or not isinstance(exc.__cause__, KafkaException):
        return None
    err = exc.__cause__.args[0] if exc.__cause__.args else None
    return err if isinstance(err, KafkaError) and err.code() in LEADER_MOVED else None


def _moved(state: RetryCallState) -> KafkaError:
    """The leader-moved error of the attempt that just failed."""
    return _leader_moved(state.outcome.exception())


@dataclass(frozen=True)
class KafkaConfig:
    """How to reach the cluster: bootstrap servers plus any librdkafka client properties
    (security.protocol, sasl.*, ssl.*), and the admin request timeout in seconds."""

    bootstrap_servers: str
    client_config: Mapping[str, str]
    timeout_s: float = RuntimeSettings.model_fields["kafka_timeout_s"].default  # LAKE_KAFKA_TIMEOUT_S

    @classmethod
    def from_settings(cls, settings) -> KafkaConfig:
        """The cluster of :class:`kafka_iceberg.config.settings.Settings` (``KAFKA_BOOTSTRAP_SERVERS``,
        ``KAFKA_CLIENT_CONFIG``, ``LAKE_KAFKA_TIMEOUT_S``)."""
        return cls(settings.kafka_bootstrap_servers, settings.kafka_client_config, settings.kafka_timeout_s)

    def client_conf(self, **extra: object) -> dict[str, object]:
        """A librdkafka configuration dict for a client of this cluster."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.client_config, **extra}


class KafkaMetadata:
    """Read-only cluster metadata plus consumer-group offset commits, for one cluster.

    All methods raise :class:`BrokerUnavailableError` when the cluster does not answer within
    ``config.timeout_s`` seconds, and :class:`TopicNotFoundError` for a missing topic. With
    ``reader_pool``, ``readers`` is the :class:`~kafka_iceberg.kafka.consumers.ConsumerPool` the driver's
    range reads keep their consumers in (a long-lived process: a worker run), closed by :meth:`close`;
    else None (a consumer per range).
    """

    def __init__(self, config: KafkaConfig, reader_pool: bool = False):
        self.config = config
        self.admin = AdminClient(config.client_conf())
        self.readers = ConsumerPool(config.client_conf()) if reader_pool else None
        self._listed: dict[str, list[int]] = {}  # topic -> partitions, from the last metadata answer
        self._listed_at = -float("inf")  # time.monotonic() of that answer
        self._list_lock = threading.Lock()

    def close(self) -> None:
        """Close the pooled consumers (``readers``), if any; the admin client needs no closing. Idempotent."""
        if self.readers is not None:
            self.readers.close()

    def _wait(self, futures: Mapping, what: str) -> dict:
        out = {}
        for key, fut in futures.items():
            try:
                out[key] = fut.result(timeout=self.config.timeout_s)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() in (
                    KafkaError.UNKNOWN_TOPIC_OR_PART,
                    KafkaError._UNKNOWN_TOPIC,
                    KafkaError._UNKNOWN_PARTITION,
                ):
                    raise TopicNotFoundError(
                        f"{what}: topic does not exist on {self.config.bootstrap_servers}: {err}"
                    ) from exc
                refused = not_authorized(what, err)
                if refused is not None:
                    raise refused from exc
                raise BrokerUnavailableError(f"{what} failed against {self.config.bootstrap_servers}: {exc}") from exc
            except TimeoutError as exc:  # concurrent.futures.TimeoutError is TimeoutError on 3.11
                raise BrokerUnavailableError(
                    f"{what}: no answer from {self.config.bootstrap_servers} within {self.config.timeout_s:.0f} s"
                ) from exc
        return out

    def partitions(self, topic: str) -> list[int]:
        """Partition ids of ``topic``, sorted.

        Raises:
            TopicNotFoundError: the topic does not exist (it is never auto-created here).
        """
        return self._partition_ids([topic], missing_ok=False)[topic]

    def list_topics(self, timeout_s: float | None = None) -> list[str]:
        """Names of every topic on the cluster (internal ones included), sorted; one metadata request
        answered within ``timeout_s`` seconds (default ``config.timeout_s``).

        Raises:
            BrokerUnavailableError: no answer in time, or the request failed.
        """
        timeout = self.config.timeout_s if timeout_s is None else timeout_s
        try:
            metadata = self.admin.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise BrokerUnavailableError(
                f"list topics: no answer from {self.config.bootstrap_servers} within {timeout:.0f} s: {exc}"
            ) from exc
        return sorted(metadata.topics)

    def _list_offsets(self, topic: str, partitions: list[int], spec_of) -> dict[int, int]:
        """ListOffsets of ``partitions``, sent again (tenacity, every 0.2 s after a metadata refresh)
        while a partition's leader is moving (a leader election, a broker replaced or restarted:
        ``NOT_LEADER_OR_FOLLOWER`` and its kin), for at most ``config.timeout_s`` seconds; then the
        last :class:`BrokerUnavailableError`."""
        if not partitions:
            return {}
        request = {TopicPartition(topic, p): spec_of(p) for p in partitions}

        def once() -> dict[int, int]:
            futures = self.admin.list_offsets(
                request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=self.config.timeout_s
            )
            done = self._wait(futures, f"list offsets of {topic}")
            return {tp.partition: info.offset for tp, info in done.items()}

        def again(state: RetryCallState) -> None:
            log.info("list offsets of %s: a partition leader moved (%s); asking again", topic, _moved(state).name())
            self._refresh_metadata(topic)

        return Retrying(
            retry=retry_if_exception(lambda exc: _leader_moved(exc) is not None),
            stop=stop_after_delay(self.config.timeout_s),
            wait=wait_fixed(0.2),
            before_sleep=again,
            reraise=True,
        )(once)

    def _refresh_metadata(self, topic: str) -> None:
        """Ask the cluster for ``topic``'s partition leaders now (librdkafka's admin client can
        otherwise keep answering from a cache that names no leader, for seconds)."""
        try:
            self.admin.list_topics(topic, timeout=min(5.0, self.config.timeout_s))
        except KafkaException as exc:  # the next request reports what is wrong
            log.debug("metadata refresh of %s failed: %s", topic, exc)

    def watermarks(self, topic: str, partitions: list[int] | None = None) -> dict[int, Watermarks]:
        """Low watermark (log start offset) and high watermark (last stable offset) per partition."""
        partitions = self.partitions(topic) if partitions is None else partitions
        low = self._list_offsets(topic, partitions, lambda p: OffsetSpec.earliest())
        high = self._list_offsets(topic, partitions, lambda p: OffsetSpec.latest())
        return {p: Watermarks(low[p], high[p]) for p in partitions}

    def watermarks_many(self, topics: list[str]) -> dict[str, dict[int, Watermarks] | None]:
        """Watermarks of every partition of every topic in ``topics`` (records by offset): two ListOffsets
        requests for all of them, after a metadata request at most every :data:`PARTITIONS_MAX_AGE_S`
        seconds. A topic that does not exist maps to ``None``, so one missing topic does not hide the others.

        Raises:
            BrokerUnavailableError: the cluster did not answer within ``config.timeout_s`` seconds.
        """
        found = self._partition_lists(topics, fresh=False)
        try:
            offsets = self._all_offsets(found)
        except (TopicNotFoundError, BrokerUnavailableError) as exc:
            if not isinstance(exc, TopicNotFoundError) and _leader_moved(exc) is None:
                raise
            # a listed topic was deleted, or a leader moved: list again (which also refreshes librdkafka's
            # leaders), once
            found = self._partition_lists(topics, fresh=True)
            offsets = self._all_offsets(found)
        return {
            t: {p: Watermarks(offsets["low"][(t, p)], offsets["high"][(t, p)]) for p in found[t]}
            if t in found
            else None
            for t in topics
        }

    def _partition_lists(self, topics: list[str], fresh: bool) -> dict[str, list[int]]:
        """Sorted partition ids of the ``topics`` that exist: every topic's listed from the cluster when
        ``fresh`` or when the last list is older than :data:`PARTITIONS_MAX_AGE_S`, else from that list,
        with the topics it lacks described (DescribeTopics never creates a topic, where a producer-type
        client's metadata request for one may). Raises BrokerUnavailableError."""
        with self._list_lock:
            if fresh or time.monotonic() - self._listed_at > PARTITIONS_MAX_AGE_S:
                try:
                    listed = self.admin.list_topics(timeout=self.config.timeout_s).topics
                except KafkaException as exc:
                    raise BrokerUnavailableError(f"list topics on {self.config.bootstrap_servers}: {exc}") from exc
                self._listed = {t: sorted(m.partitions) for t, m in listed.items() if m.error is None}
                self._listed_at = time.monotonic()
            else:
                self._listed.update(self._partition_ids([t for t in topics if t not in self._listed], missing_ok=True))
            return {t: self._listed[t] for t in topics if t in self._listed}

    def _partition_ids(self, topics: list[str], missing_ok: bool) -> dict[str, list[int]]:
        """Sorted partition ids of ``topics`` (one DescribeTopics request, which never creates a topic); with
        ``missing_ok`` a topic that does not exist is left out, else it raises TopicNotFoundError. Raises
        BrokerUnavailableError."""
        if not topics:
            return {}
        try:
            futures = self.admin.describe_topics(TopicCollection(topics), request_timeout=self.config.timeout_s)
        except KafkaException as exc:
            raise BrokerUnavailableError(f"describe topic {', '.join(topics)}: {exc}") from exc
        out = {}
        for topic, future in futures.items():
            try:
                desc = self._wait({topic: future}, f"describe topic {topic}")[topic]
            except TopicNotFoundError:
                if missing_ok:
                    continue
                raise
            out[topic] = sorted(p.id for p in desc.partitions)
        return out

    def _all_offsets(self, found: Mapping[str, list[int]]) -> dict[str, dict[tuple, int]]:
        """{"low": ..., "high": ...}, each (topic, partition) -> offset, for every partition in ``found``.
        Raises TopicNotFoundError (a topic is gone) or BrokerUnavailableError."""
        tps = [TopicPartition(t, p) for t, parts in found.items() for p in parts]
        offsets: dict[str, dict[tuple, int]] = {"low": {}, "high": {}}
        for name, spec in (("low", OffsetSpec.earliest()), ("high", OffsetSpec.latest())):
            if not tps:
                break
            futures = self.admin.list_offsets(
                dict.fromkeys(tps, spec),
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=self.config.timeout_s,
            )
            done = self._wait(futures, f"list offsets of {len(found)} topics")
            offsets[name] = {(tp.topic, tp.partition): info.offset for tp, info in done.items()}
        return offsets

    def offsets_for_timestamp(self, topic: str, partitions: list[int], timestamp_ms: int) -> dict[int, int]:
        """Per partition, the earliest offset whose record timestamp is >= ``timestamp_ms``.

        Partitions with no such record map to their high watermark.
        """
        found = self._list_offsets(topic, partitions, lambda p: OffsetSpec.for_timestamp(timestamp_ms))
        missing = [p for p, o in found.items() if o < 0]
        if missing:
            high = self._list_offsets(topic, missing, lambda p: OffsetSpec.latest())
            found.update(high)
        return found

    def commit_group_offsets(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        """Set consumer group ``group``'s committed offsets on ``topic`` to ``offsets``
        (:func:`kafka_iceberg.kafka.groups.commit_offsets`, not the admin API).

        Mirrors the table's committed offsets so standard lag tools (kafka-consumer-groups,
        Burrow, kafka-lag-exporter) see them. The table stays the source of truth.

        Raises:
            BrokerUnavailableError: the broker refused or did not answer (for example because
                the group has active members, which the broker does not allow).
            NotAuthorizedError: the group's ACL does not allow it.
        """
        commit_offsets(self.config, group, topic, offsets)

    def group_offsets(self, group: str, topic: str, partitions: list[int] | None = None) -> dict[int, int]:
        """Consumer group ``group``'s committed offsets on ``topic`` (partitions without one are absent;
        :func:`kafka_iceberg.kafka.groups.committed_offsets`, not the admin API).

        Asks for ``topic``'s partitions by name (default: all of them, one metadata request), not
        for "every partition of the group": brokers that do not implement the all-partitions form
        (librdkafka's mock cluster) would otherwise answer with no offsets at all.
        """
        partitions = self.partitions(topic) if partitions is None else partitions
        return committed_offsets(self.config, group, topic, partitions)

    def retention_ms(self, topic: str) -> int:
        """The topic's ``retention.ms`` (ms; ``-1`` means records never expire by time).

        Raises:
            TopicNotFoundError, BrokerUnavailableError.
        """
        resource = ConfigResource("topic", topic)
        try:
            futures = self.admin.describe_configs([resource], request_timeout=self.config.timeout_s)
        except KafkaException as exc:
            raise BrokerUnavailableError(f"describe configs of {topic}: {exc}") from exc
        configs = self._wait(futures, f"describe configs of {topic}")[resource]
        entry = configs.get("retention.ms")
        return int(entry.value) if entry is not None and entry.value is not None else -1

    def record_timestamps(self, topic: str, offsets: Mapping[int, int], timeout_s: float = 10.0) -> dict[int, int]:
        """Timestamp (ms since epoch) of the first record at or after each ``offsets[partition]``.

        Partitions with no such record (or none within ``timeout_s`` seconds) are absent. Reads
        one fetch per partition with a throwaway assign-only consumer; never commits.
        """
        if not offsets:
            return {}
        consumer = Consumer(
            self.config.client_conf(
                **{
                    "group.id": "lake-inspector",
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "auto.offset.reset": "earliest",
                    "isolation.level": "read_committed",
                }
            )
        )
        found: dict[int, int] = {}
        try:
            consumer.assign([TopicPartition(topic, p, o) for p, o in offsets.items()])
            pending = set(offsets)
            deadline = time.monotonic() + timeout_s
            while pending and time.monotonic() < deadline:
                for m in consumer.consume(num_messages=len(pending), timeout=1.0):
                    p = m.partition()
                    if p not in pending:
                        continue
                    if m.error() is None:
                        found[p] = m.timestamp()[1]
                        pending.discard(p)
                        consumer.pause([TopicPartition(topic, p)])
                    elif m.error().code() == KafkaError._PARTITION_EOF:
                        pending.discard(p)
        finally:
            consumer.close()
        return found
