"""Running a replay: into a new table or onto a branch, through the write path's phases."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from kafka_iceberg.batch.context import CrashHook, Lake, no_crash
from kafka_iceberg.batch.pipeline import prepare, run_batch
from kafka_iceberg.batch.plan import ingest_target, plan_range
from kafka_iceberg.batch.recovery import Attempt
from kafka_iceberg.batch.types import Target, WritePlan
from kafka_iceberg.catalog.tables import TableMetadataView
from kafka_iceberg.config.settings import Settings
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.errors import DataLossError
from kafka_iceberg.kafka.admin import KafkaMetadata
from kafka_iceberg.replay.range import (
    ReplayRange,
    check_progress,
    check_readable,
    replay_params,
    replay_table_spec,
    resolve_range,
)
from kafka_iceberg.replay.request import ReplayDataLossError, ReplayError, ReplayRequest, replay_branch_name
from kafka_iceberg.replay.validate import TableVersion, ValidationReport, validate_replay
from kafka_iceberg.state import ancestors, recorded_replay, replay_summary, state_at

log = logging.getLogger(__name__)


@dataclass
class ReplayResult:
    """Outcome of :func:`run_replay`.

    ``target``: the table written (the original itself for a branch rebuild); ``branch``: the
    replay branch, or None for a new table. ``offsets``: the target's committed offsets after
    the run (per partition of the replay). ``batches``, ``records``, ``quarantined``:
    micro-batches committed, rows written and bad records left out by this run (a resumed replay
    counts only its own; a new table's bad records go to its own dead-letter table, a branch's
    are only counted). ``resumed``: the
    target already held part of this replay. ``complete``: every partition reached its end.
    ``snapshot_id``: head of the target ref. ``validation``: the report, when validation ran
    (it runs only on a complete replay). ``seconds``: wall time of the run.
    """

    original: str
    target: str
    branch: str | None
    from_snapshot: int | None
    range: ReplayRange
    offsets: dict[int, int]
    batches: int = 0
    records: int = 0
    quarantined: int = 0
    resumed: bool = False
    complete: bool = False
    snapshot_id: int | None = None
    validation: ValidationReport | None = None
    seconds: float = 0.0

    @property
    def remaining(self) -> dict[int, int]:
        """Offsets still to replay per partition (0 everywhere when complete)."""
        return {p: max(0, e - self.offsets.get(p, s)) for p, (s, e) in self.range.ranges.items()}

    def publish_sql(self, catalog_name: str) -> list[str]:
        """For a branch rebuild: the Spark SQL that makes the branch the table (keeping the old
        ``main`` as a tag), and the one that drops the branch instead. Empty for a new table."""
        if self.branch is None:
            return []
        tag = f"before_{self.branch}"
        t = f"{catalog_name}.{self.target}"
        return [
            f"ALTER TABLE {t} CREATE TAG `{tag}`",
            f"CALL {catalog_name}.system.set_current_snapshot(table => '{self.target}', ref => '{self.branch}')",
            f"ALTER TABLE {t} DROP BRANCH `{self.branch}`",
        ]

    def to_dict(self, catalog_name: str = "lake") -> dict:
        """JSON-ready form (CLI output, Dagster metadata); partitions as string keys."""
        out = {
            "original": self.original,
            "target": self.target,
            "branch": self.branch,
            "from_snapshot": self.from_snapshot,
            "topic": self.range.topic,
            "range": {str(p): [s, e] for p, (s, e) in self.range.ranges.items()},
            "committed_offsets": {str(p): o for p, o in sorted(self.offsets.items())},
            "remaining": {str(p): n for p, n in self.remaining.items()},
            "batches": self.batches,
            "records": self.records,
            "quarantined": self.quarantined,
            "resumed": self.resumed,
            "complete": self.complete,
            "snapshot_id": self.snapshot_id,
            "seconds": self.seconds,
            "validation": self.validation.to_dict() if self.validation else None,
        }
        if self.branch:
            out["publish"] = self.publish_sql(catalog_name)
            out["drop"] = f"ALTER TABLE {catalog_name}.{self.target} DROP BRANCH `{self.branch}`"
        return out


def default_target(spec: TableSpec, request: ReplayRequest) -> str:
    """``<namespace>.<table>_replay_<request digest>``: the same request names the same table, so
    rerunning it resumes."""
    return f"{spec.identifier}_replay_{request.digest()}"


def run_replay(
    spark,
    settings: Settings,
    spec: TableSpec,
    request: ReplayRequest,
    *,
    kafka: KafkaMetadata,
    catalog,
    commit_id: str,
    is_alive: Callable[[Attempt], bool] | None = None,
    declared: Collection[str] = (),
    progress: Callable[[str], None] | None = None,
    crash_hook: CrashHook = no_crash,
) -> ReplayResult:
    """Replay ``request``'s range of table ``spec`` into its target, then validate if asked.

    Args:
        spark, settings, kafka, catalog, crash_hook: as for :func:`kafka_iceberg.batch.pipeline.run_micro_batch`.
        commit_id: recorded as ``kafka.commit-id`` of every snapshot this run commits and used
            in its attempt branches; in Dagster the run id, so ingestion's liveness check sees
            the replay's attempts as alive while its run is.
        is_alive: which leftover attempts on a new target table are dead (default: older than
            ``attempt_timeout_s``, 1 h); they are recovered before the replay continues.
        declared: identifiers of declared tables, which a new replay table may not take.
        progress: called with one line per committed micro-batch (default: the module logger).

    Returns:
        A :class:`ReplayResult`; ``validation`` is set when ``request.validate`` and the replay
        is complete. A mismatch is reported there, not raised.

    Raises:
        ReplayError: invalid request, or a target holding something else (nothing written).
        ReplayDataLossError: the range starts below a partition's log start offset.
        LakeError: the original table does not exist; and the write path's errors
            (MalformedRecordError, CommitConflictError, BrokerUnavailableError, ...).
    """
    t0 = time.perf_counter()
    say = progress or log.info
    lake = Lake(spark, settings, kafka, catalog, crash_hook)
    original = lake.history(spec.identifier)
    ostate = state_at(original.snapshots, original.main)
    if ostate.topic is not None and ostate.topic != spec.topic:
        raise ReplayError(f"table {spec.identifier} was ingested from topic {ostate.topic!r}, not {spec.topic!r}")
    if request.branch is not None:
        result = _replay_to_branch(lake, spec, request, commit_id, say, original)
        version, check_outside = TableVersion(spec.identifier, result.snapshot_id, result.branch), False
    else:
        result = _replay_to_table(lake, spec, request, commit_id, is_alive, declared, say, original)
        version, check_outside = TableVersion(result.target, result.snapshot_id), True
    if request.validate and result.complete:
        result.validation = _validate(lake, spec, result, version, check_outside)
        say(result.validation.summary())
    result.seconds = round(time.perf_counter() - t0, 3)
    return result


def _validate(lake: Lake, spec: TableSpec, result: ReplayResult, version: TableVersion, check_outside: bool):
    """:func:`validate_replay` of the replayed ``version`` against the original table's current
    ``main``, over ``result``'s range minus the original's accepted gaps."""
    original = lake.history(spec.identifier)
    return validate_replay(
        lake.spark,
        lake.settings,
        spec,
        original=TableVersion(spec.identifier, original.main),
        replay=version,
        ranges=result.range.ranges,
        excluded=state_at(original.snapshots, original.main).accepted_gaps,
        check_outside_range=check_outside,
    )


def _same_replay(recorded: dict | None, params: dict, where: str, advice: str) -> None:
    if recorded is not None and recorded != params:
        raise ReplayError(
            f"{where} holds another replay ({json.dumps(recorded)}); this one is {json.dumps(params)}. {advice}"
        )


def _replay_to_table(
    lake: Lake,
    spec: TableSpec,
    request: ReplayRequest,
    commit_id: str,
    is_alive,
    declared,
    say,
    original: TableMetadataView,
) -> ReplayResult:
    target = request.into or default_target(spec, request)
    if target == spec.identifier or target in set(declared):
        raise ReplayError(f"replay target {target} is a declared table; replay into a new table")
    existing = lake.find(target)
    recorded, progress = None, {}
    if existing is not None:
        recorded = recorded_replay(existing.snapshots, existing.main)
        if recorded is None and existing.main is not None:
            raise ReplayError(
                f"replay target {target} already exists and holds data that is not a replay; "
                "choose another target (--into)"
            )
        progress = state_at(existing.snapshots, existing.main).offsets
    rng = resolve_range(
        lake.kafka, spec, request, original_snapshots=original.snapshots, original_main=original.main, recorded=recorded
    )
    params = replay_params(spec.identifier, rng, request.from_snapshot)
    _same_replay(recorded, params, f"replay target {target}", "Choose another target, or drop that table first")
    check_readable(
        spec.identifier,
        rng.topic,
        {p: progress.get(p, s) for p, s in rng.start.items()},
        rng.end,
        lake.kafka.watermarks(rng.topic, sorted(rng.start)),
    )
    tspec = replay_table_spec(spec, target)
    prepare(lake, tspec, is_alive)
    result = ReplayResult(
        spec.identifier, target, None, request.from_snapshot, rng, dict(progress), resumed=recorded is not None
    )
    # a replay table mirrors no consumer group, so lag tools never see it
    where = Target(target, "main", None, ingest_target(tspec).dead_letter_table)
    _replay_batches(lake, tspec, where, request, params, commit_id, result, say)
    return result


def _replay_to_branch(
    lake: Lake, spec: TableSpec, request: ReplayRequest, commit_id: str, say, view: TableMetadataView
) -> ReplayResult:
    ref, s_id = replay_branch_name(request.branch), request.from_snapshot
    recorded = None
    if ref in view.refs:
        head = view.refs[ref]
        if s_id not in [s.snapshot_id for s in ancestors(view.snapshots, head)]:
            raise ReplayError(
                f"branch {ref} of {spec.identifier} exists and does not descend from snapshot {s_id}; "
                "choose another branch name, or drop it first"
            )
        recorded = recorded_replay(view.snapshots, head)
        if recorded is None and head != s_id:
            raise ReplayError(f"branch {ref} of {spec.identifier} exists and holds commits that are not a replay")
    rng = resolve_range(
        lake.kafka, spec, request, original_snapshots=view.snapshots, original_main=view.main, recorded=recorded
    )
    params = replay_params(spec.identifier, rng, s_id)
    _same_replay(recorded, params, f"branch {ref} of {spec.identifier}", "Choose another branch name, or drop it first")
    progress = state_at(view.snapshots, view.refs.get(ref, s_id)).offsets
    check_readable(
        spec.identifier,
        rng.topic,
        {p: progress.get(p, s) for p, s in rng.start.items()},
        rng.end,
        lake.kafka.watermarks(rng.topic, sorted(rng.start)),
    )
    if ref not in view.refs:
        lake.spark.sql(f"ALTER TABLE {lake.catalog_name}.{spec.identifier} CREATE BRANCH `{ref}` AS OF VERSION {s_id}")
    result = ReplayResult(spec.identifier, spec.identifier, ref, s_id, rng, {}, resumed=recorded is not None)
    # the original already quarantined these records: count them, write no second dead letter
    _replay_batches(lake, spec, Target(spec.identifier, ref, None, None), request, params, commit_id, result, say)
    return result


def _replay_batches(
    lake: Lake,
    spec: TableSpec,
    target: Target,
    request: ReplayRequest,
    params: dict,
    commit_id: str,
    result: ReplayResult,
    say,
) -> None:
    """Plan and run the replay's micro-batches on ``target`` until its range is done (or
    ``request.max_batches``), updating ``result``. The same phases as ingestion, with a
    range plan; every snapshot carries ``kafka.replay-of``."""
    rng, on_branch = result.range, target.ref != "main"
    bound = request.max_records_per_partition or spec.max_records_per_partition
    while True:
        history = lake.history(target.identifier)
        head = history.refs.get(target.ref)
        committed = state_at(history.snapshots, head).offsets
        check_progress(target.identifier, rng, committed)
        plan = _plan(lake, target, rng, history, bound, params)
        result.offsets = {p: committed.get(p, s) for p, s in rng.start.items()} if on_branch else dict(committed)
        result.snapshot_id = head
        done = plan.offsets.is_empty if on_branch else not plan.offsets.needs_commit
        if done or (request.max_batches is not None and result.batches >= request.max_batches):
            break
        batch = run_batch(lake, spec, plan, commit_id)
        result.batches += 1
        result.records += batch.records
        result.quarantined += batch.quarantined
        say(
            f"replay {result.original} -> {target.identifier}{'@' + target.ref if on_branch else ''}: batch "
            f"{result.batches}, {batch.records} records, ranges {dict(batch.ranges)}, snapshot {batch.snapshot_id}"
        )
    result.complete = result.offsets == rng.end


def _plan(
    lake: Lake, target: Target, rng: ReplayRange, history: TableMetadataView, bound: int, params: dict
) -> WritePlan:
    try:
        return plan_range(
            lake,
            target,
            rng.topic,
            history,
            start=rng.start,
            end=rng.end,
            bound=bound,
            extra_summary=replay_summary(params),
        )
    except DataLossError as exc:
        raise ReplayDataLossError(target.identifier, rng.topic, exc.partition, exc.committed, exc.log_start) from None
