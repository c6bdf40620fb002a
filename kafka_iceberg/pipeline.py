"""One micro-batch of one table: recover, plan, read, write, publish, mirror offsets.

This is the whole Kafka -> Iceberg write path in plain Python (no Dagster). The Dagster
asset in ``lake_assets`` calls :func:`run_micro_batch` and turns its
:class:`BatchResult` into materialization metadata.

The conditional commit: the batch is written to the attempt's own branch, created at the
planned base snapshot, and published with Iceberg's ``fast_forward`` procedure. Iceberg
refuses to fast-forward ``main`` unless ``main`` is still an ancestor of the branch, and the
JDBC catalog swaps the metadata pointer atomically, so of two runs planned on the same
base exactly one publishes; the other gets :class:`CommitConflictError` and its snapshot
never becomes visible.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from pyspark.sql import functions as F

from kafka_iceberg import faults
from kafka_iceberg.catalog import (
    TableMetadataView,
    ensure_dead_letter_table,
    ensure_table,
    load_table,
    metadata_view,
    qualified,
    with_catalog_retry,
)
from kafka_iceberg.errors import CommitConflictError, LakeError, MalformedRecordError, from_task_exception
from kafka_iceberg.kafka_client import KafkaConfig, KafkaMetadata
from kafka_iceberg.planning import BatchPlan, Watermarks, plan_batch, split_ranges
from kafka_iceberg.reader import RAW_SCHEMA_DDL, make_task_reader
from kafka_iceberg.recovery import Attempt, RecoveryReport, age_liveness, attempt_branch, recover
from kafka_iceberg.settings import Settings
from kafka_iceberg.spec import TableSpec
from kafka_iceberg.state import KEY_DEAD_LETTER, ancestors, dead_letter_ref, ingest_summary, state_at, valid_through
from kafka_iceberg.transform import PROBLEM, ValueColumn, classify, dead_letter_rows, new_fields, table_rows, value_columns

log = logging.getLogger(__name__)


@dataclass
class BatchResult:
    """Outcome of one micro-batch.

    Units: ``records`` in records added to the table, ``records_read`` in records read from
    Kafka, ``quarantined`` in records written to the dead-letter table (``records_read =
    records + quarantined``), ``kafka_bytes`` in bytes of key + value read from Kafka,
    ``data_bytes_added`` in bytes of Parquet written, ``phase_seconds`` in seconds, offsets
    as Kafka offsets. ``snapshot_id`` is the published snapshot (None when nothing was
    committed because there was nothing new).
    """

    table: str
    commit_id: str
    committed: bool
    records: int = 0
    kafka_bytes: int = 0
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    offsets: dict[int, int] = field(default_factory=dict)
    lag_after: dict[int, int] = field(default_factory=dict)
    snapshot_id: int | None = None
    data_files_added: int = 0
    data_bytes_added: int = 0
    valid_through_ms: int | None = None
    phase_seconds: dict[str, float] = field(default_factory=dict)
    recovery: RecoveryReport = field(default_factory=RecoveryReport)
    group_commit_error: str | None = None
    records_read: int = 0
    quarantined: int = 0
    quarantined_by_partition: dict[int, int] = field(default_factory=dict)
    quarantine_kinds: dict[str, int] = field(default_factory=dict)
    schema_changes: list[dict] = field(default_factory=list)
    dead_letter_snapshot_id: int | None = None

    @property
    def total_lag(self) -> int:
        """Sum of per-partition offset lag left after the commit."""
        return sum(self.lag_after.values())


class _Timer:
    def __init__(self, phases: dict[str, float], name: str):
        self.phases, self.name = phases, name

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        self.phases[self.name] = round(self.phases.get(self.name, 0.0) + time.perf_counter() - self.t0, 3)


class TableWriter:
    """The write path for one declared table.

    Args:
        spark: a SparkSession configured by :func:`kafka_iceberg.catalog.spark_conf`.
        settings: runtime settings (catalog, timeouts, task sizing).
        spec: the table declaration.
        kafka: cluster metadata client (watermarks, timestamp lookups, group commits).
        catalog: pyiceberg catalog on the same JDBC database as Spark's.
        ref: the branch :meth:`execute` publishes to: ``main`` (the table readers see), or
            another branch such as a replay's rebuild; only ``main`` is mirrored to the
            consumer group.
        dead_letters: write quarantined records to the dead-letter table. ``False`` leaves them
            out and only counts them in the summary (a replay onto a branch, whose records the
            original ingest already quarantined).
    """

    def __init__(self, spark, settings: Settings, spec: TableSpec, kafka: KafkaMetadata, catalog,
                 ref: str = "main", dead_letters: bool = True):
        self.spark, self.settings, self.spec, self.kafka, self.catalog = spark, settings, spec, kafka, catalog
        self.qualified = qualified(settings, spec)
        self.ref, self.dead_letters = ref, dead_letters

    # -- metadata ------------------------------------------------------------------------
    def view(self) -> TableMetadataView:
        """The table's current snapshots and refs (freshly loaded from the catalog; retried while
        the catalog is locked or unreachable, up to ``LAKE_CATALOG_RETRY_S``).

        Raises:
            LakeError: the table does not exist. CatalogUnavailableError: the retries ran out.
        """
        return self._view(self.spec.identifier)

    def ensure_table(self) -> None:
        """Create the table from its declaration if it does not exist (see :func:`catalog.ensure_table`),
        and its dead-letter table under ``bad_records.policy: quarantine``."""
        self._retry("create or check the table", lambda: ensure_table(self.spark, self.settings, self.spec))
        if self.spec.bad_records.policy == "quarantine":
            self._ensure_dead_letter()

    # -- recovery --------------------------------------------------------------------------
    def recover(self, is_alive: Callable[[Attempt], bool] | None = None, only: set[str] | None = None) -> RecoveryReport:
        """Clean up after dead attempts on the table and its dead-letter table (see
        :mod:`kafka_iceberg.recovery`), after rolling the dead-letter table forward to every
        dead-letter snapshot a published ``main`` snapshot points at."""
        alive = is_alive or age_liveness(self.settings.attempt_timeout_s)
        report = RecoveryReport()
        dlq = self.spec.bad_records.dead_letter_identifier
        has_dlq = self._retry("look up the dead-letter table", lambda: load_table(self.catalog, dlq)) is not None
        if has_dlq:
            report.rolled_forward = self._roll_forward_dead_letter()
        targets = [self.spec.identifier] + ([dlq] if has_dlq else [])
        for ident in targets:
            part = self._retry(f"recover {ident}", lambda ident=ident: recover(
                self.spark,
                catalog_name=self.settings.catalog.name,
                identifier=ident,
                load_view=lambda: self._view(ident),
                is_alive=alive,
                clock_skew_s=self.settings.orphan_clock_skew_s,
                only=only,
            ))
            prefix = "" if ident == self.spec.identifier else f"{ident}:"
            report.dead_attempts += [prefix + b for b in part.dead_attempts]
            report.live_attempts += [prefix + b for b in part.live_attempts]
            report.expired_snapshots += part.expired_snapshots
            report.orphan_files_deleted += part.orphan_files_deleted
        return report

    def _roll_forward_dead_letter(self) -> list[int]:
        """Publish dead-letter snapshots that ``main``'s published snapshots point at but the dead-letter
        table's ``main`` does not reach yet (a crash between the two publishes). Returns their ids.

        Raises:
            LakeError: a pointed-at dead-letter snapshot is gone (its branch was dropped unpublished).
        """
        view = self.view()
        dlq = self.spec.bad_records.dead_letter_identifier
        dview = self._view(dlq)
        published = {s.snapshot_id for s in ancestors(dview.snapshots, dview.main)}
        pending = []
        for snap in ancestors(view.snapshots, view.main):
            ref = dead_letter_ref(snap)
            if ref is None:
                continue
            if int(ref["snapshot-id"]) in published:
                break
            pending.append(ref)
        rolled = []
        for ref in reversed(pending):  # oldest first: each is a descendant of the one before
            sid, branch = int(ref["snapshot-id"]), ref["branch"]
            if self._view(dlq).refs.get(branch) != sid:
                raise LakeError(
                    f"table {self.spec.identifier}: dead-letter snapshot {sid} of {dlq} (branch {branch}) is referenced "
                    "by a published snapshot but is gone; its quarantined records are lost. See docs/operations.md."
                )
            self._publish_dead_letter(branch, sid)
            log.warning("table %s: rolled dead-letter table %s forward to snapshot %s", self.spec.identifier, dlq, sid)
            rolled.append(sid)
        return rolled

    # -- planning --------------------------------------------------------------------------
    def plan(self) -> BatchPlan:
        """Plan the next micro-batch from the table's committed offsets and the topic's watermarks.

        Raises:
            TopicNotFoundError, BrokerUnavailableError: from the cluster.
            DataLossError: a committed offset fell below the log start offset.
            LakeError: the table was ingested from a different topic than declared, or it holds
                data but its ingest state was expired.
        """
        spec = self.spec
        view = self.view()
        state = state_at(view.snapshots, view.main)
        if state.snapshot_id is None and view.main is not None:
            total = int(view.snapshots[view.main].summary.get("total-records", "0"))
            if total > 0:  # never restart from the starting position over existing data
                raise LakeError(
                    f"table {spec.identifier} holds {total} records but no snapshot in main's ancestry carries "
                    "kafka.offsets (were they expired?); refusing to re-ingest from the starting position, "
                    "which would duplicate rows. See docs/state-contract.md."
                )
        if state.topic is not None and state.topic != spec.topic:
            raise LakeError(
                f"table {spec.identifier} was ingested from topic {state.topic!r} but tables.yaml declares "
                f"{spec.topic!r}; declare a new table instead of re-pointing this one"
            )
        partitions = self.kafka.partitions(spec.topic)
        watermarks = self.kafka.watermarks(spec.topic, partitions)
        initial = self._initial_offsets(watermarks, has_state=bool(state.offsets))
        return plan_batch(
            table=spec.identifier,
            topic=spec.topic,
            base_snapshot_id=view.main,
            committed=state.offsets,
            watermarks=watermarks,
            initial_offsets=initial,
            bound=spec.max_records_per_partition,
        )

    def _initial_offsets(self, watermarks: dict[int, Watermarks], has_state: bool) -> dict[int, int]:
        start = self.spec.starting_position
        if has_state or start.kind == "earliest":
            # a partition added to the topic after the table started is read from its beginning
            return {p: wm.low for p, wm in watermarks.items()}
        if start.kind == "latest":
            return {p: wm.high for p, wm in watermarks.items()}
        return self.kafka.offsets_for_timestamp(self.spec.topic, sorted(watermarks), start.timestamp_ms)

    # -- execution -------------------------------------------------------------------------
    def _read(self, plan: BatchPlan):
        pieces = split_ranges(plan.ranges, self.settings.max_records_per_task)
        rows = [(r.topic, r.partition, r.start, r.end) for r in pieces]
        ranges_df = self.spark.createDataFrame(rows, "topic STRING, partition INT, start BIGINT, end BIGINT")
        if rows:
            ranges_df = ranges_df.repartition(len(rows))
        reader = make_task_reader(
            self.kafka.config.client_conf(), self.spec.identifier, self.settings.read_timeout_s
        )
        return ranges_df.mapInArrow(reader, RAW_SCHEMA_DDL)

    def execute(self, plan: BatchPlan, commit_id: str, new_gaps: list[dict] | None = None,
                extra_summary: dict[str, str] | None = None) -> BatchResult:
        """Read the planned ranges, write them to an attempt branch and publish it to the target ref
        (``main`` unless the writer was made for another branch).

        Bad records (see :mod:`kafka_iceberg.transform`) go to the dead-letter table under
        ``bad_records.policy: quarantine``: they are written to the same-named branch of the
        dead-letter table first, ``main``'s snapshot records how many per partition and which
        dead-letter snapshot holds them, and that snapshot is published right after ``main``
        (recovery rolls it forward after a crash in between). Every batch reconciles before it
        publishes: records read = rows added + rows quarantined, per partition, checked against
        both snapshots' ``added-records``.

        Returns a :class:`BatchResult`; ``committed`` is False when the plan had nothing to do.
        ``extra_summary``: more snapshot summary properties (string values), such as a replay's
        ``kafka.replay-of``; the ingest state keys (``kafka.offsets`` ...) win over them.

        Raises:
            MalformedRecordError: a bad record under ``bad_records.policy: fail`` (nothing committed).
            CommitConflictError: ``main`` moved since the plan (nothing published).
            CatalogUnavailableError: the catalog stayed locked or unreachable past ``LAKE_CATALOG_RETRY_S``.
            DataLossError, ReadTimeoutError, BrokerUnavailableError: reading failed.
            LakeError: the batch did not reconcile (nothing published).
        """
        spec = self.spec
        phases: dict[str, float] = {}
        result = BatchResult(spec.identifier, commit_id, committed=False, offsets=dict(plan.start_offsets))
        if not plan.needs_commit:
            result.lag_after = plan.lag_after
            if self.ref == "main":
                with _Timer(phases, "group_commit_s"):
                    self._sync_group(plan.start_offsets, result, only_if_different=True)
            result.phase_seconds = phases
            return result
        started_ms = int(time.time() * 1000)
        branch = attempt_branch(commit_id, started_ms)
        dlq = spec.bad_records.dead_letter_identifier
        raw = classified = None
        dlq_snapshot_id = None
        try:
            with _Timer(phases, "branch_s"):
                branch_base = self._create_branch(spec.identifier, branch, plan.base_snapshot_id)
            faults.crash_point("after_branch")

            with _Timer(phases, "read_s"):
                raw = self._read(plan).persist()
                schema_changes = self._evolve(raw, commit_id) if spec.unknown_fields == "evolve" else []
                columns = self._value_columns()
                classified = classify(raw, spec, columns).persist()
                stats = classified.groupBy("partition").agg(
                    F.count(F.lit(1)).alias("records"),
                    F.count(F.col(PROBLEM)).alias("quarantined"),
                    F.max("offset").alias("max_offset"),
                    F.max("timestamp_ms").alias("max_timestamp_ms"),
                    F.sum(F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))).alias("bytes"),
                ).collect()
                raw.unpersist()
            faults.crash_point("after_read")
            self._check_read(plan, stats)
            read = {r["partition"]: int(r["records"]) for r in stats}
            quarantined = {r["partition"]: int(r["quarantined"]) for r in stats if r["quarantined"]}
            records_read, n_bad = sum(read.values()), sum(quarantined.values())
            kinds: dict[str, int] = {}
            if n_bad:
                kinds = {r["kind"]: int(r["n"]) for r in classified.where(F.col(PROBLEM).isNotNull())
                         .groupBy(F.col(f"{PROBLEM}.kind").alias("kind")).agg(F.count(F.lit(1)).alias("n")).collect()}
                if spec.bad_records.policy == "fail":
                    raise self._first_bad_record(classified)
            kafka_bytes = sum(r["bytes"] or 0 for r in stats)
            base_state = state_at(self.view().snapshots, plan.base_snapshot_id)
            max_ts = self._max_timestamps(base_state.max_timestamps, stats)
            summary = ingest_summary(
                topic=spec.topic,
                offsets={**base_state.offsets, **plan.end_offsets},
                batch={r.partition: (r.start, r.end) for r in plan.ranges},
                max_timestamps=max_ts,
                commit_id=commit_id,
                records=records_read - n_bad,
                accepted_gaps=[*base_state.accepted_gaps, *(new_gaps or [])],
                read={p: read.get(p, 0) for p in sorted({r.partition for r in plan.ranges})},
                quarantined=quarantined,
                quarantine_kinds=kinds,
                schema_changes=schema_changes,
            )
            summary = {**(extra_summary or {}), **summary}
            with _Timer(phases, "write_s"):
                if n_bad and self.dead_letters:
                    self._ensure_dead_letter()
                    dlq_base = self._create_branch(dlq, branch, self._view(dlq).main)
                    dlq_snapshot_id = self._append(dlq, branch, dlq_base, dead_letter_rows(classified, commit_id),
                                                   {"kafka.commit-id": commit_id, "kafka.dead-letter-of": spec.identifier},
                                                   n_bad, "quarantined")
                    summary[KEY_DEAD_LETTER] = json.dumps(
                        {"table": dlq, "snapshot-id": dlq_snapshot_id, "branch": branch}, separators=(",", ":"))
                snapshot_id = self._append(spec.identifier, branch, branch_base, table_rows(classified, spec, columns),
                                           summary, records_read - n_bad, "added")
            faults.crash_point("after_write")

            with _Timer(phases, "publish_s"):
                published = self._publish(plan, branch, snapshot_id)
            faults.crash_point("after_publish")
            if dlq_snapshot_id is not None:
                with _Timer(phases, "publish_s"):
                    self._publish_dead_letter(branch, dlq_snapshot_id)
        except BaseException as exc:
            self._abandon(branch, exc)
            remote = from_task_exception(exc) if not isinstance(exc, LakeError) else None
            if remote is not None:  # e.g. DataLossError or ReadTimeoutError from a reader task
                raise remote from None
            raise
        finally:
            for frame in (raw, classified):
                if frame is not None:
                    frame.unpersist()

        with _Timer(phases, "cleanup_s"):
            for ident in (spec.identifier, dlq) if dlq_snapshot_id is not None else (spec.identifier,):
                self._drop_branch(ident, branch)

        if self.ref == "main":
            with _Timer(phases, "group_commit_s"):
                self._sync_group(plan.end_offsets, result)

        snap = published.snapshots[snapshot_id]
        high = self.kafka.watermarks(spec.topic, sorted(plan.end_offsets))
        result.committed = True
        result.records = records_read - n_bad
        result.records_read = records_read
        result.quarantined = n_bad
        result.quarantined_by_partition = quarantined
        result.quarantine_kinds = kinds
        result.schema_changes = schema_changes
        result.dead_letter_snapshot_id = dlq_snapshot_id
        result.kafka_bytes = int(kafka_bytes or 0)
        result.ranges = {r.partition: (r.start, r.end) for r in plan.ranges}
        result.offsets = dict(plan.end_offsets)
        result.lag_after = {p: max(0, high[p].high - o) for p, o in plan.end_offsets.items()}
        result.snapshot_id = snapshot_id
        result.data_files_added = int(snap.summary.get("added-data-files", 0))
        result.data_bytes_added = int(snap.summary.get("added-files-size", 0))
        result.valid_through_ms = valid_through(max_ts)
        result.phase_seconds = phases
        return result

    # -- the steps of execute, each retried on a transient catalog error where that is safe ---------
    def _retry(self, what: str, fn, before_retry=None):
        return with_catalog_retry(f"table {self.spec.identifier}: {what}", fn, self.settings.catalog_retry_s,
                                  before_retry=before_retry)

    def _view(self, identifier: str) -> TableMetadataView:
        def load():
            table = load_table(self.catalog, identifier)
            if table is None:
                raise LakeError(f"table {identifier} does not exist in catalog {self.catalog.name}")
            return metadata_view(table)

        return self._retry(f"load metadata of {identifier}", load)

    def _create_branch(self, identifier: str, branch: str, at_snapshot: int | None) -> int:
        """Create ``branch`` at ``at_snapshot`` (``main`` of an empty table); returns its head snapshot id."""
        as_of = f" AS OF VERSION {at_snapshot}" if at_snapshot is not None else ""
        sql = f"ALTER TABLE {self.settings.catalog.name}.{identifier} CREATE BRANCH `{branch}`{as_of}"

        def created():
            return self._view(identifier).refs.get(branch)

        self._retry(f"create branch {branch} of {identifier}", lambda: self.spark.sql(sql), before_retry=created)
        head = created()
        if head is None:
            raise LakeError(f"table {identifier}: branch {branch} was not created")
        return head

    def _append(self, identifier: str, branch: str, branch_base: int, rows, summary: dict[str, str],
                expected: int, what: str) -> int:
        """Append ``rows`` to ``branch`` as one snapshot carrying ``summary``; returns its id.

        A retry happens only while the branch still points at ``branch_base`` (the append did
        not land), so the rows are never appended twice. The new snapshot must have added
        exactly ``expected`` rows (its ``added-records``; ``what`` names them in the error).

        Raises:
            LakeError: the branch vanished, no snapshot was made, or the batch does not reconcile
                (nothing is published).
        """

        def append():
            writer = rows.writeTo(f"{self.settings.catalog.name}.{identifier}.branch_{branch}")
            for key, value in summary.items():
                writer = writer.option(f"snapshot-property.{key}", value)
            writer.append()

        def landed(view: TableMetadataView | None = None):
            head = (view or self._view(identifier)).refs.get(branch)
            if head is None:
                raise LakeError(f"table {identifier}: attempt branch {branch} disappeared during the write")
            return head if head != branch_base else None

        self._retry(f"append to {identifier} branch {branch}", append, before_retry=landed)
        view = self._view(identifier)
        head = landed(view)
        if head is None:
            raise LakeError(f"table {identifier}: the append to branch {branch} made no snapshot")
        added = int(view.snapshots[head].summary.get("added-records", "0"))
        if added != expected:
            raise LakeError(
                f"table {self.spec.identifier}: micro-batch does not reconcile: snapshot {head} of {identifier} "
                f"added {added} rows but {expected} records were {what}; nothing was published"
            )
        return head

    def _first_bad_record(self, classified) -> MalformedRecordError:
        row = (classified.where(F.col(PROBLEM).isNotNull()).orderBy("partition", "offset")
               .select("topic", "partition", "offset", F.col(f"{PROBLEM}.kind").alias("kind"),
                       F.col(f"{PROBLEM}.reason").alias("reason")).first())
        return MalformedRecordError(self.spec.identifier, row["topic"], row["partition"], row["offset"],
                                    f"{row['kind']}: {row['reason']}")

    def _value_columns(self) -> list[ValueColumn]:
        return self._retry("read the table schema", lambda: value_columns(self.spark.table(self.qualified).schema))

    def _evolve(self, raw, commit_id: str) -> list[dict]:
        """Schema evolution (``unknown_fields: evolve``): add an optional column for every new
        top-level field of a primitive type in this batch, with Iceberg's schema update
        (``ALTER TABLE ... ADD COLUMN``), before the batch is written. Fields that cannot be added
        stay unknown and their records are quarantined. Returns the columns added."""
        fields = new_fields(self.spark, raw, self._value_columns())
        added = []
        for f in fields:
            if f.type is None:
                log.warning("table %s: new field %r is not added: %s; its records are quarantined",
                            self.spec.identifier, f.name, f.why_not)
                continue
            comment = f"added by schema evolution from topic {self.spec.topic} in run {commit_id}".replace("'", "")
            sql = f"ALTER TABLE {self.qualified} ADD COLUMN `{f.name}` {f.type.upper()} COMMENT '{comment}'"

            def exists(name=f.name):
                return True if any(c.name == name for c in self._value_columns()) else None

            if exists() is None:
                self._retry(f"add column {f.name}", lambda sql=sql: self.spark.sql(sql), before_retry=exists)
            log.warning("table %s: schema evolved: added optional column %s %s", self.spec.identifier, f.name, f.type)
            added.append({"column": f.name, "type": f.type})
        return added

    def _drop_branch(self, identifier: str, branch: str) -> None:
        try:
            self._retry(f"drop branch {branch} of {identifier}", lambda: self.spark.sql(
                f"ALTER TABLE {self.settings.catalog.name}.{identifier} DROP BRANCH IF EXISTS `{branch}`"))
        except Exception as exc:  # published already; the next recovery drops it
            log.warning("table %s: could not drop branch %s (%s); the next run drops it", identifier, branch, exc)

    def _ensure_dead_letter(self) -> None:
        self._retry("create the dead-letter table", lambda: ensure_dead_letter_table(self.spark, self.settings, self.spec))

    def accept_gap(self, commit_id: str, reason: str) -> BatchResult:
        """Accept records that were deleted before they were ingested: move each partition whose
        committed offset is below its log start offset up to that offset, in a snapshot of its own
        whose summary records every gap (``kafka.accepted-gaps``, carried forward by every later
        snapshot). Nothing is read; the next micro-batch continues from the log start offsets.

        Raises:
            LakeError: there is no gap (no committed offset is below its log start offset), or
                ``reason`` is empty.
            CommitConflictError: the table changed meanwhile.
        """
        if not reason.strip():
            raise LakeError("accepting a gap needs a reason; it is kept in the snapshot summary")
        spec = self.spec
        view = self.view()
        state = state_at(view.snapshots, view.main)
        watermarks = self.kafka.watermarks(spec.topic)
        now_ms = int(time.time() * 1000)
        gaps = [
            {"partition": p, "start": state.offsets[p], "end": wm.low, "reason": reason.strip(),
             "accepted_ms": now_ms, "commit_id": commit_id}
            for p, wm in sorted(watermarks.items())
            if p in state.offsets and state.offsets[p] < wm.low
        ]
        if not gaps:
            raise LakeError(f"table {spec.identifier}: no committed offset is below its log start offset; no gap to accept")
        offsets = dict(state.offsets)
        offsets.update({g["partition"]: g["end"] for g in gaps})
        plan = BatchPlan(
            table=spec.identifier, topic=spec.topic, base_snapshot_id=view.main,
            start_offsets=offsets, end_offsets=dict(offsets), watermarks=watermarks, has_state=False,
        )
        result = self.execute(plan, commit_id, new_gaps=gaps)
        log.warning("table %s: accepted gaps %s", spec.identifier, gaps)
        return result

    def _sync_group(self, offsets: dict[int, int], result: BatchResult, only_if_different: bool = False) -> None:
        """Mirror the table's committed offsets into its consumer group, so lag tools see them.

        The table is the source of truth: a group that disagrees (a crash between the Iceberg
        commit and this step, or someone resetting the group) is overwritten. A failure here
        is logged and reported, never fatal.
        """
        spec = self.spec
        try:
            if only_if_different and self.kafka.group_offsets(spec.consumer_group, spec.topic) == offsets:
                return
            if offsets:
                self.kafka.commit_group_offsets(spec.consumer_group, spec.topic, offsets)
        except LakeError as exc:
            log.warning("table %s: consumer group %s not updated: %s", spec.identifier, spec.consumer_group, exc)
            result.group_commit_error = str(exc)

    def _check_read(self, plan: BatchPlan, stats) -> None:
        """Every record read lies inside its planned range (a reader bug would otherwise duplicate)."""
        planned = {r.partition: r for r in plan.ranges}
        for row in stats:
            r = planned.get(row["partition"])
            if r is None or row["max_offset"] >= r.end or row["records"] > r.size:
                raise LakeError(
                    f"table {plan.table}: read {row['records']} records up to offset {row['max_offset']} "
                    f"from partition {row['partition']}, outside the planned range {r}"
                )

    def _max_timestamps(self, previous: dict[int, int], stats) -> dict[int, int]:
        out = dict(previous)
        for row in stats:
            p, ts = row["partition"], row["max_timestamp_ms"]
            if ts is not None and ts >= 0:
                out[p] = max(out.get(p, ts), ts)
        return out

    def _publish(self, plan: BatchPlan, branch: str, snapshot_id: int) -> TableMetadataView:
        """Fast-forward the target ref (``main``) to the attempt branch (at ``snapshot_id``) if it is
        still the planned base. The commit point of the micro-batch. Returns the table's metadata
        as read to confirm the ref is at ``snapshot_id``.

        A transient catalog error is retried only after re-reading the ref: already at
        ``snapshot_id`` means the fast-forward landed; still at the base means retry; anything
        else is a conflict."""
        ref = self.ref

        def check() -> int | None:
            head = self._view(self.spec.identifier).refs.get(ref)
            if head == snapshot_id:
                return snapshot_id
            if head != plan.base_snapshot_id:
                raise CommitConflictError(
                    f"table {plan.table}: {ref} moved from snapshot {plan.base_snapshot_id} to {head} after this "
                    "micro-batch was planned; another run committed first. Nothing was published; rerun to re-plan."
                )
            return None

        def fast_forward():
            try:
                self.spark.sql(
                    f"CALL {self.settings.catalog.name}.system.fast_forward('{self.spec.identifier}', '{ref}', '{branch}')")
            except Exception as exc:
                text = str(exc)
                if "not an ancestor" in text or "CommitFailedException" in text or "refresh is required" in text:
                    raise CommitConflictError(
                        f"table {plan.table}: {ref} moved after this micro-batch was planned (Iceberg refused the "
                        f"fast-forward: {text.splitlines()[0][:300]}). Nothing was published; rerun to re-plan."
                    ) from None
                raise

        check()
        self._retry(f"publish branch {branch} to {ref}", fast_forward, before_retry=check)
        view = self._view(self.spec.identifier)
        if view.refs.get(ref) != snapshot_id:
            raise CommitConflictError(f"table {plan.table}: {ref} is not at snapshot {snapshot_id} after the fast-forward")
        return view

    def _publish_dead_letter(self, branch: str, snapshot_id: int) -> None:
        """Fast-forward the dead-letter table's ``main`` to ``snapshot_id`` on ``branch`` (after
        ``main`` of the table published the batch that points at it)."""
        dlq = self.spec.bad_records.dead_letter_identifier

        def done():
            return True if self._view(dlq).main == snapshot_id else None

        if done() is None:
            self._retry(f"publish dead-letter branch {branch}", lambda: self.spark.sql(
                f"CALL {self.settings.catalog.name}.system.fast_forward('{dlq}', 'main', '{branch}')"), before_retry=done)

    def _abandon(self, branch: str, exc: BaseException) -> None:
        """Best-effort cleanup of this attempt after a failure (not a crash): the next run's
        recovery finishes whatever this leaves."""
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return
        try:
            report = self.recover(only={branch})
            log.info("table %s: abandoned attempt %s cleaned up: %s", self.spec.identifier, branch, report)
        except Exception as cleanup_exc:  # the branch stays; the next run recovers it
            log.warning("table %s: cleanup of attempt %s failed (%s); the next run will recover it",
                        self.spec.identifier, branch, cleanup_exc)


def run_micro_batch(
    spark,
    settings: Settings,
    spec: TableSpec,
    *,
    commit_id: str,
    kafka: KafkaMetadata | None = None,
    catalog=None,
    is_alive: Callable[[Attempt], bool] | None = None,
) -> BatchResult:
    """Recover, plan and execute one micro-batch of ``spec`` (the whole write path).

    ``commit_id`` identifies the run in the snapshot summary (the Dagster run id).
    ``is_alive`` decides which leftover attempts are dead (default: older than
    ``LAKE_ATTEMPT_TIMEOUT_S``).

    Raises:
        See :meth:`TableWriter.plan` and :meth:`TableWriter.execute`.
    """
    from kafka_iceberg.catalog import load_catalog

    kafka = kafka or KafkaMetadata(KafkaConfig.from_settings(settings))
    catalog = catalog or load_catalog(settings.catalog, settings.catalog_retry_s)
    writer = TableWriter(spark, settings, spec, kafka, catalog)
    phases: dict[str, float] = {}
    with _Timer(phases, "recover_s"):
        writer.ensure_table()
        recovery = writer.recover(is_alive)
    with _Timer(phases, "plan_s"):
        plan = writer.plan()
    result = writer.execute(plan, commit_id)
    result.recovery = recovery
    result.phase_seconds = {**phases, **result.phase_seconds}
    return result


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


__all__ = ["BatchResult", "TableWriter", "run_micro_batch", "describe"]
