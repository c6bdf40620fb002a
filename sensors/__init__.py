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


def all_sensors(specs, worker_groups=None, worker_jobs=()) -> list:
    """The sensors of the code location for the declared tables: per table a lag sensor, or, given
    ``worker_groups`` (worker -> its tables), the one ``lake_workers`` sensor launching ``worker_jobs``."""
    lag = [workers_sensor(worker_groups, list(worker_jobs))] if worker_groups else [lag_sensor(s) for s in specs]
    retention = [all_tables_retention_sensor(list(specs))] if worker_groups else [retention_sensor(s) for s in specs]
    return [
        *lag,
        *retention,
        run_failure_alert_sensor,
        run_liveness_sensor,
    ]
