"""Retention-headroom sensor, one per table: how long until Kafka deletes unread records.

Each evaluation reads per partition the log start offset, the table's committed offset, the
high watermark, the topic's ``retention.ms`` and the timestamp of the oldest unread record
(one fetch per lagging partition), computes headroom and ratio
(:mod:`kafka_iceberg.ops.retention`), records them as an ``AssetObservation`` on the table (and the
topic's watermarks and ``retention.ms`` as one on the topic asset, so the lineage graph shows
the source's state), and
posts a Slack alert when the status changes into WARN, ERROR or DATA_LOSS. Data loss also
makes the table's next micro-batch fail with ``DataLossError``; docs/operations.md says how
to accept a gap deliberately.
"""

import json
import time
from collections.abc import Mapping

from dagster import AssetObservation, DefaultSensorStatus, MetadataValue, SensorEvaluationContext, SensorResult, sensor

from kafka_iceberg.batch.planning import Watermarks, offset_lag
from kafka_iceberg.catalog.tables import read_state
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.vocabulary import table_alert, table_key, topic_key
from kafka_iceberg.ops.alerts import AlertSink
from kafka_iceberg.ops.retention import PartitionRetention, evaluate
from kafka_iceberg.resources import LAKE_KEYS, ResourceKeys

OBSERVE_EVERY_S = 600
"""Seconds between two retention observations of a table whose status does not change (the heartbeat)."""


def retention_metadata(status: str, parts: list[PartitionRetention], retention_ms: int) -> dict:
    """Observation metadata: the worst headroom (s) and ratio, status, and per-partition figures."""
    headrooms = [p.headroom_s for p in parts if p.headroom_s is not None]
    return {
        "retention_status": MetadataValue.text(status),
        "headroom_s": MetadataValue.float(min(headrooms)) if headrooms else MetadataValue.text("unbounded"),
        "unread_ratio": MetadataValue.float(max((p.ratio for p in parts), default=0.0)),
        "retention_ms": MetadataValue.int(retention_ms),
        "partitions": MetadataValue.json(
            {
                str(p.partition): {
                    "low": p.low,
                    "committed": p.committed,
                    "high": p.high,
                    "headroom_s": p.headroom_s,
                    "ratio": p.ratio,
                    "oldest_unread_ms": p.oldest_unread_ms,
                    "status": p.status,
                }
                for p in parts
            }
        ),
    }


def topic_observation(
    key, spec: TableSpec, watermarks: Mapping[int, Watermarks], retention_ms: int
) -> AssetObservation:
    """An observation of the topic asset: high and low watermarks per partition (offsets), the
    summed high watermark, and ``retention.ms`` (``-1``: unbounded)."""
    return AssetObservation(
        asset_key=key,
        metadata={
            "high_watermark_total": MetadataValue.int(sum(w.high for w in watermarks.values())),
            "high_watermarks": MetadataValue.json({str(p): w.high for p, w in sorted(watermarks.items())}),
            "low_watermarks": MetadataValue.json({str(p): w.low for p, w in sorted(watermarks.items())}),
            "partitions": MetadataValue.int(len(watermarks)),
            "retention_ms": MetadataValue.int(retention_ms),
            "retention": MetadataValue.text("unbounded" if retention_ms < 0 else f"{retention_ms / 3_600_000:g} h"),
        },
    )


def alert_retention(
    spec: TableSpec, status: str, previous: str, parts: list[PartitionRetention], sink: AlertSink | None = None
) -> bool:
    """Post a Slack alert for a change into WARN (WARN) or ERROR/DATA_LOSS (ERROR). Never raises."""
    worst = [p for p in parts if p.status == status]
    if status == "DATA_LOSS":
        measure = "data_loss"
        value = "; ".join(f"partition {p.partition}: committed {p.committed} < log start {p.low}" for p in worst)
    else:
        measure = "retention_headroom_s"
        value = "; ".join(
            f"partition {p.partition}: {p.headroom_s if p.headroom_s is not None else 'unbounded'} s, "
            f"unread ratio {p.ratio}"
            for p in worst
        )
    return (sink or AlertSink.from_env()).send(
        table_alert(
            spec,
            measure=measure,
            value=value,
            severity="WARN" if status == "WARN" else "ERROR",
            summary=f"{spec.identifier} on topic {spec.topic}: retention status {status} (was {previous})",
            source=f"sensor {spec.name}_retention",
        )
    )


def evaluate_table(spec: TableSpec, meta, pycatalog, watermarks: Mapping[int, Watermarks], now_ms: int):
    """``(status, per-partition figures, retention.ms)`` of one table (see :func:`evaluate`)."""
    committed = read_state(pycatalog, spec.identifier).offsets
    lag = offset_lag(watermarks, committed)
    lagging = {p: max(committed.get(p, w.low), w.low) for p, w in watermarks.items() if lag[p] > 0}
    oldest = meta.record_timestamps(spec.topic, lagging)
    retention_ms = meta.retention_ms(spec.topic)
    status, parts = evaluate(watermarks, committed, retention_ms, oldest, now_ms, spec.retention)
    return status, parts, retention_ms


def all_tables_retention_sensor(specs: list[TableSpec], keys: ResourceKeys = LAKE_KEYS):
    """One retention-headroom sensor for every table (``lake_retention``, named by ``keys``): the watermarks
    of all topics in one batched call; per table the same figures and alerts as :func:`retention_sensor`, its
    observations (of the table and its topic) only when its status changes or :data:`OBSERVE_EVERY_S` after
    the last; a table whose evaluation fails is logged and skipped. ``keys``: the lake's resource keys."""

    @sensor(
        name=keys.name("lake_retention"),
        minimum_interval_seconds=60,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Retention headroom of all {len(specs)} tables in one tick.",
        required_resource_keys=keys.required("kafka", "catalog", "slack"),
    )
    def _retention(context: SensorEvaluationContext, **_by_key):  # a direct call also passes them by key
        kafka, catalog, slack = keys.of(context, "kafka", "catalog", "slack")
        now_ms, meta, pycatalog = int(time.time() * 1000), kafka.metadata(), catalog.load()
        marks = meta.watermarks_many(sorted({s.topic for s in specs}))
        statuses = json.loads(context.cursor) if context.cursor else {}  # identifier -> [status, observed ms]
        events = []
        for spec in specs:
            if marks.get(spec.topic) is None:
                context.log.warning(f"{spec.identifier}: topic {spec.topic} does not exist")
                continue
            try:
                status, parts, retention_ms = evaluate_table(spec, meta, pycatalog, marks[spec.topic], now_ms)
            except Exception as exc:  # noqa: BLE001 - one table's failure must not hide the others
                context.log.error(f"{spec.identifier}: retention not evaluated: {exc}")
                continue
            seen = statuses.get(spec.identifier)
            previous, observed_ms = (seen, None) if isinstance(seen, str) else (seen or ["OK", None])
            if status != previous and status != "OK":
                alert_retention(spec, status, previous, parts, slack.sink())
            if status != previous or observed_ms is None or now_ms - observed_ms >= OBSERVE_EVERY_S * 1000:
                observed_ms = now_ms
                table_md = retention_metadata(status, parts, retention_ms)
                events.append(AssetObservation(asset_key=table_key(spec), metadata=table_md))
                events.append(topic_observation(topic_key(spec), spec, marks[spec.topic], retention_ms))
            statuses[spec.identifier] = [status, observed_ms]
        return SensorResult(asset_events=events, cursor=json.dumps(statuses))

    return _retention


def retention_sensor(spec: TableSpec, keys: ResourceKeys = LAKE_KEYS):
    """The retention-headroom sensor of one table (named ``<table name>_retention``)."""

    @sensor(
        name=f"{spec.name}_retention",
        minimum_interval_seconds=60,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Retention headroom of {spec.identifier} on {spec.topic}: time and share of the log left before unread records are deleted.",
        required_resource_keys=keys.required("kafka", "catalog", "slack"),
    )
    def _retention(context: SensorEvaluationContext, **_by_key):  # a direct call also passes them by key
        kafka, catalog, slack = keys.of(context, "kafka", "catalog", "slack")
        now_ms = int(time.time() * 1000)
        meta = kafka.metadata()
        watermarks = meta.watermarks(spec.topic)
        status, parts, retention_ms = evaluate_table(spec, meta, catalog.load(), watermarks, now_ms)
        previous = json.loads(context.cursor)["status"] if context.cursor else "OK"
        if status != previous and status != "OK":
            alert_retention(spec, status, previous, parts, slack.sink())
        context.log.info(f"{spec.identifier}: retention status {status}")
        return SensorResult(
            asset_events=[
                AssetObservation(asset_key=table_key(spec), metadata=retention_metadata(status, parts, retention_ms)),
                topic_observation(topic_key(spec), spec, watermarks, retention_ms),
            ],
            cursor=json.dumps({"status": status}),
        )

    return _retention
