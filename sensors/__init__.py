"""Sensors, each defined once per code location: ``lake_workers`` (the lag of every table, launching the
worker runs that serve them, sensors/workers.py), ``lake_retention`` (retention headroom of every table,
sensors/retention.py), the Slack alert on failed runs (sensors/alerts.py) and the run-liveness sensor
(sensors/liveness.py). All start RUNNING, so a deployed location ingests with nobody clicking.

:func:`kafka_iceberg.sensors.lag.lag_sensor` (one table: lag status alerts, and one-micro-batch runs or a
backfill of them) and :func:`kafka_iceberg.sensors.retention.retention_sensor` are not in the location;
a location of its own may add them.
"""

from __future__ import annotations

from kafka_iceberg.sensors.alerts import run_failure_alert_sensor
from kafka_iceberg.sensors.liveness import run_liveness_sensor
from kafka_iceberg.sensors.retention import all_tables_retention_sensor
from kafka_iceberg.sensors.workers import workers_sensor


def location_sensors(worker_groups=None, worker_jobs=()) -> list:
    """The sensors of a code location: run-failure alerts, run liveness, and, given ``worker_groups``
    (worker -> its tables), the ``lake_workers`` sensor launching ``worker_jobs`` and the ``lake_retention``
    sensor of every table."""
    workers = []
    if worker_groups:
        every = [s for group in worker_groups.values() for s in group]
        workers = [workers_sensor(worker_groups, list(worker_jobs)), all_tables_retention_sensor(every)]
    return [*workers, run_failure_alert_sensor, run_liveness_sensor]
