"""One micro-batch of one table: recover, plan, read, write, publish, mirror offsets.

This is the whole Kafka -> Iceberg write path in plain Python (no Dagster). The Dagster
asset in ``lake_assets`` calls :func:`run_micro_batch` and turns its :class:`BatchResult`
into materialization metadata. The phases live in :mod:`kafka_iceberg.batch`; this module
runs them in order (see docs/architecture.md):

``recover_tables`` -> ``plan_ingest`` (or ``plan_accept_gap``, or a replay's ``plan_range``)
-> :func:`run_batch`: ``create_branch`` -> ``read_batch`` -> ``write_attempt`` (with the one
``batch_summary``; the arrow writer's files are committed by the publish) -> ``publish`` (one
commit, which drops the branch) -> dead-letter publish and branch drop, group mirror ->
:class:`BatchResult`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from contextlib import contextmanager

from kafka_iceberg.batch.context import CRASH_POINTS, CrashHook, Lake, no_crash
from kafka_iceberg.batch.mirror import GroupMirror
from kafka_iceberg.batch.plan import plan_accept_gap, plan_ingest
from kafka_iceberg.batch.publish import drop_branch, mirror_group, publish, publish_dead_letter
from kafka_iceberg.batch.read import read_batch
from kafka_iceberg.batch.recover import dead_letters_id, recover_tables
from kafka_iceberg.batch.recovery import Attempt, RecoveryReport, attempt_branch
from kafka_iceberg.batch.types import BatchResult, PublishedCommit, ReadBatch, WritePlan
from kafka_iceberg.batch.warm import warm_for_backlog
from kafka_iceberg.batch.write import create_branch, max_timestamps, write_attempt
from kafka_iceberg.catalog.tables import TableMetadataView, load_catalog
from kafka_iceberg.config.settings import Settings
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.errors import LakeError, from_task_exception
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata
from kafka_iceberg.state import valid_through

log = logging.getLogger(__name__)


@contextmanager
def _timed(phases: dict[str, float], name: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = round(phases.get(name, 0.0) + time.perf_counter() - t0, 3)


def run_batch(
    lake: Lake,
    spec: TableSpec,
    plan: WritePlan,
    commit_id: str,
    phases: dict[str, float] | None = None,
    mirror: GroupMirror | None = None,
) -> BatchResult:
    """Read the planned ranges, write them to an attempt branch and publish it to the plan's target
    ref (dropping the branch in the same commit); then publish the dead-letter snapshot, drop its
    branch and mirror the offsets (with a ``mirror``, note them there for its next flush).

    A plan with nothing to commit only re-mirrors the group (no Spark job). ``phases``: seconds
    per phase are added to it (and returned in the result).

    Raises:
        MalformedRecordError: a bad record under ``bad_records.policy: fail`` (nothing committed).
        CommitConflictError: the target ref moved since the plan (nothing published).
        CatalogUnavailableError: the catalog stayed locked or unreachable past ``catalog_retry_s`` (60 s).
        DataLossError, ReadTimeoutError, BrokerUnavailableError: reading failed.
        LakeError: the batch did not reconcile (nothing published).
    """
    phases = {} if phases is None else phases
    if not plan.offsets.needs_commit:
        with _timed(phases, "group_commit_s"):
            error = mirror_group(lake, plan, plan.offsets.start_offsets, only_if_different=True)
        return BatchResult(
            spec.identifier,
            commit_id,
            False,
            offsets=dict(plan.offsets.start_offsets),
            lag_after=plan.offsets.lag_after,
            phase_seconds=phases,
            group_commit_error=error,
        )
    branch = attempt_branch(commit_id, int(time.time() * 1000))
    batch, published = _attempt(lake, spec, plan, commit_id, branch, phases)
    if published.dead_letter_snapshot_id is not None:  # the table's branch went with its publish
        with _timed(phases, "cleanup_s"):
            drop_branch(lake, plan.target.dead_letter_table, branch)
    with _timed(phases, "group_commit_s"):
        if mirror is None:
            error = mirror_group(lake, plan, plan.offsets.end_offsets)
        else:
            error = mirror.note(
                spec.identifier, plan.target.consumer_group, plan.offsets.topic, plan.offsets.end_offsets
            )
    return _result(spec, plan, commit_id, batch, published, phases, error)


def _attempt(
    lake: Lake, spec: TableSpec, plan: WritePlan, commit_id: str, branch: str, phases: dict[str, float]
) -> tuple[ReadBatch, PublishedCommit]:
    """Branch, read, write and publish, calling the crash hook between them. A failure cleans up
    this attempt (best effort); a crash (a ``BaseException`` that is not an ``Exception``, such
    as ``SystemExit``) leaves it for the next run's recovery, as a kill would."""
    batch = None
    try:
        with _timed(phases, "branch_s"):
            created = create_branch(lake, spec.identifier, branch, plan.base_snapshot_id, plan.table)
        lake.crash_hook("after_branch")
        with _timed(phases, "read_s"):
            batch = read_batch(lake, spec, plan, commit_id, created.table)
        lake.crash_hook("after_read")
        with _timed(phases, "write_s"):
            attempt = write_attempt(lake, spec, plan, batch, created, commit_id)
        lake.crash_hook("after_write")
        with _timed(phases, "publish_s"):
            published = publish(lake, plan, attempt)
        lake.crash_hook("after_publish")
        if published.dead_letter_snapshot_id is not None:
            with _timed(phases, "publish_s"):
                publish_dead_letter(lake, plan.target.dead_letter_table, branch, published.dead_letter_snapshot_id)
        return batch, published
    except BaseException as exc:
        if isinstance(exc, Exception):
            _abandon(lake, spec, branch)
        remote = from_task_exception(exc) if not isinstance(exc, LakeError) else None
        if remote is not None:  # e.g. DataLossError or ReadTimeoutError from a reader task
            raise remote from None
        raise
    finally:
        if batch is not None:
            batch.classified.unpersist()


def _result(
    spec: TableSpec,
    plan: WritePlan,
    commit_id: str,
    batch: ReadBatch,
    published: PublishedCommit,
    phases: dict[str, float],
    group_error: str | None,
) -> BatchResult:
    end = plan.offsets.end_offsets
    return BatchResult(
        table=spec.identifier,
        commit_id=commit_id,
        committed=True,
        records=batch.records,
        kafka_bytes=batch.kafka_bytes,
        ranges={r.partition: (r.start, r.end) for r in plan.offsets.ranges},
        offsets=dict(end),
        lag_after=plan.offsets.lag_after,
        snapshot_id=published.snapshot_id,
        data_files_added=published.data_files_added,
        data_bytes_added=published.data_bytes_added,
        phase_seconds=phases,
        valid_through_ms=valid_through(max_timestamps(plan.base.max_timestamps, batch.stats)),
        group_commit_error=group_error,
        records_read=batch.records_read,
        quarantined=batch.quarantined,
        quarantined_by_partition={s.partition: s.quarantined for s in batch.stats if s.quarantined},
        quarantine_kinds=dict(batch.quarantine_kinds),
        schema_changes=list(batch.schema_changes),
        dead_letter_snapshot_id=published.dead_letter_snapshot_id,
        total_records=published.total_records,
    )


def _abandon(lake: Lake, spec: TableSpec, branch: str) -> None:
    """Best-effort cleanup of this attempt after a failure: the next run's recovery finishes
    whatever this leaves."""
    try:
        report, _ = recover_tables(
            lake, spec, lake.history(spec.identifier), lake.find(dead_letters_id(spec)), only={branch}
        )
        log.info("table %s: abandoned attempt %s cleaned up: %s", spec.identifier, branch, report)
    except Exception as cleanup_exc:  # the branch stays; the next run recovers it
        log.warning(
            "table %s: cleanup of attempt %s failed (%s); the next run will recover it",
            spec.identifier,
            branch,
            cleanup_exc,
        )


def prepare(
    lake: Lake,
    spec: TableSpec,
    is_alive: Callable[[Attempt], bool] | None = None,
    history: TableMetadataView | None = None,
) -> tuple[RecoveryReport, TableMetadataView]:
    """Ensure the tables exist (once per process), load the table's and its dead-letter table's
    history once (the table's: ``history`` when the caller loaded it after ensuring), and recover;
    returns the recovery report and the history to plan on."""
    lake.ensure_tables(spec)
    history = history or lake.find(spec.identifier)
    if history is None:  # dropped since this process created it
        lake.forget_tables(spec)
        lake.ensure_tables(spec)
        history = lake.history(spec.identifier)
    return recover_tables(lake, spec, history, lake.find(dead_letters_id(spec)), is_alive)


def run_micro_batch(
    spark,
    settings: Settings,
    spec: TableSpec,
    *,
    commit_id: str,
    kafka: KafkaMetadata | None = None,
    catalog=None,
    is_alive: Callable[[Attempt], bool] | None = None,
    crash_hook: CrashHook = no_crash,
    mirror: GroupMirror | None = None,
) -> BatchResult:
    """Recover, plan and run one micro-batch of ``spec`` (the whole write path).

    ``commit_id`` identifies the run in the snapshot summary (the Dagster run id).
    ``is_alive`` decides which leftover attempts are dead (default: older than
    ``attempt_timeout_s``, 1 h). ``crash_hook`` is called at each of :data:`CRASH_POINTS`.
    ``mirror``: the committed offsets go to its next flush instead of the consumer group now.

    Raises:
        See :func:`kafka_iceberg.batch.plan.plan_ingest` and :func:`run_batch`.
    """
    lake = connect(spark, settings, kafka, catalog, crash_hook)
    phases: dict[str, float] = {}
    with _timed(phases, "recover_s"):
        recovery, history = prepare(lake, spec, is_alive)
    with _timed(phases, "plan_s"):
        plan = plan_ingest(lake, spec, history)
    result = run_batch(lake, spec, plan, commit_id, phases, mirror)
    head = history.snapshots.get(history.main) if history.main is not None else None
    total = result.total_records if result.committed or head is None else head.summary.get("total-records")
    return dataclasses.replace(
        result,
        recovery=recovery,
        total_records=None if total is None else int(total),
        snapshots=len(history.snapshots),
    )


def connect(
    spark, settings: Settings, kafka: KafkaMetadata | None = None, catalog=None, crash_hook: CrashHook = no_crash
) -> Lake:
    """A :class:`Lake` with the cluster and catalog clients made from ``settings`` where not given."""

    kafka = kafka or KafkaMetadata(KafkaConfig.from_settings(settings))
    catalog = catalog or load_catalog(settings.catalog, settings.catalog_retry_s)
    return Lake(spark, settings, kafka, catalog, crash_hook)


def warm_up(lake: Lake, specs: list[TableSpec]) -> dict[str, str]:
    """Prepare this process for the first micro-batches of ``specs`` without committing anything: for each
    table that exists (and, under ``quarantine``, whose dead-letter table exists), a load of its metadata
    and the checks of :meth:`Lake.ensure_tables` on it (once per process; read-only; from the loaded metadata,
    without Spark's catalog, where the column types allow), so that a worker taking over does not pay for
    them in its first micro-batch.

    It then warms the read phase's Spark job if a table's next micro-batch will start it
    (:func:`kafka_iceberg.batch.warm.warm_for_backlog`).

    Returns identifier -> ``warm``, ``missing`` (left to its first micro-batch, which creates it under the
    commit pool) or the error (the table's micro-batch reports it; nothing is raised)."""
    done, views = {}, {}
    for spec in specs:
        try:
            dead_letter = lake.find(dead_letters_id(spec)) if spec.bad_records.policy == "quarantine" else None
            missing = spec.bad_records.policy == "quarantine" and dead_letter is None
            view = None if missing else lake.find(spec.identifier)
            if view is None:
                done[spec.identifier] = "missing"
                continue
            lake.ensure_tables(spec, (view.table, dead_letter.table if dead_letter is not None else None))
            done[spec.identifier], views[spec.identifier] = "warm", view
        except Exception as exc:  # noqa: BLE001 - the table's own micro-batch fails and reports it
            done[spec.identifier] = f"{type(exc).__name__}: {exc}"
    if views:
        warm_for_backlog(lake, [spec for spec in specs if spec.identifier in views], views)
    return done


def accept_gap(lake: Lake, spec: TableSpec, commit_id: str, reason: str) -> BatchResult:
    """Accept records that were deleted before they were ingested: move each partition whose
    committed offset is below its log start offset up to that offset, in a snapshot of its own
    whose summary records every gap (``kafka.accepted-gaps``, carried forward by every later
    snapshot). Nothing is read; the next micro-batch continues from the log start offsets.

    Raises:
        LakeError: there is no gap, or ``reason`` is empty.
        CommitConflictError: the table changed meanwhile.
    """
    plan = plan_accept_gap(lake, spec, lake.history(spec.identifier), commit_id, reason)
    result = run_batch(lake, spec, plan, commit_id)
    log.warning("table %s: accepted gaps %s", spec.identifier, list(plan.new_gaps))
    return result


class TableWriter:
    """The write path bound to one declared table: each method runs one or more phases.

    Args:
        spark, settings, kafka, catalog, crash_hook: as for :func:`run_micro_batch`.
    """

    def __init__(
        self,
        spark,
        settings: Settings,
        spec: TableSpec,
        kafka: KafkaMetadata,
        catalog,
        crash_hook: CrashHook = no_crash,
    ):
        self.lake, self.spec = Lake(spark, settings, kafka, catalog, crash_hook), spec

    def ensure_table(self) -> None:
        """Create the table (and its dead-letter table) if missing; once per process."""
        self.lake.ensure_tables(self.spec)

    def view(self) -> TableMetadataView:
        """The table's current snapshots and refs (one metadata load)."""
        return self.lake.history(self.spec.identifier)

    def recover(self, is_alive: Callable[[Attempt], bool] | None = None) -> RecoveryReport:
        """Clean up after dead attempts (see :func:`kafka_iceberg.batch.recover.recover_tables`)."""
        return prepare(self.lake, self.spec, is_alive)[0]

    def plan(self) -> WritePlan:
        """Plan the next ingest micro-batch on the table's current history."""
        return plan_ingest(self.lake, self.spec, self.view())

    def execute(self, plan: WritePlan, commit_id: str) -> BatchResult:
        """Run a planned batch (see :func:`run_batch`)."""
        return run_batch(self.lake, self.spec, plan, commit_id)

    def accept_gap(self, commit_id: str, reason: str) -> BatchResult:
        """See :func:`accept_gap`."""
        return accept_gap(self.lake, self.spec, commit_id, reason)


def describe(result: BatchResult) -> str:
    """One-line human summary of a :class:`BatchResult`."""
    return json.dumps(
        {
            "table": result.table,
            "committed": result.committed,
            "records": result.records,
            "snapshot_id": result.snapshot_id,
            "offsets": result.offsets,
            "lag_after": result.lag_after,
        }
    )


__all__ = [
    "BatchResult",
    "CRASH_POINTS",
    "TableWriter",
    "accept_gap",
    "connect",
    "describe",
    "prepare",
    "run_batch",
    "run_micro_batch",
]
