"""The ``lake_workers`` sensor (``LAKE_WORKERS`` >= 1): one sensor watches every table.

Per tick: the watermarks of every partition of every table's topic in one batched call
(:meth:`kafka_iceberg.kafka.admin.KafkaMetadata.watermarks_many`), each table's committed offsets from
its snapshot summary, and per table an ``AssetObservation`` (offset lag in records, seconds since its
last commit, whether its topic exists). A worker whose tables include one that is due (offset lag at
or above ``lag.max_offset_lag``, or any lag and no commit for ``lag.max_interval``) and that has no run
in progress gets a run of its job (:mod:`kafka_iceberg.lake_assets.worker`).
"""

from __future__ import annotations

import time

from dagster import (
    AssetObservation,
    DefaultSensorStatus,
    JobDefinition,
    MetadataValue,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from kafka_iceberg.batch.worker import offset_lags
from kafka_iceberg.catalog.tables import read_state
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.vocabulary import IN_PROGRESS, WORKER_TAG, table_key, worker_job_name
from kafka_iceberg.resources import IcebergCatalogResource, KafkaResource


def is_due(spec: TableSpec, lag: int, last_commit_ms: int | None, now_ms: int) -> bool:
    """Whether ``spec`` should ingest now: offset lag (records) at or above its threshold, or any lag
    and no commit for its ``lag.max_interval`` (``last_commit_ms``, ``now_ms``: ms since epoch)."""
    if lag >= spec.lag.max_offset_lag:
        return True
    return lag > 0 and (last_commit_ms is None or now_ms - last_commit_ms >= spec.lag.max_interval_s * 1000)


def workers_sensor(groups: dict[int, list[TableSpec]], jobs: list[JobDefinition]):
    """The one sensor of every table in worker mode; ``groups``: worker -> its tables; ``jobs``: their jobs."""
    specs = [s for group in groups.values() for s in group]
    worker_of = {s.identifier: k for k, group in groups.items() for s in group}
    interval = int(min((s.lag.interval_s for s in specs), default=30))

    @sensor(
        name="lake_workers",
        minimum_interval_seconds=max(1, interval),
        jobs=jobs,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Lag of all {len(specs)} tables in one tick; launches worker runs ({len(groups)} workers).",
    )
    def _tick(context: SensorEvaluationContext, kafka: KafkaResource, catalog: IcebergCatalogResource):
        now_ms = int(time.time() * 1000)
        marks = kafka.metadata().watermarks_many(sorted({s.topic for s in specs}))
        pycatalog = catalog.load()
        states = {s.identifier: read_state(pycatalog, s.identifier) for s in specs}
        lags = offset_lags(specs, marks, {k: v.offsets for k, v in states.items()})
        events, due_workers = [], {}
        for spec in specs:
            last = states[spec.identifier].snapshot_timestamp_ms
            lag = lags[spec.identifier]
            events.append(
                AssetObservation(
                    asset_key=table_key(spec),
                    metadata={
                        "offset_lag": MetadataValue.int(lag),
                        "seconds_since_commit": MetadataValue.float(round((now_ms - last) / 1000, 1) if last else -1.0),
                        "topic_exists": MetadataValue.bool(marks.get(spec.topic) is not None),
                    },
                )
            )
            if is_due(spec, lag, last, now_ms):
                due_workers.setdefault(worker_of[spec.identifier], []).append(spec.identifier)
        busy = _busy_workers(context, list(groups))
        requests = [
            RunRequest(
                run_key=f"{worker_job_name(k)}:{now_ms}",
                job_name=worker_job_name(k),
                tags={
                    WORKER_TAG: str(k),
                    "lake/trigger": f"due: {', '.join(due[:5])}" + (" ..." if len(due) > 5 else ""),
                },
            )
            for k, due in sorted(due_workers.items())
            if k not in busy
        ]
        context.log.info(f"lake_workers: {len(specs)} tables, due per worker {due_workers}, busy {sorted(busy)}")
        return SensorResult(run_requests=requests, asset_events=events)

    return _tick


def _busy_workers(context: SensorEvaluationContext, workers: list[int]) -> set[int]:
    """Workers with a run queued or in progress."""
    return {
        k
        for k in workers
        if context.instance.get_runs(filters=RunsFilter(job_name=worker_job_name(k), statuses=IN_PROGRESS), limit=1)
    }


__all__ = ["is_due", "workers_sensor"]
