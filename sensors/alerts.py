"""Dagster glue for Slack alerts (the alert itself lives in :mod:`kafka_iceberg.ops.alerts`).

- :data:`run_failure_alert_sensor`: a ``run_failure_sensor`` that posts one alert per failed
  run of this code location, naming the job, the run id, the assets whose steps failed, the
  error's first line, and linking to ``<DAGSTER_UI_URL>/runs/<run id>`` (and to the first
  failed asset's page). It is RUNNING by default: without ``SLACK_BOT_TOKEN`` it only logs.
- :func:`alert_on_check`: what the asset checks call; posts when a check failed
  (re-exported from :mod:`kafka_iceberg.ops.alerts`, where ``lake_assets`` should import it from
  to avoid importing the ``sensors`` package from ``lake_assets``).

No ``from __future__ import annotations`` here: Dagster inspects the annotations of
decorated functions.
"""

import logging
from collections.abc import Callable

from dagster import (
    AssetKey,
    DagsterEventType,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunFailureSensorContext,
    RunStatusSensorContext,
    RunStatusSensorDefinition,
    SensorDefinition,
)

from kafka_iceberg.ops.alerts import Alert, AlertSink, alert_on_check, pick_measure
from kafka_iceberg.resources import LAKE_KEYS, ResourceKeys

log = logging.getLogger(__name__)

_IMPLICIT_ASSET_JOB = "__ASSET_JOB"


def _first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def _root_error_line(error) -> str:
    """First line of the innermost cause of a ``SerializableErrorInfo`` (the user's exception)."""
    line = ""
    seen = 0
    while error is not None and seen < 20:
        line = _first_line(error.message) or line
        error = error.cause
        seen += 1
    return line


def _identifier(key: AssetKey) -> str:
    # kafka_iceberg.lake_assets.tables.table_key: lake/<namespace>/<table> <-> <namespace>.<table>
    path = key.path
    return ".".join(path[1:]) if len(path) > 1 and path[0] == "lake" else "/".join(path)


def run_failure_alert(context: RunFailureSensorContext) -> Alert:
    """The :class:`Alert` for the failed run of ``context``.

    Reads the run's ``ASSET_MATERIALIZATION_PLANNED``, ``ASSET_MATERIALIZATION`` and
    ``STEP_FAILURE`` events to tell which assets failed (their step failed) from those that
    were merely not materialized (skipped downstream). The asset set is the run's
    ``asset_selection`` when it has one (a subset materialization) and otherwise the planned
    assets (a whole asset job such as ``ingest_all`` has an empty selection).

    Returns an ERROR alert with ``measure`` ``run_status`` = ``FAILURE``, ``table`` the
    identifiers of the failed tables (``lake/nyc/flights`` -> ``nyc.flights``; the job
    when no asset failed), ``asset_key_path`` the first failed asset, ``run_id`` set, and
    ``extra`` lines ``job``, ``failed assets``, ``not materialized``, ``error``. Event-log
    lookups that fail degrade the alert (logged); they never raise.
    """
    run = context.dagster_run
    job = run.job_name
    job_label = "ad-hoc asset materialization" if job == _IMPLICIT_ASSET_JOB else job
    failed_keys: list = []
    unmaterialized: list = []
    error_line = ""
    try:
        failed_keys, unmaterialized, error_line = _failed_assets(context)
    except Exception as e:  # noqa: BLE001 - degrade the alert, never fail the sensor
        log.warning("could not read the event log of run %s: %s", run.run_id, e)
    if not error_line:
        failure = context.failure_event
        data = failure.event_specific_data
        error_line = _root_error_line(getattr(data, "error", None)) or _first_line(failure.message) or "unknown error"

    failed_keys.sort(key=lambda k: k.path)
    tables = ", ".join(_identifier(k) for k in failed_keys)
    extra = {"job": job_label}
    if failed_keys:
        extra["failed assets"] = ", ".join(k.to_user_string() for k in failed_keys)
    if unmaterialized:
        extra["not materialized"] = ", ".join(k.to_user_string() for k in unmaterialized)
    extra["error"] = error_line
    return Alert(
        table=tables or f"job {job_label}",
        asset_key_path=list(failed_keys[0].path) if failed_keys else [],
        measure="run_status",
        value="FAILURE",
        severity="ERROR",
        summary=f"run {run.run_id} of job {job_label} failed: {error_line}",
        source="run failure",
        run_id=run.run_id,
        extra=extra,
    )


def _failed_assets(context: RunFailureSensorContext) -> tuple[list, list, str]:
    """(asset keys whose step failed, asset keys not materialized, the first step error line) of the
    failed run, from its event log (see :func:`run_failure_alert`). Raises what the event log raises."""
    run, instance = context.dagster_run, context.instance
    planned: dict = {}
    for rec in instance.get_records_for_run(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION_PLANNED).records:
        ev = rec.event_log_entry.dagster_event
        if ev is not None and ev.asset_key is not None:
            planned.setdefault(ev.step_key, []).append(ev.asset_key)
    materialized = {
        rec.event_log_entry.dagster_event.asset_key
        for rec in instance.get_records_for_run(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION).records
        if rec.event_log_entry.dagster_event is not None
    }
    selection = set(run.asset_selection or ()) or {k for keys in planned.values() for k in keys}
    step_failures = context.get_step_failure_events()
    failed_keys: list = []
    error_line = ""
    for ev in step_failures:
        for key in planned.get(ev.step_key, []):
            if key in selection and key not in failed_keys:
                failed_keys.append(key)
        if not error_line and ev.event_specific_data is not None:
            error_line = _root_error_line(getattr(ev.event_specific_data, "error", None))
    unmaterialized = sorted(
        (k for k in selection if k not in materialized and k not in failed_keys), key=lambda k: k.path
    )
    if not failed_keys and not step_failures:
        # the run failed outside any step (launch, resource init): every asset is suspect
        failed_keys, unmaterialized = unmaterialized, []
    return failed_keys, unmaterialized, error_line


def make_run_failure_alert_sensor(
    name: str = "run_failure_alert_sensor",
    sink_factory: Callable[[], AlertSink] | None = None,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
    keys: ResourceKeys = LAKE_KEYS,
) -> SensorDefinition:
    """A ``run_failure_sensor`` that posts :func:`run_failure_alert` for each failed run.

    Args:
        name: the sensor's name.
        sink_factory: builds the :class:`AlertSink` at each evaluation (default: the ``slack``
            resource's, :class:`kafka_iceberg.resources.slack.LakeSlackResource`).
        default_status: RUNNING by default, so alerts work without a click in the UI.
        keys: the lake's resource keys (the Slack resource is ``keys.key("slack")``).

    Monitors the jobs of its own code location (``ingest_all`` and UI materializations).
    A failed post is logged; the sensor tick still succeeds and the run is not revisited.
    """

    def _run_failure_alert(context: RunStatusSensorContext, **_by_key):  # a direct call also passes them by key
        (slack,) = keys.of(context, "slack")
        failure = context.for_run_failure()  # what @run_failure_sensor passes; it takes no resource keys
        sink = sink_factory() if sink_factory else slack.sink()
        alert = run_failure_alert(failure)
        if sink.send(alert):
            failure.log.info(f"posted a Slack alert for failed run {alert.run_id} to {sink.channel}")

    return RunStatusSensorDefinition(
        name=name,
        run_status=DagsterRunStatus.FAILURE,
        run_status_sensor_fn=_run_failure_alert,
        default_status=default_status,
        description="Posts one Slack alert per failed run (job, run id, failed assets, error, run link). "
        "Without SLACK_BOT_TOKEN the alert is only logged.",
        required_resource_keys=keys.required("slack"),
    )


run_failure_alert_sensor = make_run_failure_alert_sensor()


__all__ = [
    "alert_on_check",
    "make_run_failure_alert_sensor",
    "pick_measure",
    "run_failure_alert",
    "run_failure_alert_sensor",
]
