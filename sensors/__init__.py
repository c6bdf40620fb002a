"""Sensors: one consumer-lag sensor per declared table (sensors/lag.py) and the Slack
alert on failed runs (sensors/alerts.py).

Retention-headroom sensors and sensor-launched backfills are tracked in their own issue.
"""

from __future__ import annotations


def all_sensors(specs) -> list:
    """The sensors of the code location for the declared tables."""
    from sensors.alerts import run_failure_alert_sensor
    from sensors.lag import lag_sensor

    return [*(lag_sensor(s) for s in specs), run_failure_alert_sensor]
