"""Sensors: per declared table a consumer-lag sensor (or, with ``LAKE_WORKERS`` >= 1, one
``lake_workers`` sensor for all tables, sensors/workers.py) (sensors/lag.py, which also launches
backfills of micro-batches, lake_assets/backfill.py) and a retention-headroom sensor
(sensors/retention.py); the Slack alert on failed runs (sensors/alerts.py); the run-liveness sensor
(sensors/liveness.py).
"""

from __future__ import annotations

from kafka_iceberg.sensors.alerts import run_failure_alert_sensor
from kafka_iceberg.sensors.lag import lag_sensor
from kafka_iceberg.sensors.liveness import run_liveness_sensor
from kafka_iceberg.sensors.retention import all_tables_retention_sensor, retention_sensor
from kafka_iceberg.sensors.workers import workers_sensor


def table_sensors(specs, workers: int = 0) -> list:
    """The lag and retention sensors of each declared table (defined by the table's Component instance);
    none with ``workers`` >= 1, where :func:`location_sensors` watches every table."""
    if workers:
        return []
    return [*(lag_sensor(s) for s in specs), *(retention_sensor(s) for s in specs)]


def location_sensors(worker_groups=None, worker_jobs=()) -> list:
    """The sensors defined once per code location: run-failure alerts, run liveness, and, given
    ``worker_groups`` (worker -> its tables), the ``lake_workers`` sensor launching ``worker_jobs`` and the
    ``lake_retention`` sensor of every table."""
    workers = []
    if worker_groups:
        every = [s for group in worker_groups.values() for s in group]
        workers = [workers_sensor(worker_groups, list(worker_jobs)), all_tables_retention_sensor(every)]
    return [*workers, run_failure_alert_sensor, run_liveness_sensor]


def all_sensors(specs, worker_groups=None, worker_jobs=()) -> list:
    """The sensors of the code location for the declared tables (see the two functions above)."""
    return [*table_sensors(specs, len(worker_groups or {})), *location_sensors(worker_groups, worker_jobs)]
