"""Sensors, each defined once per lake (a ``KafkaIcebergTables`` instance, names prefixed by its resource
keys' prefix unless it is ``lake_``): ``lake_workers`` (the lag of every table, launching the
worker runs that serve them, sensors/workers.py), ``lake_retention`` (retention headroom of every table,
sensors/retention.py), the Slack alert on failed runs (sensors/alerts.py) and the run-liveness sensor
(sensors/liveness.py), the last two once per code location. All start RUNNING, so a deployed location ingests with nobody clicking.

:func:`kafka_iceberg.sensors.lag.lag_sensor` (one table: lag status alerts, and one-micro-batch runs or a
backfill of them) and :func:`kafka_iceberg.sensors.retention.retention_sensor` are not in the location;
a location of its own may add them.
"""

from __future__ import annotations

from kafka_iceberg.resources import LAKE_KEYS, ResourceKeys
from kafka_iceberg.sensors.alerts import make_run_failure_alert_sensor, run_failure_alert_sensor
from kafka_iceberg.sensors.liveness import run_liveness_sensor
from kafka_iceberg.sensors.retention import all_tables_retention_sensor
from kafka_iceberg.sensors.workers import workers_sensor


def location_sensors(
    worker_groups=None, worker_jobs=(), keys: ResourceKeys = LAKE_KEYS, location_wide: bool = True, crons=None
) -> list:
    """The sensors of one lake: given ``worker_groups`` (worker -> its tables), the ``lake_workers`` sensor
    launching ``worker_jobs`` (also for a job of ``crons`` due, identifier -> kind -> cron) and the ``lake_retention`` sensor of every table (named by ``keys``,
    :meth:`ResourceKeys.name`); with ``location_wide``, the ones a code location has once: run-failure
    alerts (posted by the Slack resource of ``keys``) and run liveness."""
    workers = []
    if worker_groups:
        every = [s for group in worker_groups.values() for s in group]
        workers = [
            workers_sensor(worker_groups, list(worker_jobs), keys, crons),
            all_tables_retention_sensor(every, keys),
        ]
    if not location_wide:
        return workers
    alerts = run_failure_alert_sensor if keys == LAKE_KEYS else make_run_failure_alert_sensor(keys=keys)
    return [*workers, alerts, run_liveness_sensor]
