"""Kafka's ACL refusals as :class:`~kafka_iceberg.errors.NotAuthorizedError`: what the admin API
(:mod:`kafka_iceberg.kafka.admin`) and the consumer-group commits (:mod:`kafka_iceberg.kafka.groups`) raise
when the client's principal lacks an ACL."""

from __future__ import annotations

from confluent_kafka import KafkaError

from kafka_iceberg.errors import NotAuthorizedError

NOT_AUTHORIZED = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "consumer group",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
}
"""Kafka error codes of a refused ACL -> what the ACL is on (raised as :class:`NotAuthorizedError`)."""


def not_authorized(what: str, err: object) -> NotAuthorizedError | None:
    """The :class:`NotAuthorizedError` of a librdkafka ``KafkaError`` that is an ACL refusal, else None.
    ``what`` names the operation and the topic or group, e.g. ``list offsets of topic orders``."""
    if not isinstance(err, KafkaError) or err.code() not in NOT_AUTHORIZED:
        return None
    return NotAuthorizedError(
        f"{what}: not authorized ({err.name()}): the client's principal lacks the {NOT_AUTHORIZED[err.code()]} "
        "ACL; nothing was committed; grant it and the next micro-batch continues"
    )


__all__ = ["NOT_AUTHORIZED", "not_authorized"]
