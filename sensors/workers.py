"""The ``lake_workers`` sensor: one sensor watches every table and launches the worker runs that serve them.

Per tick it looks at the tables of the workers with no run in progress, and at the tables whose last
observation is :data:`OBSERVE_EVERY_S` old: the watermarks of every partition of their topics in one
batched call (:meth:`kafka_iceberg.kafka.admin.KafkaMetadata.watermarks_many`) and their committed
offsets from their snapshot summaries. Each of those tables gets an ``AssetObservation`` (offset lag in
records, seconds since its last commit, whether its topic exists, whether it is due) only when its state
(topic exists, due) changed or as a heartbeat :data:`OBSERVE_EVERY_S` after its last one
(:func:`should_observe`; the cursor keeps when each table was observed and in which state), so a healthy
table adds at most 6 observations an hour. A worker whose tables include one that
is due (offset lag at or above ``lag.max_offset_lag``, or any lag and no commit for ``lag.max_interval``;
or a maintenance job or full-scan check whose cron ticked since its last run, :mod:`kafka_iceberg.ops.rota`,
so an idle table is still maintained and checked) and that has no run in progress, or one whose budget ends within :data:`HANDOVER_S` (its successor),
gets a run of its job (:mod:`kafka_iceberg.lake_assets.worker`), unless its latest runs failed (not
merely set tables aside): then it waits 30 s, 60 s, ... up to 900 s after the last failure
(:func:`kafka_iceberg.sensors.backoff.relaunch_hold_s`). A busy worker's tables are read only for the
heartbeat: its run reports its commits as materializations. A table looked at with lag and no commit for
longer than ``lag.max_interval + lag.grace`` is ``STOP``: one ERROR to Slack when it enters, one OK when it
leaves (:func:`report_stops`).
"""

from __future__ import annotations

import json
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
from kafka_iceberg.catalog.tables import load_table, table_state
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.vocabulary import IN_PROGRESS, WORKER_TAG, run_budget_s, table_key, worker_job_name
from kafka_iceberg.ops.lag import LagEvaluation
from kafka_iceberg.ops.rota import rota_for
from kafka_iceberg.resources import LAKE_KEYS, ResourceKeys
from kafka_iceberg.sensors.backoff import relaunch_hold_s
from kafka_iceberg.sensors.lag import alert_lag_status

OBSERVE_EVERY_S = 600
"""Seconds between two lag observations of one table whose state does not change (the heartbeat)."""


def should_observe(seen: list | None, exists: bool, due: bool, now_ms: int) -> bool:
    """Whether a table gets an observation now: never observed, its state changed (``seen``: the cursor's
    [ms since epoch, topic existed, was due]), or its last observation is :data:`OBSERVE_EVERY_S` old."""
    if seen is None or len(seen) < 3 or [bool(seen[1]), bool(seen[2])] != [exists, due]:
        return True
    return now_ms - seen[0] >= OBSERVE_EVERY_S * 1000


def is_due(spec: TableSpec, lag: int, last_commit_ms: int | None, now_ms: int) -> bool:
    """Whether ``spec`` should ingest now: offset lag (records) at or above its threshold, or any lag
    and no commit for its ``lag.max_interval`` (``last_commit_ms``, ``now_ms``: ms since epoch)."""
    if lag >= spec.lag.max_offset_lag:
        return True
    return lag > 0 and (last_commit_ms is None or now_ms - last_commit_ms >= spec.lag.max_interval_s * 1000)


def workers_sensor(
    groups: dict[int, list[TableSpec]],
    jobs: list[JobDefinition],
    keys: ResourceKeys = LAKE_KEYS,
    crons: dict[str, dict[str, str]] | None = None,
):
    """The one sensor of every table in worker mode; ``groups``: worker -> its tables; ``jobs``: their jobs;
    ``crons``: identifier -> job kind -> cron (UTC), the spread crons the worker jobs run by (None: none)."""
    specs = [s for group in groups.values() for s in group]
    worker_of = {s.identifier: k for k, group in groups.items() for s in group}
    job_of = {k: keys.name(worker_job_name(k)) for k in groups}  # the lake's worker jobs (another lake's: prefixed)
    interval = int(min((s.lag.interval_s for s in specs), default=30))

    @sensor(
        name=keys.name("lake_workers"),
        required_resource_keys=keys.required("kafka", "catalog"),
        minimum_interval_seconds=max(1, interval),
        jobs=jobs,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Lag of all {len(specs)} tables in one tick; launches worker runs ({len(groups)} workers).",
    )
    def _tick(context: SensorEvaluationContext, **_by_key):  # a direct call also passes the resources by key
        kafka, catalog = keys.of(context, "kafka", "catalog")
        now_ms = int(time.time() * 1000)
        cursor = json.loads(context.cursor) if context.cursor else {}
        busy = _busy_workers(context, job_of, now_ms / 1000)
        looked = [s for s in specs if worker_of[s.identifier] not in busy or _stale(cursor, s, now_ms)]
        marks = kafka.metadata().watermarks_many(sorted({s.topic for s in looked})) if looked else {}
        pycatalog = catalog.load() if looked else None
        tables = {s.identifier: load_table(pycatalog, s.identifier) for s in looked}
        states = {identifier: table_state(table) for identifier, table in tables.items()}
        chores = rota_for(tables, crons or {}).due(now_ms)  # a maintenance job or full check whose cron ticked
        lags = offset_lags(looked, marks, {k: v.offsets for k, v in states.items()})
        events, due_workers = [], {}
        for spec in looked:
            last, lag = states[spec.identifier].snapshot_timestamp_ms, lags[spec.identifier]
            exists, due = marks.get(spec.topic) is not None, is_due(spec, lag, last, now_ms)
            if should_observe(cursor.get(spec.identifier), exists, due, now_ms):
                cursor[spec.identifier] = [now_ms, exists, due]
                events.append(_observation(spec, lag, last, exists, due, now_ms))
            if worker_of[spec.identifier] not in busy and (due or spec.identifier in chores):
                due_workers.setdefault(worker_of[spec.identifier], []).append(spec.identifier)
        report_stops(
            cursor, [(s, lags[s.identifier], states[s.identifier].snapshot_timestamp_ms) for s in looked], now_ms
        )
        held = {k for k in due_workers if relaunch_hold_s(context.instance, now_ms / 1000, job_of[k]) > 0}
        requests = [_run_request(k, job_of[k], due, now_ms) for k, due in sorted(due_workers.items()) if k not in held]
        context.log.info(
            f"lake_workers: {len(specs)} tables, {len(looked)} looked at, {len(events)} observed, "
            f"due per idle worker {due_workers}, busy {sorted(busy)}, held back after failed runs {sorted(held)}"
        )
        return SensorResult(run_requests=requests, asset_events=events, cursor=json.dumps(cursor))

    return _tick


HANDOVER_S = 45
"""Seconds before a worker run's budget ends that its successor is launched: the successor starts its
process and Spark session (the job's ``warm`` op, outside the pool) while the run still serves, and
the run hands over as soon as the successor's ``serve`` op waits for the pool."""


STOPPED = "stopped"
"""The cursor key of the tables in status ``STOP`` (no table identifier lacks a dot, so none collides)."""


def report_stops(cursor: dict, looked: list[tuple[TableSpec, int, int | None]], now_ms: int, sink=None) -> list[str]:
    """Judge ``STOP`` for each looked-at ``(spec, offset lag in records, last commit in ms since epoch or
    None)``: lag above 0 and no commit for longer than ``lag.max_interval + lag.grace``. A table entering
    STOP posts one ERROR, one leaving it posts OK (:func:`kafka_iceberg.sensors.lag.alert_lag_status`, to
    ``sink``, default Slack from the environment); ``cursor[STOPPED]`` keeps the stopped tables between
    ticks. A table that never committed is not judged. Returns the identifiers whose status changed."""
    stopped, changed = set(cursor.get(STOPPED, [])), []
    for spec, lag, last_ms in looked:
        waited_s = None if last_ms is None else (now_ms - last_ms) / 1000
        limit_s = spec.lag.max_interval_s + spec.lag.grace_s
        now_stopped = lag > 0 and waited_s is not None and waited_s > limit_s
        if now_stopped == (spec.identifier in stopped):
            continue
        stopped ^= {spec.identifier}
        changed.append(spec.identifier)
        status, previous = ("STOP", "OK") if now_stopped else ("OK", "STOP")
        reason = (
            f"no commit for {waited_s:.0f} s > max_interval + grace = {limit_s:.0f} s"
            if now_stopped
            else "commits again"
        )
        evaluation = LagEvaluation(status, previous, reason, {-1: lag}, {}, waited_s)  # the total only (key -1)
        alert_lag_status(spec, evaluation, sink, source="sensor lake_workers")
    cursor[STOPPED] = sorted(stopped)
    return changed


def _stale(cursor: dict, spec: TableSpec, now_ms: int) -> bool:
    """Whether ``spec``'s last observation (``cursor``: identifier -> [ms since epoch, topic exists]) is
    :data:`OBSERVE_EVERY_S` old, or missing."""
    seen = cursor.get(spec.identifier)
    return seen is None or now_ms - seen[0] >= OBSERVE_EVERY_S * 1000


def _observation(
    spec: TableSpec, lag: int, last_commit_ms: int | None, exists: bool, due: bool, now_ms: int
) -> AssetObservation:
    """The lag observation of one table: offset lag (records), seconds since its last commit (-1: none),
    whether its topic exists, whether it is due (:func:`is_due`)."""
    since = round((now_ms - last_commit_ms) / 1000, 1) if last_commit_ms else -1.0
    return AssetObservation(
        asset_key=table_key(spec),
        metadata={
            "offset_lag": MetadataValue.int(lag),
            "seconds_since_commit": MetadataValue.float(since),
            "topic_exists": MetadataValue.bool(exists),
            "due": MetadataValue.bool(due),
        },
    )


def _run_request(worker: int, job_name: str, due: list[str], now_ms: int) -> RunRequest:
    """The run of worker ``worker``'s job ``job_name``, tagged with (up to five of) the due tables that triggered it."""
    return RunRequest(
        run_key=f"{job_name}:{now_ms}",
        job_name=job_name,
        tags={WORKER_TAG: str(worker), "lake/trigger": f"due: {', '.join(due[:5])}" + (" ..." if len(due) > 5 else "")},
    )


def handover_due(start_times: list[float | None], budget_s: float, now_s: float) -> bool:
    """Whether a worker whose runs in progress started at ``start_times`` (seconds since epoch; None:
    not started yet) may get its successor now: exactly one run, started, whose budget (``budget_s``
    seconds, > 0) ends within :data:`HANDOVER_S` of ``now_s``."""
    if budget_s <= 0 or len(start_times) != 1 or start_times[0] is None:
        return False
    return start_times[0] + budget_s - now_s <= HANDOVER_S


def _busy_workers(context: SensorEvaluationContext, jobs: dict[int, str], now_s: float) -> set[int]:
    """Workers with a run queued or in progress, unless it is time for its successor (:func:`handover_due`,
    under the run's budget: :func:`kafka_iceberg.lake_assets.vocabulary.run_budget_s` of its tags)."""
    busy = set()
    for k, job_name in jobs.items():
        flt = RunsFilter(job_name=job_name, statuses=IN_PROGRESS)
        records = context.instance.get_run_records(filters=flt, limit=2)
        budget_s = run_budget_s(records[0].dagster_run.tags) if records else 0.0
        if records and not handover_due([r.start_time for r in records], budget_s, now_s):
            busy.add(k)
    return busy


__all__ = ["HANDOVER_S", "OBSERVE_EVERY_S", "handover_due", "is_due", "should_observe", "workers_sensor"]
