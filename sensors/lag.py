"""Consumer-lag sensor of one table: observe lag, judge it, trigger micro-batches or a backfill.

Not in the code location (its worker runs serve every table, launched by ``lake_workers``); a location of
its own may add :func:`lag_sensor` for a table whose runs should be one-micro-batch runs and backfills
(tests/backfill_location.py does).

Each evaluation reads the table's committed offsets and newest ingest snapshot time (its
snapshot summary), the topic's high watermarks and the table's runs that failed since that
snapshot, judges them with :class:`kafka_iceberg.ops.lag.LagHistory` (kept in the sensor cursor;
rules over the table's commits and cadence, see docs/operations.md#lag-status) and records an
``AssetObservation`` on the table asset, so the asset page plots offset lag, time lag and
status over time. A change of alert *level* (OK -> WARN, -> ERROR for STALL or STOP, and the
recovery back to OK) posts one Slack message; a level that holds posts nothing.

It triggers when the offset lag reaches the table's ``lag.max_offset_lag`` or when lag is left
and the last commit is older than ``lag.max_interval`` (the table's cadence). Triggering is
the normal work of the sensor and posts nothing. What it requests depends on the backlog, the
largest per-partition lag (:func:`kafka_iceberg.lake_assets.backfill.plan_catch_up`):

- within one micro-batch (backlog <= ``max_records_per_partition``): one run of a micro-batch
  slot of the table asset (the table's least recently used slot of the ring,
  :func:`kafka_iceberg.lake_assets.backfill.next_slots`; a slot whose last run failed comes first);
- larger: one asset backfill over ``ceil(backlog / bound)`` slots (at most
  :data:`kafka_iceberg.lake_assets.backfill.MAX_BACKFILL_BATCHES`), one run per micro-batch, shown under
  *Runs -> Backfills*; a routine backfill is logged at INFO, one capped at
  :data:`kafka_iceberg.lake_assets.backfill.MAX_BACKFILL_BATCHES` posts one WARN naming the backlog.

A table whose runs keep failing is triggered again only after a backoff (30 s after one failed run,
doubling up to 900 s; :func:`kafka_iceberg.sensors.backoff.relaunch_hold_s`), not on every tick.

Nothing is requested while the table is already being materialized: a queued or running run
of the table, or a backfill of it not yet finished (:func:`kafka_iceberg.lake_assets.backfill.table_in_progress`).
"""

import logging
import time
from datetime import datetime, timezone

from dagster import (
    AssetObservation,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    MetadataValue,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from kafka_iceberg.catalog.tables import read_state
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.backfill import (
    CatchUpPlan,
    backfill_run_request,
    next_slots,
    plan_catch_up,
    table_in_progress,
)
from kafka_iceberg.lake_assets.vocabulary import MICRO_BATCHES, TABLE_TAG, table_alert, table_key
from kafka_iceberg.ops.alerts import AlertSink
from kafka_iceberg.ops.lag import STALL_ATTEMPTS, LagEvaluation, LagHistory, LagRules, observation
from kafka_iceberg.resources import LAKE_KEYS, ResourceKeys
from kafka_iceberg.sensors.backoff import relaunch_hold_s

log = logging.getLogger(__name__)


def observation_metadata(evaluation: LagEvaluation, last_commit_ms) -> dict:
    """Metadata of one lag observation (records by offset, seconds, status and why)."""
    return {
        "offset_lag": MetadataValue.int(evaluation.total_offset_lag),
        "time_lag_s": MetadataValue.float(evaluation.max_time_lag_s),
        "status": MetadataValue.text(evaluation.status),
        "status_reason": MetadataValue.text(evaluation.reason),
        "offset_lag_by_partition": MetadataValue.json({str(p): v for p, v in evaluation.offset_lag.items()}),
        "time_lag_s_by_partition": MetadataValue.json({str(p): v for p, v in evaluation.time_lag_s.items()}),
        "last_commit": MetadataValue.timestamp(last_commit_ms / 1000)
        if last_commit_ms
        else MetadataValue.text("never"),
    }


def should_trigger(spec: TableSpec, evaluation: LagEvaluation, last_commit_ms, now_ms: int) -> str | None:
    """Why the table should ingest now (a human-readable reason, e.g. ``offset lag 500 >= 300``),
    or ``None``. ``last_commit_ms``: the newest ingest snapshot's time (ms since epoch) or None;
    ``now_ms``: ms since epoch."""
    lag = evaluation.total_offset_lag
    if lag >= spec.lag.max_offset_lag:
        return f"offset lag {lag} >= {spec.lag.max_offset_lag}"
    if lag > 0 and (last_commit_ms is None or now_ms - last_commit_ms >= spec.lag.max_interval_s * 1000):
        return f"offset lag {lag} and no commit for {spec.lag.max_interval_s:.0f} s"
    return None


def failed_attempts(instance: DagsterInstance, spec: TableSpec, last_commit_ms: int | None) -> int:
    """Runs of the table (tagged ``lake/table``) created after its last commit that failed
    (counted up to :data:`kafka_iceberg.ops.lag.STALL_ATTEMPTS`)."""
    after = None if last_commit_ms is None else datetime.fromtimestamp(last_commit_ms / 1000, tz=timezone.utc)
    runs = instance.get_runs(
        filters=RunsFilter(tags={TABLE_TAG: spec.identifier}, statuses=[DagsterRunStatus.FAILURE], created_after=after),
        limit=STALL_ATTEMPTS,
    )
    return len(runs)


def alert_lag_status(
    spec: TableSpec, evaluation: LagEvaluation, sink: AlertSink | None = None, source: str | None = None
) -> bool:
    """Post a Slack message for a change of alert level: into WARN (WARN), into STALL/STOP
    (ERROR), or back to OK (OK, the recovery); ``source`` names the sensor (default this table's lag
    sensor). Returns whether Slack accepted it; never raises."""
    return (sink or AlertSink.from_env()).send(
        table_alert(
            spec,
            measure="lag_status",
            value=f"{evaluation.status} (was {evaluation.previous})",
            severity=evaluation.level,
            summary=(
                f"{spec.identifier} on topic {spec.topic}: {evaluation.reason}; offset lag "
                f"{evaluation.total_offset_lag} records, time lag {evaluation.max_time_lag_s:.0f} s"
            ),
            source=source or f"sensor {spec.name}_lag",
        )
    )


def alert_backfill(
    spec: TableSpec, evaluation: LagEvaluation, plan: CatchUpPlan, slot_keys: list[str], sink: AlertSink | None = None
) -> bool:
    """Report that the backlog needs a backfill: measure ``backlog_records`` = the largest per-partition lag
    (records by offset) against one micro-batch's bound. A routine backfill (all of the backlog in one
    backfill) is INFO and only logged; a capped one (more backfills follow) posts a WARN. Returns whether
    a message was posted; never raises."""
    value = (
        f"{plan.max_partition_lag} records in partition {plan.partition}, "
        f"{plan.batches} micro-batches of {plan.bound} per partition"
    )
    summary = (
        f"{spec.identifier} on topic {spec.topic}: offset lag {evaluation.total_offset_lag} records; launched a "
        f"backfill of {plan.batches} runs, one micro-batch each" + (" (capped; more follow)" if plan.capped else "")
    )
    sink = sink or AlertSink.from_env()
    alert = table_alert(
        spec,
        measure="backlog_records",
        value=value,
        severity="WARN" if plan.capped else "INFO",
        summary=summary,
        source=f"sensor {spec.name}_lag",
        extra={"micro-batch slots": slot_keys[0] if len(slot_keys) == 1 else f"{slot_keys[0]} .. {slot_keys[-1]}"},
    )
    if alert.severity == "INFO":
        log.info("%s", sink.format_text(alert))
        return False
    return sink.send(alert)


def _requests(
    context,
    spec: TableSpec,
    evaluation: LagEvaluation,
    has_state: bool,
    reason: str,
    now_ms: int,
    sink: AlertSink | None = None,
):
    """The run or backfill request for a trigger, with its new slots; ``([], [], why not)`` when busy."""
    busy = table_in_progress(context.instance, spec)
    if busy:
        return [], [], f"{busy} is still in progress"
    plan = plan_catch_up(spec, evaluation.offset_lag, has_state=has_state)
    keys = next_slots(context.instance, spec, plan.batches)
    new = [k for k in keys if not context.instance.has_dynamic_partition(MICRO_BATCHES.name, k)]
    tags = {TABLE_TAG: spec.identifier, "lake/trigger": reason}
    if plan.needs_backfill:
        alert_backfill(spec, evaluation, plan, keys, sink)
        run = backfill_run_request(spec, keys, tags)
    else:
        run = RunRequest(
            run_key=f"{spec.identifier}:{now_ms}", asset_selection=[table_key(spec)], partition_key=keys[0], tags=tags
        )
    what = f"{reason}: {'backfill of ' if plan.needs_backfill else 'run of '}{len(keys)} micro-batch(es)"
    return [run], [MICRO_BATCHES.build_add_request(new)] if new else [], what


def lag_sensor(spec: TableSpec, keys: ResourceKeys = LAKE_KEYS):
    """The lag sensor of one table (named ``<table name>_lag``); see the module docstring."""
    rules = LagRules.of(spec.lag)

    @sensor(
        name=f"{spec.name}_lag",
        minimum_interval_seconds=int(spec.lag.interval_s),
        asset_selection=[table_key(spec)],
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Consumer lag of {spec.identifier} on {spec.topic}: observe, judge over its commits and cadence, "
        "trigger a micro-batch, or a backfill of micro-batches when the backlog exceeds one.",
        required_resource_keys=keys.required("kafka", "catalog", "slack"),
    )
    def _lag(context: SensorEvaluationContext, **_by_key):  # a direct call also passes the resources by key
        kafka, catalog, slack = keys.of(context, "kafka", "catalog", "slack")
        now_ms = int(time.time() * 1000)
        state = read_state(catalog.load(), spec.identifier)
        last_commit_ms = state.snapshot_timestamp_ms
        watermarks = kafka.metadata().watermarks(spec.topic)
        committed = {p: state.offsets.get(p, w.low) for p, w in watermarks.items()}
        history = LagHistory.from_json(context.cursor)
        evaluation = history.observe(
            observation(
                now_ms,
                committed,
                {p: w.high for p, w in watermarks.items()},
                last_commit_ms,
                failed_attempts(context.instance, spec, last_commit_ms),
            ),
            rules,
        )
        if evaluation.level_changed:
            alert_lag_status(spec, evaluation, slack.sink())
        run_requests, partition_requests, what = [], [], "no"
        reason = should_trigger(spec, evaluation, last_commit_ms, now_ms)
        hold = relaunch_hold_s(context.instance, now_ms / 1000, tags={TABLE_TAG: spec.identifier}) if reason else 0
        if hold:
            what = f"{reason}, held back {hold:.0f} s more after failed runs"
        elif reason:
            run_requests, partition_requests, what = _requests(
                context, spec, evaluation, bool(state.offsets), reason, now_ms, slack.sink()
            )
        context.log.info(
            f"{spec.identifier}: status {evaluation.status} ({evaluation.reason}), offset lag "
            f"{evaluation.total_offset_lag}, time lag {evaluation.max_time_lag_s:.0f} s, trigger: {what}"
        )
        observation_event = AssetObservation(
            asset_key=table_key(spec), metadata=observation_metadata(evaluation, last_commit_ms)
        )
        return SensorResult(
            run_requests=run_requests,
            asset_events=[observation_event],
            cursor=history.to_json(),
            dynamic_partitions_requests=partition_requests,
        )

    return _lag


__all__ = [
    "TABLE_TAG",
    "alert_backfill",
    "alert_lag_status",
    "failed_attempts",
    "lag_sensor",
    "observation_metadata",
    "should_trigger",
]
