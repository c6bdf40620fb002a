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
    ensure_table,
    load_table,
    metadata_view,
    qualified,
)
from kafka_iceberg.errors import CommitConflictError, LakeError, from_task_exception
from kafka_iceberg.kafka_client import KafkaConfig, KafkaMetadata
from kafka_iceberg.planning import BatchPlan, Watermarks, plan_batch, split_ranges
from kafka_iceberg.reader import RAW_SCHEMA_DDL, make_task_reader
from kafka_iceberg.recovery import Attempt, RecoveryReport, age_liveness, attempt_branch, recover
from kafka_iceberg.settings import Settings
from kafka_iceberg.spec import TableSpec
from kafka_iceberg.state import ingest_summary, state_at, valid_through
from kafka_iceberg.transform import bad_record_from_exception, parse_records

log = logging.getLogger(__name__)


@dataclass
class BatchResult:
    """Outcome of one micro-batch.

    Units: ``records`` in records, ``kafka_bytes`` in bytes of key + value read from Kafka,
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
    """

    def __init__(self, spark, settings: Settings, spec: TableSpec, kafka: KafkaMetadata, catalog):
        self.spark, self.settings, self.spec, self.kafka, self.catalog = spark, settings, spec, kafka, catalog
        self.qualified = qualified(settings, spec)

    # -- metadata ------------------------------------------------------------------------
    def view(self) -> TableMetadataView:
        """The table's current snapshots and refs (freshly loaded from the catalog)."""
        table = load_table(self.catalog, self.spec.identifier)
        if table is None:
            raise LakeError(f"table {self.spec.identifier} does not exist in catalog {self.catalog.name}")
        return metadata_view(table)

    def ensure_table(self) -> None:
        """Create the table from its declaration if it does not exist (see :func:`catalog.ensure_table`)."""
        ensure_table(self.spark, self.settings, self.spec)

    # -- recovery --------------------------------------------------------------------------
    def recover(self, is_alive: Callable[[Attempt], bool] | None = None, only: set[str] | None = None) -> RecoveryReport:
        """Clean up after dead attempts (see :mod:`kafka_iceberg.recovery`)."""
        return recover(
            self.spark,
            catalog_name=self.settings.catalog.name,
            identifier=self.spec.identifier,
            load_view=self.view,
            is_alive=is_alive or age_liveness(self.settings.attempt_timeout_s),
            clock_skew_s=self.settings.orphan_clock_skew_s,
            only=only,
        )

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

    def execute(self, plan: BatchPlan, commit_id: str, new_gaps: list[dict] | None = None) -> BatchResult:
        """Read the planned ranges, write them to an attempt branch and publish it to ``main``.

        Returns a :class:`BatchResult`; ``committed`` is False when the plan had nothing to do.

        Raises:
            MalformedRecordError: a record does not fit the declared schema (nothing committed).
            CommitConflictError: ``main`` moved since the plan (nothing published).
            DataLossError, ReadTimeoutError, BrokerUnavailableError: reading failed.
        """
        spec = self.spec
        phases: dict[str, float] = {}
        result = BatchResult(spec.identifier, commit_id, committed=False, offsets=dict(plan.start_offsets))
        if not plan.needs_commit:
            result.lag_after = plan.lag_after
            with _Timer(phases, "group_commit_s"):
                self._sync_group(plan.start_offsets, result, only_if_different=True)
            result.phase_seconds = phases
            return result
        started_ms = int(time.time() * 1000)
        branch = attempt_branch(commit_id, started_ms)
        raw = None
        try:
            with _Timer(phases, "branch_s"):
                as_of = f" AS OF VERSION {plan.base_snapshot_id}" if plan.base_snapshot_id is not None else ""
                self.spark.sql(f"ALTER TABLE {self.qualified} CREATE BRANCH `{branch}`{as_of}")
            faults.crash_point("after_branch")

            with _Timer(phases, "read_s"):
                raw = self._read(plan).persist()
                stats = raw.groupBy("partition").agg(
                    F.count(F.lit(1)).alias("records"),
                    F.max("offset").alias("max_offset"),
                    F.max("timestamp_ms").alias("max_timestamp_ms"),
                    F.sum(F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))).alias("bytes"),
                ).collect()
            faults.crash_point("after_read")
            records = sum(r["records"] for r in stats)
            kafka_bytes = sum(r["bytes"] or 0 for r in stats)
            self._check_read(plan, stats)
            base_state = state_at(self.view().snapshots, plan.base_snapshot_id)
            max_ts = self._max_timestamps(base_state.max_timestamps, stats)

            summary = ingest_summary(
                topic=spec.topic,
                offsets=plan.end_offsets,
                batch={r.partition: (r.start, r.end) for r in plan.ranges},
                max_timestamps=max_ts,
                commit_id=commit_id,
                records=records,
                accepted_gaps=[*base_state.accepted_gaps, *(new_gaps or [])],
            )
            with _Timer(phases, "write_s"):
                writer = parse_records(raw, spec).writeTo(f"{self.qualified}.branch_{branch}")
                for key, value in summary.items():
                    writer = writer.option(f"snapshot-property.{key}", value)
                try:
                    writer.append()
                except Exception as exc:
                    bad = bad_record_from_exception(exc, spec.identifier)
                    if bad is not None:
                        raise bad from None
                    raise
            faults.crash_point("after_write")

            with _Timer(phases, "publish_s"):
                snapshot_id = self._publish(plan, branch)
            faults.crash_point("after_publish")
        except BaseException as exc:
            self._abandon(branch, exc)
            remote = from_task_exception(exc) if not isinstance(exc, LakeError) else None
            if remote is not None:  # e.g. DataLossError or ReadTimeoutError from a reader task
                raise remote from None
            raise
        finally:
            if raw is not None:
                raw.unpersist()

        with _Timer(phases, "cleanup_s"):
            self.spark.sql(f"ALTER TABLE {self.qualified} DROP BRANCH IF EXISTS `{branch}`")

        with _Timer(phases, "group_commit_s"):
            self._sync_group(plan.end_offsets, result)

        snap = self.view().snapshots[snapshot_id]
        high = self.kafka.watermarks(spec.topic, sorted(plan.end_offsets))
        result.committed = True
        result.records = records
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

    def _publish(self, plan: BatchPlan, branch: str) -> int:
        """Fast-forward ``main`` to the attempt branch if ``main`` is still the planned base."""
        view = self.view()
        if view.main != plan.base_snapshot_id:
            raise CommitConflictError(
                f"table {plan.table}: main moved from snapshot {plan.base_snapshot_id} to {view.main} after this "
                "micro-batch was planned; another run committed first. Nothing was published; rerun to re-plan."
            )
        try:
            self.spark.sql(f"CALL {self.settings.catalog.name}.system.fast_forward('{self.spec.identifier}', 'main', '{branch}')")
        except Exception as exc:
            text = str(exc)
            if "not an ancestor" in text or "CommitFailedException" in text or "refresh is required" in text:
                raise CommitConflictError(
                    f"table {plan.table}: main moved after this micro-batch was planned (Iceberg refused the "
                    f"fast-forward: {text.splitlines()[0][:300]}). Nothing was published; rerun to re-plan."
                ) from None
            raise
        return self.view().refs[branch]

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

    kafka = kafka or KafkaMetadata(
        KafkaConfig(settings.kafka_bootstrap_servers, settings.kafka_client_config, settings.kafka_timeout_s)
    )
    catalog = catalog or load_catalog(settings.catalog)
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
