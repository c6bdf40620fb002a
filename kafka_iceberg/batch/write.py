"""The write phase: the attempt branch, the snapshot summary, and a batch's rows written,
unpublished: bad ones appended to the dead-letter table's attempt branch; good ones appended to
the table's attempt branch (Spark's writer, upserts) or held as data files for the publish
phase's one commit (tables parsed by pyarrow, :func:`kafka_iceberg.batch.read.arrow_parsed`).

Every write reconciles: the new snapshot's ``added-records`` (or the data files' record counts)
must equal the records the read phase counted for it, or nothing is published.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from kafka_iceberg.batch.commit import commit_branch
from kafka_iceberg.batch.commit_retry import CommitRetry
from kafka_iceberg.batch.context import Lake
from kafka_iceberg.batch.files import discard, file_writer, write_rows
from kafka_iceberg.batch.types import AttemptBranch, ReadBatch, WritePlan, WrittenAttempt
from kafka_iceberg.catalog.tables import TableMetadataView
from kafka_iceberg.cdc.changes import reduce_changes
from kafka_iceberg.cdc.upsert import merge_changes
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.errors import LakeError
from kafka_iceberg.formats.transform import dead_letter_rows, table_rows
from kafka_iceberg.state import (
    KEY_DEAD_LETTER,
    dead_letter_pointer,
    dead_letter_summary,
    ingest_summary,
)

log = logging.getLogger(__name__)


def batch_summary(
    spec: TableSpec, plan: WritePlan, batch: ReadBatch | None, commit_id: str, dead_letter: str | None = None
) -> dict[str, str]:
    """The snapshot summary of one batch (pure; see :mod:`kafka_iceberg.state`): the base state
    carried forward with this batch's offsets, timestamps, counts and gaps. ``batch`` is None
    for a commit that reads nothing; ``dead_letter`` is the ``kafka.dead-letter`` pointer
    (:func:`~kafka_iceberg.state.dead_letter_pointer`) when the batch quarantined records."""
    stats = batch.stats if batch is not None else ()
    max_ts = max_timestamps(plan.base.max_timestamps, stats)
    ranges = plan.offsets.ranges
    read = {s.partition: s.records for s in stats}
    summary = ingest_summary(
        topic=spec.topic,
        offsets={**plan.base.offsets, **plan.offsets.end_offsets},
        batch={r.partition: (r.start, r.end) for r in ranges},
        max_timestamps=max_ts,
        commit_id=commit_id,
        records=batch.records if batch is not None else 0,
        accepted_gaps=[*plan.base.accepted_gaps, *plan.new_gaps],
        read={p: read.get(p, 0) for p in sorted({r.partition for r in ranges})},
        quarantined={s.partition: s.quarantined for s in stats if s.quarantined},
        quarantine_kinds=batch.quarantine_kinds if batch is not None else {},
        schema_changes=list(batch.schema_changes) if batch is not None else [],
        schema_ids=batch.schema_ids if batch is not None else None,
    )
    pointer = {KEY_DEAD_LETTER: dead_letter} if dead_letter is not None else {}
    return {**plan.extra_summary, **summary, **pointer}  # the ingest state keys win


def max_timestamps(previous: Mapping[int, int], stats) -> dict[int, int]:
    """Per partition, the larger of the previous max record timestamp and this batch's (ms since epoch)."""
    out = dict(previous)
    for s in stats:
        if s.max_timestamp_ms is not None and s.max_timestamp_ms >= 0:
            out[s.partition] = max(out.get(s.partition, s.max_timestamp_ms), s.max_timestamp_ms)
    return out


def create_branch(lake: Lake, identifier: str, branch: str, at_snapshot: int | None, base=None) -> AttemptBranch:
    """Create ``branch`` at ``at_snapshot`` (``main`` of an empty table); returns it with the table as
    committed. At a snapshot: one commit on ``base`` (the pyiceberg ``Table`` the plan was made on; no
    reload of the history) or, when it lacks the snapshot or the table moved since, on a fresh load
    (:func:`_commit_branch`). On an empty table: ``ALTER TABLE ... CREATE BRANCH``, which makes an empty
    snapshot, and one metadata load to learn its id.

    Raises:
        LakeError: the branch was not created. CatalogUnavailableError: the retries ran out.
        CommitFailedException: the branch exists already, or the table kept moving.
    """

    def created():
        table = lake.load(identifier)
        return table if branch in table.metadata.refs else None

    what = f"table {identifier}: create branch {branch}"
    if at_snapshot is not None:
        table = lake.retry(what, lambda: _commit_branch(lake, identifier, branch, at_snapshot, base), created)
        return AttemptBranch(branch, at_snapshot, table)
    lake.sql(what, f"ALTER TABLE {lake.catalog_name}.{identifier} CREATE BRANCH `{branch}`", before_retry=created)
    table = created()
    if table is None:
        raise LakeError(f"table {identifier}: branch {branch} was not created")
    return AttemptBranch(branch, table.metadata.refs[branch].snapshot_id, table)


def _commit_branch(lake: Lake, identifier: str, branch: str, at_snapshot: int, base):
    """The branch commit (:func:`kafka_iceberg.batch.commit.commit_branch`) on ``base``, or on a fresh load
    when ``base`` is None or lacks ``at_snapshot``; a stale base is tried again on a fresh load as the
    table's ``commit.retry.*`` properties say (:class:`~kafka_iceberg.batch.commit_retry.CommitRetry`).
    Returns the committed pyiceberg ``Table``.

    Raises:
        CommitFailedException: the branch exists (another attempt by that name), or the table moved
            under every try.
    """
    table = base if base is not None and base.snapshot_by_id(at_snapshot) is not None else lake.load(identifier)
    for tried in CommitRetry.of(table.metadata.properties).retrying():
        with tried:
            if tried.retry_state.attempt_number > 1:
                table = lake.load(identifier)
            return commit_branch(table, branch, at_snapshot)
    raise AssertionError("unreachable: the retries re-raise")


def append(
    lake: Lake,
    identifier: str,
    branch: str,
    branch_base: int,
    rows,
    summary: Mapping[str, str],
    expected: int,
    what: str,
    shuffle: bool = True,
) -> tuple[int, TableMetadataView]:
    """Append ``rows`` to ``branch`` as one snapshot carrying ``summary``; returns its id and the
    table's metadata loaded after the append (one load). ``shuffle=False`` writes each Spark partition's
    rows as they are (``distribution-mode`` none, fanout writers): no shuffle stage, and for rows in
    one Spark partition the same data files as the table's hash distribution would make.

    A retry happens only while the branch still points at ``branch_base`` (the append did not
    land), so the rows are never appended twice.

    Raises:
        LakeError: the branch vanished, no snapshot was made, or its ``added-records`` is not
            ``expected`` (``what`` names those records; nothing is published).
    """

    def write():
        writer = rows.writeTo(f"{lake.catalog_name}.{identifier}.branch_{branch}")
        for key, value in summary.items():
            writer = writer.option(f"snapshot-property.{key}", value)
        if not shuffle:
            writer = writer.option("distribution-mode", "none").option("fanout-enabled", "true")
        writer.append()

    return _committed(lake, identifier, branch, branch_base, write, expected, what)


def _committed(
    lake: Lake, identifier: str, branch: str, branch_base: int, write, expected: int, what: str
) -> tuple[int, TableMetadataView]:
    """Run ``write`` (one commit to ``branch``; it may return the metadata after it, else it is
    loaded), retried only while the branch still points at ``branch_base``; returns the new
    snapshot id and that metadata.

    Raises:
        LakeError: the branch vanished, no snapshot was made, or its ``added-records`` is not ``expected``.
    """

    def landed(view: TableMetadataView | None = None):
        head = (view or lake.history(identifier)).refs.get(branch)
        if head is None:
            raise LakeError(f"table {identifier}: attempt branch {branch} disappeared during the write")
        return head if head != branch_base else None

    view = lake.retry(f"table {identifier}: append to branch {branch}", write, before_retry=landed) or lake.history(
        identifier
    )
    head = landed(view)
    if head is None:
        raise LakeError(f"table {identifier}: the append to branch {branch} made no snapshot")
    added = int(view.snapshots[head].summary.get("added-records", "0"))
    if added != expected:
        raise LakeError(
            f"table {identifier}: micro-batch does not reconcile: snapshot {head} of {identifier} "
            f"added {added} rows but {expected} records were {what}; nothing was published"
        )
    return head, view


def write_files(lake: Lake, spec: TableSpec, batch: ReadBatch, table) -> tuple:
    """Tables parsed by pyarrow: the data files the read tasks wrote, plus files for the good records
    Spark classified (:func:`~kafka_iceberg.batch.files.write_rows`); nothing is committed (the
    publish phase commits them). ``table``: the pyiceberg ``Table`` the attempt's branch commit returned.
    Returns the pyiceberg ``DataFile`` s.

    Raises:
        LakeError: the files do not hold ``batch.records`` rows (they are deleted; nothing is published).
    """
    files = list(batch.data_files)
    try:
        if batch.records > sum(f.record_count for f in files):
            files += write_rows(
                lake.spark,
                file_writer(table, spec, batch.columns),
                table_rows(batch.classified, spec, list(batch.columns)),
            )
        written = sum(f.record_count for f in files)
        if written != batch.records:
            raise LakeError(
                f"table {spec.identifier}: micro-batch does not reconcile: its data files hold {written} "
                f"rows but {batch.records} records were added; nothing was published"
            )
    except Exception:
        discard(table.io, files)
        raise
    return tuple(files)


def write_attempt(
    lake: Lake, spec: TableSpec, plan: WritePlan, batch: ReadBatch, attempt: AttemptBranch, commit_id: str
) -> WrittenAttempt:
    """Write the batch for the ``attempt`` branch: bad records first to the
    same-named branch of the dead-letter table (when the target has one), then the good rows with
    the summary, which points at that dead-letter snapshot: appended to ``branch``, or (arrow writer)
    as data files the publish phase commits (see :class:`~kafka_iceberg.batch.types.WrittenAttempt`).

    Raises:
        LakeError: a write did not reconcile. CatalogUnavailableError: retries ran out.
    """
    dlq, dlq_snapshot, pointer = plan.target.dead_letter_table, None, None
    branch, branch_base = attempt.name, attempt.base_snapshot_id
    shuffle = not plan.offsets.one_read_task(lake.settings.max_records_per_task)  # one read task: rows in one partition
    if batch.quarantined and dlq is not None:  # created with the table (Lake.ensure_tables)
        dlq_view = lake.history(dlq)
        dlq_branch = create_branch(lake, dlq, branch, dlq_view.main, dlq_view.table)
        dlq_snapshot, _ = append(
            lake,
            dlq,
            branch,
            dlq_branch.base_snapshot_id,
            dead_letter_rows(batch.classified, commit_id),
            dead_letter_summary(commit_id, spec.identifier),
            batch.quarantined,
            "quarantined",
            shuffle=shuffle,
        )
        pointer = dead_letter_pointer(dlq, dlq_snapshot, branch)
    summary = batch_summary(spec, plan, batch, commit_id, pointer)
    if spec.upsert is not None:
        snapshot_id, history = merge(lake, spec, batch, branch, summary)
        return WrittenAttempt(branch, snapshot_id, dlq_snapshot, history)
    if batch.data_files is not None:
        return WrittenAttempt(
            branch,
            None,
            dlq_snapshot,
            None,
            files=write_files(lake, spec, batch, attempt.table),
            summary=summary,
            branch_base=branch_base,
            table=attempt.table,
        )
    rows = table_rows(batch.classified, spec, list(batch.columns))
    snapshot_id, history = append(
        lake, spec.identifier, branch, branch_base, rows, summary, batch.records, "added", shuffle=shuffle
    )
    return WrittenAttempt(branch, snapshot_id, dlq_snapshot, history)


_KAFKA_SQL = {
    "topic": "topic",
    "partition": "partition",
    "offset": "offset",
    "timestamp": "timestamp_millis(timestamp_ms)",
    "key": "key",
    "headers": "headers",
}


def merge(
    lake: Lake, spec: TableSpec, batch: ReadBatch, branch: str, summary: Mapping[str, str]
) -> tuple[int, TableMetadataView]:
    """Upsert tables: the batch's last change per key merged into ``branch`` as one snapshot carrying
    ``summary`` (docs/cdc.md); returns its id and the table's metadata loaded after the merge.
    Not retried in place: a failed merge fails the attempt, and the rerun converges.

    Raises:
        CrossPartitionKeyError: a key's changes span partitions without source positions.
        LakeError: no snapshot was made, or its ``added-records`` is not the keys inserted or updated
            (changes newer than their rows, ``kafka_iceberg.cdc.upsert.merge_changes``).
    """
    key = list(spec.upsert.key)
    extra = {spec.kafka_column(k): _KAFKA_SQL[k] for k in spec.kafka_columns}
    changes = reduce_changes(batch.classified, list(batch.columns), key, spec.identifier, extra).persist()
    try:  # merge_changes applies the changes newer than their rows and reconciles their count
        snapshot_id = merge_changes(
            lake.spark, f"{lake.catalog_name}.{spec.identifier}", branch, changes, key, dict(summary)
        )
    finally:
        changes.unpersist()
    return snapshot_id, lake.history(spec.identifier)
