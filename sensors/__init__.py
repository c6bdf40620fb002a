"""Sensors: per declared table a consumer-lag sensor (or, with ``LAKE_WORKERS`` >= 1, one
``lake_workers`` sensor for all tables, sensors/workers.py) (sensors/lag.py, which also launches
backfills of micro-batches, lake_assets/backfill.py) and a retention-headroom sensor
(sensors/retention.py); the Slack alert on failed runs (sensors/alerts.py); the run-liveness sensor
(sensors/liveness.py).
"""

from __future__ import annotations

from kafka_iceberg.resources import LAKE_KEYS, ResourceKeys
from kafka_iceberg.sensors.alerts import make_run_failure_alert_sensor, run_failure_alert_sensor
from kafka_iceberg.sensors.lag import lag_sensor
from kafka_iceberg.sensors.liveness import run_liveness_sensor
from kafka_iceberg.sensors.retention import all_tables_retention_sensor, retention_sensor
from kafka_iceberg.sensors.workers import workers_sensor


def table_sensors(specs, workers: int = 0, keys: ResourceKeys = LAKE_KEYS) -> list:
    """The lag and retention sensors of each declared table (defined by the table's Component instance);
    none with ``workers`` >= 1, where :func:`location_sensors` watches every table. ``keys``: the lake's resource keys."""
    if workers:
        return []
    return [*(lag_sensor(s, keys) for s in specs), *(retention_sensor(s, keys) for s in specs)]


def location_sensors(
    worker_groups=None, worker_jobs=(), keys: ResourceKeys = LAKE_KEYS, location_wide: bool = True
) -> list:
    """The sensors defined once per lake: given ``worker_groups`` (worker -> its tables), the ``lake_workers``
    sensor launching ``worker_jobs`` and the ``lake_retention`` sensor of every table (named by ``keys``,
    :meth:`ResourceKeys.name`); with ``location_wide``, the ones a code location has once: run-failure
    alerts (posted by the Slack resource of ``keys``) and run liveness."""
    workers = []
    if worker_groups:
        every = [s for group in worker_groups.values() for s in group]
        workers = [workers_sensor(worker_groups, list(worker_jobs), keys), all_tables_retention_sensor(every, keys)]
    if not location_wide:
        return workers
    alerts = run_failure_alert_sensor if keys == LAKE_KEYS else make_run_failure_alert_sensor(keys=keys)
    return [*workers, alerts, run_liveness_sensor]


def all_sensors(specs, worker_groups=None, worker_jobs=()) -> list:
    """The sensors of the code location for the declared tables (see the two functions above)."""
    return [*table_sensors(specs, len(worker_groups or {})), *location_sensors(worker_groups, worker_jobs)]
