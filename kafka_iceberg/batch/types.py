"""The values that flow between the phases of a micro-batch (see docs/architecture.md).

:class:`WritePlan` -> :class:`AttemptBranch` -> :class:`ReadBatch` -> (summary, a ``dict[str, str]``) ->
:class:`WrittenAttempt` -> :class:`PublishedCommit` -> :class:`BatchResult`. All frozen: a
phase returns a new value and never edits the one it got.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kafka_iceberg.batch.planning import BatchPlan
from kafka_iceberg.batch.recovery import RecoveryReport
from kafka_iceberg.state import IngestState


@dataclass(frozen=True)
class Target:
    """Where a batch goes.

    ``identifier``: the table written; ``ref``: the branch published (``main``, or a replay's
    ``replay_<name>``); ``consumer_group``: the group the committed offsets are mirrored to
    (None: none, e.g. a replay); ``dead_letter_table``: where quarantined records are written
    (None: they are only counted, e.g. a replay onto a branch, whose original already quarantined them).
    """

    identifier: str
    ref: str = "main"
    consumer_group: str | None = None
    dead_letter_table: str | None = None


@dataclass(frozen=True)
class WritePlan:
    """Everything a batch needs to commit: the offsets to read (``offsets``, planned on the target
    ref's head ``offsets.base_snapshot_id``), the ingest state at that head (``base``), the target,
    offset ranges an operator accepts as lost with this commit (``new_gaps``, accept-gap only),
    extra summary properties (a replay's ``kafka.replay-of``) and the pyiceberg ``Table`` the plan was
    made on (``table``, the branch commit's base; None: the branch commit loads it)."""

    target: Target
    offsets: BatchPlan
    base: IngestState
    new_gaps: tuple = ()
    extra_summary: Mapping[str, str] = field(default_factory=dict)
    table: object = field(default=None, compare=False, repr=False)

    @property
    def base_snapshot_id(self) -> int | None:
        """The target ref's head the plan was made on (None: an empty table)."""
        return self.offsets.base_snapshot_id

    @property
    def ranges(self):
        """The non-empty offset ranges to read (:attr:`BatchPlan.ranges`)."""
        return self.offsets.ranges

    @property
    def start_offsets(self) -> dict[int, int]:
        """First offset to read per partition (:attr:`BatchPlan.start_offsets`)."""
        return self.offsets.start_offsets


@dataclass(frozen=True)
class AttemptBranch:
    """An attempt's branch as its commit made it: ``name``, the snapshot it starts at (``base_snapshot_id``)
    and the pyiceberg ``Table`` as committed (``table``: the read and write phases' schema, spec and
    FileIO, and the publish's base)."""

    name: str
    base_snapshot_id: int
    table: object = field(compare=False, repr=False)


@dataclass(frozen=True)
class PartitionStats:
    """What the read phase saw of one partition: records read, of them quarantined, the largest
    offset and record timestamp (ms since epoch; None if none), and key + value bytes."""

    partition: int
    records: int
    quarantined: int
    max_offset: int
    max_timestamp_ms: int | None
    bytes: int


@dataclass(frozen=True)
class ReadBatch:
    """The records of one batch, classified (a persisted Spark DataFrame: raw columns, ``j`` and
    ``_problem``, see :func:`kafka_iceberg.formats.transform.classify`) against the table's value
    ``columns``, with per-partition ``stats``, bad records per kind and the columns schema
    evolution added before the read. With ``data_files`` (tables parsed by pyarrow) the read tasks
    already wrote the records pyarrow claimed as those data files, and ``classified`` holds only
    the other records; ``stats`` count all of them."""

    classified: object
    columns: tuple
    stats: tuple[PartitionStats, ...]
    quarantine_kinds: Mapping[str, int] = field(default_factory=dict)
    schema_changes: tuple = ()
    schema_ids: Mapping[int, int] = field(default_factory=dict)  # records per registry schema id
    data_files: tuple | None = None  # tables parsed by pyarrow: DataFiles the read tasks wrote (batch/files.py)

    @property
    def records_read(self) -> int:
        """Records read from Kafka."""
        return sum(s.records for s in self.stats)

    @property
    def quarantined(self) -> int:
        """Records of them that are bad."""
        return sum(s.quarantined for s in self.stats)

    @property
    def records(self) -> int:
        """Records that become table rows."""
        return self.records_read - self.quarantined

    @property
    def kafka_bytes(self) -> int:
        """Key + value bytes read."""
        return sum(s.bytes for s in self.stats)


@dataclass(frozen=True)
class WrittenAttempt:
    """A batch written and not published, in one of two shapes:

    - committed to its attempt ``branch`` as the table's new snapshot ``snapshot_id``, with the
      ``history`` of the table as loaded right after (Spark's writer: tables parsed by Spark, upserts; the publish phase
      fast-forwards the target ref to it);
    - or as data ``files`` no snapshot references yet (pyiceberg ``DataFile`` s, tables parsed by pyarrow),
      with the snapshot ``summary`` to commit them under; ``snapshot_id`` and ``history`` are None,
      and the publish phase commits them on top of ``branch_base`` in one commit.

    ``dead_letter_snapshot_id``: the dead-letter snapshot holding its bad records (None: none written).
    ``table``: the pyiceberg ``Table`` as the branch commit returned it (the files were written for its
    default spec and format version; the publish commits on it first).
    """

    branch: str
    snapshot_id: int | None
    dead_letter_snapshot_id: int | None
    history: object
    files: tuple | None = None
    summary: Mapping[str, str] = field(default_factory=dict)
    branch_base: int | None = None
    table: object = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class PublishedCommit:
    """A batch visible on its target ref: the snapshot, its data files and bytes added, and the
    records the table holds after it (its ``total-records``)."""

    snapshot_id: int
    data_files_added: int
    data_bytes_added: int
    dead_letter_snapshot_id: int | None
    total_records: int | None = None


@dataclass(frozen=True)
class BatchResult:
    """Outcome of one micro-batch.

    Units: ``records`` in records added to the table, ``records_read`` in records read from
    Kafka, ``quarantined`` in records written to the dead-letter table (``records_read =
    records + quarantined``), ``kafka_bytes`` in bytes of key + value read from Kafka,
    ``data_bytes_added`` in bytes of Parquet written, ``phase_seconds`` in seconds, offsets
    as Kafka offsets. ``snapshot_id`` is the published snapshot (None when nothing was
    committed because there was nothing new). ``total_records``: records the table holds
    after the batch (its head snapshot's ``total-records``; None for a table without one).
    ``snapshots``: the snapshots in the table's metadata when the micro-batch planned (every ref's;
    each one is in ``metadata.json`` until expired: docs/tables.md#streaming-tables-and-their-snapshots).
    """

    table: str
    commit_id: str
    committed: bool
    records: int = 0
    kafka_bytes: int = 0
    ranges: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    offsets: Mapping[int, int] = field(default_factory=dict)
    lag_after: Mapping[int, int] = field(default_factory=dict)
    snapshot_id: int | None = None
    data_files_added: int = 0
    data_bytes_added: int = 0
    valid_through_ms: int | None = None
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    recovery: RecoveryReport = field(default_factory=RecoveryReport)
    group_commit_error: str | None = None
    records_read: int = 0
    quarantined: int = 0
    quarantined_by_partition: Mapping[int, int] = field(default_factory=dict)
    quarantine_kinds: Mapping[str, int] = field(default_factory=dict)
    schema_changes: list = field(default_factory=list)  # [{"column", "type"}]
    dead_letter_snapshot_id: int | None = None
    total_records: int | None = None
    snapshots: int | None = None

    @property
    def total_lag(self) -> int:
        """Sum of per-partition offset lag left after the commit."""
        return sum(self.lag_after.values())
