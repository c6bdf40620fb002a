"""Errors of the write path. Each one names the table, topic, partition and offsets involved."""

from __future__ import annotations

import re
import sys


class LakeError(Exception):
    """Base class of every error this project raises on purpose."""


class ConfigError(LakeError):
    """A setting or a table declaration is invalid (raised at load time, before any I/O)."""


class TopicNotFoundError(LakeError):
    """The table's source topic does not exist on the cluster."""


class BrokerUnavailableError(LakeError):
    """The Kafka cluster did not answer within the configured timeout."""


class NotAuthorizedError(LakeError):
    """The cluster refused this client an operation on a topic or consumer group (a Kafka ACL:
    ``TOPIC_AUTHORIZATION_FAILED``, ``GROUP_AUTHORIZATION_FAILED``, ``CLUSTER_AUTHORIZATION_FAILED``).
    Not retried: nothing is committed until the ACL is granted again."""


class CatalogUnavailableError(LakeError):
    """The Iceberg catalog (its JDBC database) could not be reached."""


class DataLossError(LakeError):
    """Records the table has not ingested were deleted from Kafka (retention or delete_records).

    Raised when a committed offset is below the partition's log start offset (low watermark),
    or when a read hits ``OFFSET_OUT_OF_RANGE``. Never skipped silently.
    """

    table = topic = partition = committed = log_start = None  # unset on an error re-raised from a Spark task

    def __init__(self, table: str, topic: str, partition: int, committed: int, log_start: int):
        self.table, self.topic, self.partition = table, topic, partition
        self.committed, self.log_start = committed, log_start
        if log_start >= 0:
            detail = (
                f"has log start offset {log_start} but the table has committed only up to offset {committed}; "
                f"{log_start - committed} offsets were deleted before they were ingested"
            )
        else:
            detail = f"no longer holds offset {committed}, which the table has not ingested yet"
        super().__init__(
            f"data loss on table {table}: topic {topic} partition {partition} {detail} "
            "(retention.ms or delete_records removed them); see docs/operations.md#data-loss"
        )


class OffsetsAheadError(LakeError):
    """A committed offset is above the partition's high watermark: the topic was recreated or truncated."""


class MalformedRecordError(LakeError):
    """A record could not be parsed into the table's declared schema.

    Carries the record's coordinates so it can be inspected with any Kafka tool.
    """

    def __init__(self, table: str, topic: str, partition: int, offset: int, reason: str):
        self.table, self.topic, self.partition, self.offset, self.reason = table, topic, partition, offset, reason
        super().__init__(
            f"malformed record for table {table}: topic {topic} partition {partition} offset {offset}: {reason}; "
            "nothing was committed"
        )


class CommitConflictError(LakeError):
    """The table's committed offsets changed after this micro-batch was planned.

    The batch's data files were written to a private branch and are never published;
    the run fails so that the next run re-plans from the new base.
    """


class ReadTimeoutError(LakeError):
    """A Spark task could not read its planned offset range within ``read_timeout_s`` (120 s; ``LAKE_DEV_HOOKS``)."""


_REMOTE = re.compile(r"kafka_iceberg\.errors\.(\w+): ([^\n]+)")


def from_task_exception(exc: BaseException) -> LakeError | None:
    """The project error a Spark task raised, recovered from the driver-side exception text
    (Spark wraps Python worker errors in a ``PythonException``/``Py4JJavaError``), or ``None``.

    The returned error has the task's message; structured attributes are not carried over.
    """
    m = _REMOTE.search(str(exc))
    cls = getattr(sys.modules[__name__], m.group(1), None) if m else None
    if not (isinstance(cls, type) and issubclass(cls, LakeError)):
        return None
    err = cls.__new__(cls)
    Exception.__init__(err, m.group(2).strip())
    return err
