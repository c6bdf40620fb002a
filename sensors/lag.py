"""Consumer-lag sensor, one per table: observe lag, record it, trigger micro-batches or a backfill.

Each evaluation reads the table's committed offsets (its snapshot summary) and the topic's
high watermarks, adds the sample to a window kept in the sensor cursor, evaluates it with
Burrow's rules (:mod:`kafka_iceberg.lag`) and records an ``AssetObservation`` on the table
asset with the figures, so the asset page plots offset lag, time lag and status over time.
A change of status into WARN, STALL or STOP posts a Slack alert (:mod:`kafka_iceberg.alerts`).

It triggers when the offset lag reaches the table's ``lag.max_offset_lag`` (a *spike*) or when
lag is left and the last commit is older than ``lag.max_interval``. What it requests depends
on the backlog, the largest per-partition lag (:func:`lake_assets.backfill.plan_catch_up`):

- within one micro-batch (backlog <= ``max_records_per_partition``): one run of a new
  micro-batch slot of the table asset;
- larger: one asset backfill over ``ceil(backlog / bound)`` new slots (at most
  :data:`lake_assets.backfill.MAX_BACKFILL_BATCHES`), one run per micro-batch, shown under
  *Runs -> Backfills*.

Either way the new slots are added in the same ``SensorResult`` (``AddDynamicPartitionsRequest``).
Nothing is requested while the table is already being materialized: a queued or running run
of the table, or a backfill of it not yet finished (:func:`lake_assets.backfill.table_in_progress`),
so a spike gets exactly one run or one backfill. A spike and every backfill post a Slack
message (WARN) naming the table, the lag and what was requested; a routine trigger by
``max_interval`` within one micro-batch does not.
"""

import time

from dagster import (
    AssetObservation,
    DefaultSensorStatus,
    MetadataValue,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from kafka_iceberg.alerts import Alert, AlertSink
from kafka_iceberg.catalog import read_state
from kafka_iceberg.lag import LagEvaluation, LagWindow, evaluate, sample_from
from kafka_iceberg.spec import TableSpec
from lake_assets.backfill import CatchUpPlan, backfill_run_request, new_slot_keys, plan_catch_up, table_in_progress
from lake_assets.vocabulary import MICRO_BATCHES, TABLE_TAG, table_key
from resources import IcebergCatalogResource, KafkaResource


def observation_metadata(evaluation: LagEvaluation, last_commit_ms) -> dict:
    """Metadata of one lag observation (records by offset, seconds, Burrow status)."""
    return {
        "offset_lag": MetadataValue.int(evaluation.total_offset_lag),
        "time_lag_s": MetadataValue.float(evaluation.max_time_lag_s),
        "status": MetadataValue.text(evaluation.status),
        "offset_lag_by_partition": MetadataValue.json({str(p): v for p, v in evaluation.offset_lag.items()}),
        "time_lag_s_by_partition": MetadataValue.json({str(p): v for p, v in evaluation.time_lag_s.items()}),
        "status_by_partition": MetadataValue.json({str(p): v for p, v in evaluation.partition_status.items()}),
        "window_samples": MetadataValue.int(evaluation.samples),
        "last_commit": MetadataValue.timestamp(last_commit_ms / 1000) if last_commit_ms else MetadataValue.text("never"),
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


def alert_lag_status(spec: TableSpec, evaluation: LagEvaluation, previous: str, sink: AlertSink | None = None) -> bool:
    """Post a Slack alert for a status change into WARN (WARN) or STALL/STOP (ERROR). Never raises."""
    sink = sink or AlertSink.from_env()
    return sink.send(
        Alert(
            table=spec.identifier,
            asset_key_path=list(table_key(spec).path),
            measure="lag_status",
            value=f"{evaluation.status} (was {previous})",
            severity="ERROR" if evaluation.status in ("STALL", "STOP") else "WARN",
            summary=(
                f"{spec.identifier} on topic {spec.topic}: offset lag {evaluation.total_offset_lag} records, "
                f"time lag {evaluation.max_time_lag_s:.0f} s, partitions {evaluation.partition_status}"
            ),
            source=f"sensor {spec.name}_lag",
        )
    )


def alert_catch_up(
    spec: TableSpec, evaluation: LagEvaluation, plan: CatchUpPlan, slot_keys: list[str], sink: AlertSink | None = None
) -> bool:
    """Post a WARN to Slack about what the sensor requested: for a backfill, measure
    ``backlog_records`` = the largest per-partition lag against one micro-batch's bound; for a
    single run after a spike, measure ``offset_lag`` = total lag against ``lag.max_offset_lag``.
    Values are records by offset. Returns whether Slack accepted it; never raises."""
    topic = f"{spec.identifier} on topic {spec.topic}"
    if plan.needs_backfill:
        measure = "backlog_records"
        value = (f"{plan.max_partition_lag} records in partition {plan.partition}, "
                 f"{plan.batches} micro-batches of {plan.bound} per partition")
        summary = (f"{topic}: offset lag {evaluation.total_offset_lag} records; launched a backfill of "
                   f"{plan.batches} runs, one micro-batch each" + (" (capped; more follow)" if plan.capped else ""))
    else:
        measure = "offset_lag"
        value = f"{evaluation.total_offset_lag} records (threshold {spec.lag.max_offset_lag})"
        summary = f"{topic}: lag spike; requested one micro-batch run ({plan.max_partition_lag} records in the largest partition)"
    return (sink or AlertSink.from_env()).send(
        Alert(
            table=spec.identifier,
            asset_key_path=list(table_key(spec).path),
            measure=measure,
            value=value,
            severity="WARN",
            summary=summary,
            source=f"sensor {spec.name}_lag",
            extra={"micro-batch slots": slot_keys[0] if len(slot_keys) == 1 else f"{slot_keys[0]} .. {slot_keys[-1]}"},
        )
    )


def lag_sensor(spec: TableSpec):
    """The lag sensor of one table (named ``<table name>_lag``); see the module docstring."""

    @sensor(
        name=f"{spec.name}_lag",
        minimum_interval_seconds=int(spec.lag.interval_s),
        asset_selection=[table_key(spec)],
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Consumer lag of {spec.identifier} on {spec.topic}: observe, evaluate (Burrow), trigger a "
        "micro-batch, or a backfill of micro-batches when the backlog exceeds one.",
    )
    def _lag(context: SensorEvaluationContext, kafka: KafkaResource, catalog: IcebergCatalogResource):
        now_ms = int(time.time() * 1000)
        state = read_state(catalog.load(), spec.identifier)
        last_commit_ms = state.snapshot_timestamp_ms
        watermarks = kafka.metadata().watermarks(spec.topic)
        committed = {p: state.offsets.get(p, w.low) for p, w in watermarks.items()}
        window = LagWindow.from_json(context.cursor, spec.lag.window)
        previous = evaluate(window).status if window.samples else "OK"
        window.add(sample_from(now_ms, committed, {p: w.high for p, w in watermarks.items()}, last_commit_ms))
        evaluation = evaluate(window)
        if evaluation.status != previous and evaluation.status != "OK":
            alert_lag_status(spec, evaluation, previous)
        observation = AssetObservation(asset_key=table_key(spec), metadata=observation_metadata(evaluation, last_commit_ms))
        reason = should_trigger(spec, evaluation, last_commit_ms, now_ms)
        run_requests, partition_requests = [], []
        if reason:
            busy = table_in_progress(context.instance, spec)
            if busy:
                context.log.info(f"{spec.identifier}: {busy} is still in progress; not requesting another")
                reason = None
            else:
                plan = plan_catch_up(spec, evaluation.offset_lag, has_state=bool(state.offsets))
                keys = new_slot_keys(plan.batches, now_ms)
                partition_requests.append(MICRO_BATCHES.build_add_request(keys))
                tags = {TABLE_TAG: spec.identifier, "lake/trigger": reason}
                if plan.needs_backfill:
                    run_requests.append(backfill_run_request(spec, keys, tags))
                    alert_catch_up(spec, evaluation, plan, keys)
                else:
                    run_requests.append(RunRequest(run_key=f"{spec.identifier}:{now_ms}", asset_selection=[table_key(spec)],
                                                   partition_key=keys[0], tags=tags))
                    if evaluation.total_offset_lag >= spec.lag.max_offset_lag:
                        alert_catch_up(spec, evaluation, plan, keys)
                reason = f"{reason}: {'backfill of ' if plan.needs_backfill else 'run of '}{len(keys)} micro-batch(es)"
        context.log.info(
            f"{spec.identifier}: status {evaluation.status}, offset lag {evaluation.total_offset_lag}, "
            f"time lag {evaluation.max_time_lag_s:.0f} s, trigger: {reason or 'no'}"
        )
        return SensorResult(run_requests=run_requests, asset_events=[observation], cursor=window.to_json(),
                            dynamic_partitions_requests=partition_requests)

    return _lag


__all__ = ["TABLE_TAG", "alert_catch_up", "alert_lag_status", "lag_sensor", "observation_metadata", "should_trigger"]
