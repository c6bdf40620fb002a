"""The policies of a table declaration: the ``freshness:``, ``lag:``, ``maintenance:``, ``retention:`` and
``bad_records:`` sections as the frozen dataclasses the rest of the code reads (durations in seconds).

Each is built from its validated pydantic model (:mod:`kafka_iceberg.declaration.models`), the one place
their defaults are written: the dataclasses have none of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka_iceberg.declaration.models import (
    IDENTIFIER,
    BadRecordsDecl,
    FreshnessDecl,
    LagDecl,
    MaintenanceDecl,
    RetentionDecl,
    parse_duration_s,
)
from kafka_iceberg.errors import ConfigError
from kafka_iceberg.ops.retention import RetentionPolicy


@dataclass(frozen=True)
class FreshnessPolicy:
    """Freshness thresholds, in seconds.

    ``max_snapshot_age_s``: the latest snapshot must be younger than this, unless the table
    has no lag (nothing to ingest is not staleness).
    ``max_valid_through_age_s``: now minus the snapshot's valid-through timestamp; ``None``
    disables it (for replays of historical data, where event time is years old).
    """

    max_snapshot_age_s: float
    max_valid_through_age_s: float | None


@dataclass(frozen=True)
class LagPolicy:
    """When the lag sensor triggers a micro-batch, and how it evaluates lag.

    ``max_offset_lag`` (records by offset, summed over partitions): trigger at or above it.
    ``max_interval_s``: trigger when any lag is left and the last commit is older than this
    (the micro-batch cadence). ``grace_s``: how much longer than ``max_interval_s`` a table
    with lag may go without a commit before it is STOP. ``window``: the commits across which
    growing lag makes it WARN. ``interval_s``: seconds between sensor evaluations.
    See :mod:`kafka_iceberg.ops.lag`.
    """

    max_offset_lag: int
    max_interval_s: float
    window: int
    interval_s: float
    grace_s: float


@dataclass(frozen=True)
class MaintenancePolicy:
    """Maintenance schedules (cron, UTC) and their settings for one table.

    ``retain_last`` (snapshots) and ``max_snapshot_age_s`` drive ``expire_snapshots``; a table with more
    than ``max_snapshots`` snapshots keeps only its newest ``retain_last`` (and what its ingest state
    and a pending check need), and a worker or streaming run expires it as soon as a commit passes
    that ceiling; a worker run compacts a table as soon as its commits added ``compact_after_data_files``
    data files since its last compaction (each micro-batch adds at least one, and every later commit
    that merges manifests rewrites an entry per data file); ``orphan_older_than_s`` is
    ``remove_orphan_files``' safety window (>= 24 h, longer than the longest micro-batch); ``target_file_size_bytes`` drives ``rewrite_data_files``;
    ``full_check_cron``: the full-scan ``duplicate_free`` check (after a run it is incremental).
    """

    compact_cron: str
    expire_cron: str
    remove_orphans_cron: str
    retain_last: int
    max_snapshot_age_s: float
    orphan_older_than_s: float
    target_file_size_bytes: int
    full_check_cron: str
    pinned: tuple[str, ...]  # crons the table declares itself (run as written; others spread, schedules/spread.py)
    max_snapshots: int
    compact_after_data_files: int

    def past_max_snapshots(self, snapshots: int | None) -> bool:
        """Whether a commit that planned on ``snapshots`` snapshots (``BatchResult.snapshots``, every
        ref's; None: unknown) left its table with more than ``max_snapshots`` (the commit adds one)."""
        return snapshots is not None and snapshots + 1 > self.max_snapshots


@dataclass(frozen=True)
class BadRecordPolicy:
    """What happens to a record that does not fit the table (see docs/tables.md#bad-records).

    ``policy``: ``quarantine`` writes it to the dead-letter table in the same micro-batch as
    the good records; ``fail`` fails the run and commits nothing.
    ``max_quarantine_rate``: the ``quarantine`` asset check fails when the latest micro-batch
    quarantined more than this fraction (0..1) of the records it read.
    ``max_record_bytes``: a record whose key plus value is larger (bytes) is a bad record.
    ``dead_letter_identifier``: the dead-letter Iceberg table (``namespace.table``).
    """

    policy: str
    max_quarantine_rate: float
    max_record_bytes: int
    dead_letter_identifier: str


def freshness_policy(fresh: FreshnessDecl, where: str) -> FreshnessPolicy:
    """The :class:`FreshnessPolicy` of a validated ``freshness:`` section (seconds; an undeclared
    ``max_valid_through_age`` is ``max_snapshot_age``, ``none``/``off`` disables it)."""
    declared = "max_valid_through_age" in fresh.model_fields_set
    vt = fresh.max_valid_through_age if declared else fresh.max_snapshot_age
    return FreshnessPolicy(
        parse_duration_s(fresh.max_snapshot_age, f"{where} freshness.max_snapshot_age"),
        None
        if vt in (None, False, "none", "off")
        else parse_duration_s(vt, f"{where} freshness.max_valid_through_age"),
    )


def lag_policy(lag: LagDecl, where: str) -> LagPolicy:
    """The :class:`LagPolicy` of a validated ``lag:`` section (durations in seconds)."""
    return LagPolicy(
        lag.max_offset_lag,
        parse_duration_s(lag.max_interval, f"{where} lag.max_interval"),
        lag.window,
        parse_duration_s(lag.interval, f"{where} lag.interval"),
        parse_duration_s(lag.grace, f"{where} lag.grace"),
    )


def maintenance_policy(m: MaintenanceDecl, where: str, own: dict) -> MaintenancePolicy:
    """The :class:`MaintenancePolicy` of a validated ``maintenance:`` section; ``own``: the section as
    the table itself wrote it (its crons are pinned, the others spread).

    Raises:
        ConfigError: ``orphan_older_than`` below 24 h, or ``max_snapshots`` not above ``retain_last``.
    """
    orphan_s = parse_duration_s(m.orphan_older_than, f"{where} maintenance.orphan_older_than")
    if orphan_s < 86400:
        raise ConfigError(f"{where}: maintenance.orphan_older_than must be at least 24h (longer than any micro-batch)")
    if m.max_snapshots <= m.retain_last:
        raise ConfigError(
            f"{where}: maintenance.max_snapshots must exceed retain_last, got {m.max_snapshots} <= {m.retain_last}"
        )
    return MaintenancePolicy(
        m.compact,
        m.expire,
        m.remove_orphans,
        m.retain_last,
        parse_duration_s(m.max_snapshot_age, f"{where} maintenance.max_snapshot_age"),
        orphan_s,
        m.target_file_size_bytes,
        m.full_check,
        tuple(k for k in ("compact", "expire", "remove_orphans", "full_check") if k in own),
        m.max_snapshots,
        m.compact_after_data_files,
    )


def retention_policy(r: RetentionDecl, where: str) -> RetentionPolicy:
    """The :class:`RetentionPolicy` of a validated ``retention:`` section (durations in seconds).

    Raises:
        ConfigError: thresholds in the wrong order.
    """
    policy = RetentionPolicy(
        parse_duration_s(r.warn_headroom, where), parse_duration_s(r.error_headroom, where), r.warn_ratio, r.error_ratio
    )
    if not (policy.error_headroom_s <= policy.warn_headroom_s and policy.warn_ratio <= policy.error_ratio):
        raise ConfigError(
            f"{where}: retention needs error_headroom <= warn_headroom and 0 < warn_ratio <= error_ratio <= 1"
        )
    return policy


def bad_record_policy(b: BadRecordsDecl, where: str, identifier: str) -> BadRecordPolicy:
    """The :class:`BadRecordPolicy` of a validated ``bad_records:`` section of table ``identifier``.

    Raises:
        ConfigError: a dead-letter table that is not another ``namespace.table``.
    """
    dlq = b.dead_letter_table or f"{identifier}_dead_letter"
    parts = dlq.split(".")
    if len(parts) < 2 or not all(IDENTIFIER.match(p) for p in parts) or dlq == identifier:
        raise ConfigError(
            f"{where}: bad_records.dead_letter_table {dlq!r} must be another namespace.table in lower_snake_case"
        )
    return BadRecordPolicy(b.policy, b.max_quarantine_rate, b.max_record_bytes, dlq)
