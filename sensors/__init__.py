"""Sensors: per declared table a consumer-lag sensor (sensors/lag.py, which also launches
backfills of micro-batches, lake_assets/backfill.py) and a retention-headroom sensor
(sensors/retention.py); the Slack alert on failed runs (sensors/alerts.py); the run-liveness sensor
(sensors/liveness.py).
"""

from __future__ import annotations

from kafka_iceberg.sensors.alerts import run_failure_alert_sensor
from kafka_iceberg.sensors.lag import lag_sensor
from kafka_iceberg.sensors.liveness import run_liveness_sensor
from kafka_iceberg.sensors.retention import retention_sensor


def table_sensors(specs) -> list:
    """The lag and retention sensors of each declared table (defined by the table's Component instance)."""
    return [*(lag_sensor(s) for s in specs), *(retention_sensor(s) for s in specs)]


def location_sensors() -> list:
    """The sensors defined once per code location, whatever its tables: run-failure alerts, run liveness."""
    return [run_failure_alert_sensor, run_liveness_sensor]


def all_sensors(specs) -> list:
    """The sensors of the code location for the declared tables."""
    return [*table_sensors(specs), *location_sensors()]
