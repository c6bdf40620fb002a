"""Relaunch backoff read from the Dagster instance: a table or worker whose runs keep failing is relaunched
after 30 s, 60 s, 120 s ... (at most 900 s; :func:`kafka_iceberg.ops.episodes.relaunch_backoff_s`), not
on every sensor tick. Used where the sensors launch runs: ``lake_workers`` (sensors/workers.py) and the
per-table lag sensors (sensors/lag.py)."""

from __future__ import annotations

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from kafka_iceberg.lake_assets.vocabulary import IN_PROGRESS
from kafka_iceberg.ops.episodes import FAILED_TABLES_TAG, relaunch_wait_s

RUNS_READ = 8
"""Latest runs read per decision: enough to count the failures that reach the cap (6)."""


def relaunch_hold_s(
    instance: DagsterInstance, now_s: float, job_name: str | None = None, tags: dict[str, str] | None = None
) -> float:
    """Seconds the next run of ``job_name`` (or of the runs with ``tags``) must still wait (0: launch now).

    Reads the latest :data:`RUNS_READ` runs (newest first) that succeeded, failed or are in progress: one in
    progress (a hand-over to its successor) or a newest success means no wait; otherwise the consecutive
    failures and the newest one's end time (seconds since epoch) give the wait
    (:func:`kafka_iceberg.ops.episodes.relaunch_wait_s`). ``now_s``: seconds since epoch. Canceled runs
    do not count; a worker run that failed because tables failed (tagged
    :data:`kafka_iceberg.ops.episodes.FAILED_TABLES_TAG`) served, and counts as a success here (its tables
    are retried by the next run, at its budget's pace). Raises what the instance raises.
    """
    statuses = [DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, *IN_PROGRESS]
    records = instance.get_run_records(
        filters=RunsFilter(job_name=job_name, tags=tags, statuses=statuses), limit=RUNS_READ
    )
    if records and records[0].dagster_run.status in IN_PROGRESS:
        return 0.0
    finished = [
        (r.dagster_run.status == DagsterRunStatus.SUCCESS or FAILED_TABLES_TAG in r.dagster_run.tags, r.end_time)
        for r in records
        if r.dagster_run.status not in IN_PROGRESS
    ]
    return relaunch_wait_s(finished, now_s)


__all__ = ["RUNS_READ", "relaunch_hold_s"]
