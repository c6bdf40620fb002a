"""A consumer group's committed offsets, read and set through a consumer of that group that never joins
it (OffsetFetch and OffsetCommit to the group's coordinator): the mirror of a table's offsets that lag
tools read (:func:`kafka_iceberg.batch.publish.mirror_group`).

Not through AdminClient's ``alter_consumer_group_offsets`` / ``list_consumer_group_offsets``: the
librdkafka of the confluent-kafka wheel (2.x) aborts the whole process (``rd_kafka_enq_once_del_source_return:
Assertion `eonce->refcnt > 0' failed``) when such an admin request, waiting for the group's coordinator,
times out while brokers come and go. The ``leader_moves`` rehearsal hit it after mirror timeouts. The
consumer's commit path has no such wait.
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kafka_iceberg.errors import BrokerUnavailableError
from kafka_iceberg.kafka.acl import not_authorized


def _consumer(config, group: str) -> Consumer:
    """A consumer of ``group`` on ``config``'s cluster (a ``KafkaConfig``) that commits only when asked. Its
    requests, and a commit's wait for the group's coordinator (``session.timeout.ms``), are bounded by
    ``config.timeout_s``, so a commit is answered within it and closing never waits for one in flight."""
    ms = max(1000, int(config.timeout_s * 1000))
    conf = {"group.id": group, "enable.auto.commit": False, "enable.auto.offset.store": False}
    conf.update({"socket.timeout.ms": ms, "session.timeout.ms": ms, "heartbeat.interval.ms": max(100, ms // 3)})
    return Consumer(config.client_conf(**conf))


def _refused(what: str, err: object) -> Exception:
    """The error to raise for librdkafka's ``err``: a ``NotAuthorizedError`` (an ACL refusal) or
    :class:`BrokerUnavailableError`."""
    return not_authorized(what, err) or BrokerUnavailableError(f"{what}: {err}")


def _failed(config, what: str, exc: KafkaException) -> Exception:
    """The error to raise for a commit or a fetch that raised ``exc``: no answer within ``config.timeout_s``
    (no coordinator found, or the request timed out), an ACL refusal, or another refusal."""
    err = exc.args[0] if exc.args else exc
    if isinstance(err, KafkaError) and err.code() in (KafkaError._WAIT_COORD, KafkaError._TIMED_OUT):
        return BrokerUnavailableError(
            f"{what}: no answer from the group's coordinator on {config.bootstrap_servers} within {config.timeout_s:.0f} s"
        )
    return _refused(what, err)


def commit_offsets(config, group: str, topic: str, offsets: Mapping[int, int]) -> None:
    """Set ``group``'s committed offsets on ``topic`` to ``offsets`` (partition -> offset), waiting at most
    ``config.timeout_s`` seconds for the coordinator's answer (about 8 ms on librdkafka's mock cluster,
    against 0.4 ms through the admin API: a consumer's connection and coordinator lookup each time).

    Raises:
        BrokerUnavailableError: no answer in time, or the broker refused (for example because the group
            has active members, whose generation this commit does not carry).
        NotAuthorizedError: the group's or the topic's ACL does not allow it.
    """
    what = f"commit offsets of group {group} on topic {topic}"
    consumer = _consumer(config, group)
    try:
        parts = consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in sorted(offsets.items())], asynchronous=False
        )
    except KafkaException as exc:
        raise _failed(config, what, exc) from exc
    finally:
        consumer.close()
    for tp in parts or []:  # a refused partition is not a failed commit
        if tp.error is not None:
            raise _refused(f"{what}: partition {tp.partition}", tp.error)


def committed_offsets(config, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
    """``group``'s committed offsets on ``topic``'s ``partitions`` (those without one are absent), within
    ``config.timeout_s`` seconds. Raises :class:`BrokerUnavailableError` or
    ``NotAuthorizedError``, as :func:`commit_offsets`."""
    what = f"list offsets of group {group}"
    consumer = _consumer(config, group)
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=config.timeout_s)
    except KafkaException as exc:
        raise _failed(config, what, exc) from exc
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found if tp.error is None and tp.offset >= 0}


__all__ = ["commit_offsets", "committed_offsets"]
