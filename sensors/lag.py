"""Consumer-lag sensor, one per table: observe lag, record it, trigger micro-batches.

Each evaluation reads the table's committed offsets (its snapshot summary) and the topic's
high watermarks, adds the sample to a window kept in the sensor cursor, evaluates it with
Burrow's rules (:mod:`kafka_iceberg.lag`) and records an ``AssetObservation`` on the table
asset with the figures, so the asset page plots offset lag, time lag and status over time.
A change of status into WARN, STALL or STOP posts a Slack alert (:mod:`kafka_iceberg.alerts`).

It requests a materialization (one micro-batch) when the offset lag reaches the table's
``lag.max_offset_lag`` or when lag is left and the last commit is older than
``lag.max_interval``, unless a run of that table is already queued or running (runs carry the
tag ``lake/table``; the table's concurrency pool also holds one at a time).
"""

import time

from dagster import (
    AssetObservation,
    DefaultSensorStatus,
    MetadataValue,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from kafka_iceberg.alerts import Alert, AlertSink
from kafka_iceberg.catalog import read_state
from kafka_iceberg.lag import LagEvaluation, LagWindow, evaluate, sample_from
from kafka_iceberg.spec import TableSpec
from lake_assets.tables import IN_PROGRESS, table_key
from resources import IcebergCatalogResource, KafkaResource

TABLE_TAG = "lake/table"


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
    """Why a micro-batch should run now, or ``None``."""
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


def lag_sensor(spec: TableSpec):
    """The lag sensor of one table (named ``<table name>_lag``)."""

    @sensor(
        name=f"{spec.name}_lag",
        minimum_interval_seconds=int(spec.lag.interval_s),
        asset_selection=[table_key(spec)],
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Consumer lag of {spec.identifier} on {spec.topic}: observe, evaluate (Burrow), trigger micro-batches.",
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
        run_requests = []
        if reason:
            busy = context.instance.get_runs(
                filters=RunsFilter(tags={TABLE_TAG: spec.identifier}, statuses=IN_PROGRESS), limit=1
            )
            if busy:
                reason = None
                context.log.info(f"{spec.identifier}: run {busy[0].run_id} is still in progress; not requesting another")
            else:
                run_requests.append(
                    RunRequest(
                        run_key=f"{spec.identifier}:{now_ms}",
                        asset_selection=[table_key(spec)],
                        tags={TABLE_TAG: spec.identifier, "lake/trigger": reason},
                    )
                )
        context.log.info(
            f"{spec.identifier}: status {evaluation.status}, offset lag {evaluation.total_offset_lag}, "
            f"time lag {evaluation.max_time_lag_s:.0f} s, trigger: {reason or 'no'}"
        )
        return SensorResult(run_requests=run_requests, asset_events=[observation], cursor=window.to_json())

    return _lag


__all__ = ["TABLE_TAG", "alert_lag_status", "lag_sensor", "observation_metadata", "should_trigger"]
