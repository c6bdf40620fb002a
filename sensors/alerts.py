"""Dagster glue for Slack alerts on failed runs, one per failure episode (the alert itself lives in
:mod:`kafka_iceberg.ops.alerts`, the episodes in :mod:`kafka_iceberg.ops.episodes`).

- :data:`run_failure_alert_sensor`: every :data:`INTERVAL_S` seconds it reads the runs that failed or
  succeeded since its cursor (the ``RUN_FAILURE`` and ``RUN_SUCCESS`` events of the instance, in
  storage-id order) and folds them into the open failure episodes kept in its cursor
  (:func:`kafka_iceberg.ops.episodes.advance`). The subject of a failure is each table whose step failed
  (``lake/nyc/flights`` -> ``nyc.flights``) or that a worker run set aside (its ``lake/failed_tables`` tag),
  else the job (``job lake_worker_0``).
  An episode posts twice: at its first failed run (naming the job, the run id, the failed assets, the
  error's first line, linking to ``<DAGSTER_UI_URL>/runs/<run id>`` and the first failed asset's page),
  and when it recovers, an ``OK`` with the count of failed runs in between. A table recovers with its
  first commit (``ASSET_MATERIALIZATION``) after its latest failure; a job with its next successful run.
  RUNNING by default: without ``SLACK_BOT_TOKEN`` it only logs.
- :func:`alert_on_check`: what the asset checks call; posts when a check failed
  (re-exported from :mod:`kafka_iceberg.ops.alerts`, where ``lake_assets`` should import it from
  to avoid importing the ``sensors`` package from ``lake_assets``).

No ``from __future__ import annotations`` here: Dagster inspects the annotations of
decorated functions.
"""

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    DefaultSensorStatus,
    RunStatusChangeRecordsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from kafka_iceberg.ops.alerts import Alert, AlertSink, alert_on_check, pick_measure
from kafka_iceberg.ops.episodes import FAILED_TABLES_TAG, EpisodeBook, Notice, Outcome, advance, dumps
from kafka_iceberg.resources import LAKE_KEYS, ResourceKeys

log = logging.getLogger(__name__)

_IMPLICIT_ASSET_JOB = "__ASSET_JOB"
INTERVAL_S = 30
"""Seconds between two evaluations of the run-failure alert sensor."""
FIRST_LOOKBACK_S = 600
"""Seconds of run history the sensor's first evaluation (no cursor yet) reads."""
BATCH = 200
"""Run status changes (failures, successes) read per evaluation, each; the rest wait for the next one."""


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


def _job_label(job: str) -> str:
    return "ad-hoc asset materialization" if job == _IMPLICIT_ASSET_JOB else job


def run_failure_alert(instance: DagsterInstance, run, failure_event) -> Alert:
    """The :class:`Alert` for a failed run (``run``: its ``DagsterRun``; ``failure_event``: its
    ``RUN_FAILURE`` ``DagsterEvent``), read from ``instance``.

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
    return _run_failure(instance, run, failure_event)[0]


def _run_failure(instance: DagsterInstance, run, failure_event) -> tuple[Alert, list]:
    """(:func:`run_failure_alert`, the asset keys whose step failed, sorted)."""
    job_label = _job_label(run.job_name)
    failed_keys: list = []
    unmaterialized: list = []
    error_line = ""
    try:
        failed_keys, unmaterialized, error_line = _failed_assets(instance, run)
    except Exception as e:  # noqa: BLE001 - degrade the alert, never fail the sensor
        log.warning("could not read the event log of run %s: %s", run.run_id, e)
    if not error_line and failure_event is not None:
        data = failure_event.event_specific_data
        error_line = _root_error_line(getattr(data, "error", None)) or _first_line(failure_event.message)
    error_line = error_line or "unknown error"
    failed_keys.sort(key=lambda k: k.path)
    tables = ", ".join(_identifier(k) for k in failed_keys)
    extra = {"job": job_label}
    if failed_keys:
        extra["failed assets"] = ", ".join(k.to_user_string() for k in failed_keys)
    if unmaterialized:
        extra["not materialized"] = ", ".join(k.to_user_string() for k in unmaterialized)
    extra["error"] = error_line
    alert = Alert(
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
    return alert, failed_keys


def _failed_assets(instance: DagsterInstance, run) -> tuple[list, list, str]:
    """(asset keys whose step failed, asset keys not materialized, the first step error line) of the
    failed run, from its event log (see :func:`run_failure_alert`). Raises what the event log raises."""
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
    step_failures = [
        rec.event_log_entry.dagster_event
        for rec in instance.get_records_for_run(run.run_id, of_type=DagsterEventType.STEP_FAILURE).records
        if rec.event_log_entry.dagster_event is not None
    ]
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


# --- episodes: what the runs since the cursor mean, and what to post ---------------------------


def _status_changes(instance: DagsterInstance, cursor: dict, now_s: float) -> tuple[list, list, dict, int | None]:
    """The ``RUN_FAILURE`` and ``RUN_SUCCESS`` event records after the cursor's storage ids (while it has
    none: those of the last :data:`FIRST_LOOKBACK_S` seconds), at most :data:`BATCH` of each, cut at a
    common storage id so that none is skipped; the cursor's new storage ids; that cut (``None``: none)."""
    found, more = {}, []
    for name, kind in (("failure", DagsterEventType.RUN_FAILURE), ("success", DagsterEventType.RUN_SUCCESS)):
        after = cursor.get(name)
        flt = RunStatusChangeRecordsFilter(
            kind, after_storage_id=after, after_timestamp=None if after is not None else now_s - FIRST_LOOKBACK_S
        )
        result = instance.fetch_run_status_changes(flt, limit=BATCH, ascending=True)
        found[name] = list(result.records)
        if result.has_more and found[name]:
            more.append(found[name][-1].storage_id)
    bound = min(more) if more else None
    new_cursor = {}
    for name, records in found.items():
        if bound is not None:
            records[:] = [r for r in records if r.storage_id <= bound]
        new_cursor[name] = records[-1].storage_id if records else cursor.get(name)
    return found["failure"], found["success"], new_cursor, bound


def _failure_outcomes(instance: DagsterInstance, record) -> list[Outcome]:
    """One failure per failed table of the run of ``record`` (a ``RUN_FAILURE`` event record): its failed
    asset steps, or the tables a worker run tagged (:data:`kafka_iceberg.ops.episodes.FAILED_TABLES_TAG`);
    else one for its job. Each carries the run's alert as its detail."""
    run = instance.get_run_by_id(record.event_log_entry.run_id)
    if run is None:
        return []
    alert, failed_keys = _run_failure(instance, run, record.event_log_entry.dagster_event)
    at_ms = int(record.timestamp * 1000)
    tagged = sorted(t for t in run.tags.get(FAILED_TABLES_TAG, "").split(",") if t)  # a worker run's set aside
    if tagged and not failed_keys:
        failed_keys = [AssetKey(["lake", *t.split(".")]) for t in tagged]
        alert = dataclasses.replace(alert, table=", ".join(tagged), asset_key_path=list(failed_keys[0].path))
    subjects = [(_identifier(k), tuple(k.path)) for k in failed_keys] or [(f"job {_job_label(run.job_name)}", ())]
    return [Outcome(s, False, record.storage_id, at_ms, run.run_id, path, alert) for s, path in subjects]


def _success_outcomes(instance: DagsterInstance, record) -> list[Outcome]:
    """The successes of a ``RUN_SUCCESS`` event record's run: its job, and the tables it selected."""
    run = instance.get_run_by_id(record.event_log_entry.run_id)
    if run is None:
        return []
    at_ms = int(record.timestamp * 1000)
    subjects = [(f"job {_job_label(run.job_name)}", ())]
    subjects += [(_identifier(k), tuple(k.path)) for k in sorted(run.asset_selection or (), key=lambda k: k.path)]
    return [Outcome(s, True, record.storage_id, at_ms, run.run_id, p, "run") for s, p in subjects]


def _commit_outcomes(instance: DagsterInstance, book: EpisodeBook, failures: list[Outcome], bound: int | None) -> list:
    """For each table with an open episode or a failure now: its first commit (materialization) after its
    latest failure (and up to storage id ``bound``, unless ``None``), as a success."""
    latest: dict[str, tuple[int, tuple]] = {s: (e.last_position, e.key_path) for s, e in book.open.items()}
    for o in failures:
        latest[o.subject] = (max(o.position, latest.get(o.subject, (0, ()))[0]), o.key_path)
    out = []
    for subject, (after, path) in sorted(latest.items()):
        if not path:
            continue
        flt = AssetRecordsFilter(
            asset_key=AssetKey(list(path)),
            after_storage_id=after,
            before_storage_id=None if bound is None else bound + 1,
        )
        for rec in instance.fetch_materializations(flt, limit=1, ascending=True).records:
            out.append(Outcome(subject, True, rec.storage_id, int(rec.timestamp * 1000), rec.run_id, path, "commit"))
    return out


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def notice_alerts(notices: list[Notice]) -> list[Alert]:
    """The alerts to post for ``notices`` (:func:`kafka_iceberg.ops.episodes.advance`): one per failed run
    that started episodes (the run's alert, naming the subjects whose episode it starts), one ``OK`` per
    recovery with the count of failed runs and when the episode started."""
    alerts: list[Alert] = []
    started: dict[str, list[Notice]] = {}
    for n in notices:
        if n.kind == "started":
            started.setdefault(n.outcome.run_id or "", []).append(n)
            continue
        ep, how = n.episode, "a commit" if n.outcome.detail == "commit" else "a successful run"
        alerts.append(
            Alert(
                table=ep.subject,
                asset_key_path=list(ep.key_path),
                measure="run_status",
                value=f"RECOVERED after {ep.failures} failed run(s)",
                severity="OK",
                summary=f"{ep.subject} recovered with {how} (run {n.outcome.run_id}): {ep.failures} failed run(s) "
                f"since {_utc(ep.started_ms)}, the first {ep.first_run_id}",
                source="run failure",
                run_id=n.outcome.run_id,
            )
        )
    for group in started.values():
        first: Alert = group[0].outcome.detail
        extra = dict(first.extra)
        extra["episode"] = (
            f"first failed run of {', '.join(n.episode.subject for n in group)}; "
            "further failed runs are counted, the recovery is posted"
        )
        alerts.append(dataclasses.replace(first, extra=extra))
    return alerts


def evaluate(instance: DagsterInstance, cursor_text: str | None, now_s: float) -> tuple[str, list[Alert]]:
    """One evaluation of the sensor: the new cursor text and the alerts to post (see the module docstring).

    ``cursor_text``: the previous cursor (JSON: ``failure`` and ``success`` storage ids, ``open`` episodes;
    ``None`` for the first evaluation); ``now_s``: seconds since epoch. Raises what the instance raises.
    """
    cursor = json.loads(cursor_text) if cursor_text else {}
    book = EpisodeBook.from_json(cursor.get("open"))
    failed, succeeded, new_cursor, bound = _status_changes(instance, cursor, now_s)
    failures = [o for rec in failed for o in _failure_outcomes(instance, rec)]
    if not failures and not book.open:  # nothing can recover: the successes need not be read
        return dumps({**new_cursor, "open": {}}), []
    outcomes = failures + [o for rec in succeeded for o in _success_outcomes(instance, rec)]
    outcomes += _commit_outcomes(instance, book, failures, bound)
    book, notices = advance(book, outcomes)
    return dumps({**new_cursor, "open": book.to_json()}), notice_alerts(notices)


def make_run_failure_alert_sensor(
    name: str = "run_failure_alert_sensor",
    sink_factory: Callable[[], AlertSink] | None = None,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
    keys: ResourceKeys = LAKE_KEYS,
) -> SensorDefinition:
    """The sensor that posts failed runs to Slack once per failure episode (see the module docstring).

    Args:
        name: the sensor's name.
        sink_factory: builds the :class:`AlertSink` at each evaluation (default: the Slack
            resource's, :class:`kafka_iceberg.resources.slack.LakeSlackResource`).
        default_status: RUNNING by default, so alerts work without a click in the UI.
        keys: the lake's resource keys (the Slack resource is ``keys.key("slack")``).

    Watches the runs of the Dagster instance. A failed post is logged; the tick still succeeds and
    the episode is not posted again.
    """

    @sensor(
        name=name,
        minimum_interval_seconds=INTERVAL_S,
        default_status=default_status,
        description="Posts a failed run to Slack once per failure episode of a table or job (job, run id, "
        "failed assets, error, run link), and its recovery with the count of failed runs. "
        "Without SLACK_BOT_TOKEN the alert is only logged.",
        required_resource_keys=keys.required("slack"),
    )
    def _run_failure_alert(context: SensorEvaluationContext, **_by_key):  # a direct call also passes them by key
        (slack,) = keys.of(context, "slack")
        cursor, alerts = evaluate(context.instance, context.cursor, time.time())
        sink = sink_factory() if sink_factory else slack.sink()
        for alert in alerts:
            if sink.send(alert):
                context.log.info(f"posted a Slack alert ({alert.severity} {alert.table}) to {sink.channel}")
        return SensorResult(cursor=cursor)

    return _run_failure_alert


run_failure_alert_sensor = make_run_failure_alert_sensor()


__all__ = [
    "alert_on_check",
    "evaluate",
    "make_run_failure_alert_sensor",
    "notice_alerts",
    "pick_measure",
    "run_failure_alert",
    "run_failure_alert_sensor",
]
