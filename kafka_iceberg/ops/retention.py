"""Retention headroom: how long until Kafka deletes records the table has not ingested. Pure.

Per partition, from the log start offset (low watermark), the table's committed offset, the
high watermark, the topic's ``retention.ms`` and the timestamp of the oldest record not yet
in the table:

* **headroom** (seconds) = that timestamp + ``retention.ms`` - now: time left before the broker
  may delete the oldest unread record. ``None`` (unbounded) when there is no lag or
  ``retention.ms`` is ``-1``. Time-based retention works on record timestamps, which is why
  the record's own timestamp is the right clock here.
* **ratio** = (high - committed) / (high - low): the share of the retained log the table has
  not read yet; near 1, retention by size or time is about to overtake the table. It is judged
  only when ``retention.ms`` is bounded: with ``retention.ms=-1`` nothing is deleted by time,
  so a large unread share is lag (the lag sensor's business), not a retention risk.

Status per partition: ``DATA_LOSS`` when the committed offset is below the log start offset
(records were deleted before they were ingested; the table's next run fails with
``DataLossError``); ``ERROR`` or ``WARN`` when headroom falls to the table's thresholds or the
ratio rises to them; otherwise ``OK``. The table's status is its worst partition's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kafka_iceberg.batch.planning import Watermarks

RETENTION_STATUSES = ("OK", "WARN", "ERROR", "DATA_LOSS")


@dataclass(frozen=True)
class RetentionPolicy:
    """Thresholds: headroom in seconds (at or below: WARN/ERROR), ratio in [0, 1] (at or above).
    Built from a table's ``retention:`` section by :func:`kafka_iceberg.declaration.spec.retention_policy`
    (the defaults are :class:`kafka_iceberg.declaration.models.RetentionDecl`'s)."""

    warn_headroom_s: float
    error_headroom_s: float
    warn_ratio: float
    error_ratio: float


@dataclass(frozen=True)
class PartitionRetention:
    """Retention figures of one partition (offsets, ms since epoch, seconds)."""

    partition: int
    low: int
    committed: int
    high: int
    oldest_unread_ms: int | None
    headroom_s: float | None
    ratio: float
    status: str


def evaluate_partition(
    partition: int,
    wm: Watermarks,
    committed: int,
    retention_ms: int,
    oldest_unread_ms: int | None,
    now_ms: int,
    policy: RetentionPolicy,
) -> PartitionRetention:
    """Figures and status of one partition (see the module docstring)."""
    lag = max(0, wm.high - committed)
    span = wm.high - wm.low
    ratio = round(lag / span, 4) if span > 0 else 0.0
    headroom, bounded = None, retention_ms >= 0
    if lag > 0 and bounded and oldest_unread_ms is not None:
        headroom = round((oldest_unread_ms + retention_ms - now_ms) / 1000, 1)
    if committed < wm.low:
        status = "DATA_LOSS"
    elif (headroom is not None and headroom <= policy.error_headroom_s) or (bounded and ratio >= policy.error_ratio):
        status = "ERROR"
    elif (headroom is not None and headroom <= policy.warn_headroom_s) or (bounded and ratio >= policy.warn_ratio):
        status = "WARN"
    else:
        status = "OK"
    return PartitionRetention(partition, wm.low, committed, wm.high, oldest_unread_ms, headroom, ratio, status)


def evaluate(
    watermarks: Mapping[int, Watermarks],
    committed: Mapping[int, int],
    retention_ms: int,
    oldest_unread_ms: Mapping[int, int],
    now_ms: int,
    policy: RetentionPolicy,
) -> tuple[str, list[PartitionRetention]]:
    """The table's worst status and every partition's figures. Partitions the table has not
    committed count from their log start offset."""
    parts = [
        evaluate_partition(p, wm, committed.get(p, wm.low), retention_ms, oldest_unread_ms.get(p), now_ms, policy)
        for p, wm in sorted(watermarks.items())
    ]
    worst = max((x.status for x in parts), key=RETENTION_STATUSES.index, default="OK")
    return worst, parts
