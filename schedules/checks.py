"""The scheduled full-scan ``duplicate_free`` check of each table (thin).

After a run that committed, the ``duplicate_free`` asset check reads only the rows that run
added (:mod:`kafka_iceberg.ops.incremental_check`). What that cannot see (the rows of a run that
crashed before its check, a table rewritten outside the write path) the full scan finds: the
job ``duplicate_free_full_<name>`` runs the same asset check in a run of its own, which commits
nothing, so :func:`kafka_iceberg.ops.checks.duplicate_free` scans the whole table. Its schedule runs
daily by default (``maintenance.full_check``, cron in UTC).
"""

from __future__ import annotations

from dagster import AssetCheckKey, AssetSelection, DefaultScheduleStatus, ScheduleDefinition, define_asset_job

from kafka_iceberg.config.run_pods import run_pod_tags
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.vocabulary import RUN_RETRY_TAGS, table_key
from kafka_iceberg.ops.spread import maintenance_crons

CHECK_NAME = "duplicate_free"


def full_check_job_name(spec: TableSpec) -> str:
    """Name of the job that runs ``spec``'s full-scan ``duplicate_free`` check."""
    return f"{CHECK_NAME}_full_{spec.name}"


def full_check_schedule(spec: TableSpec, cron: str | None = None) -> ScheduleDefinition:
    """The schedule (running by default, UTC ``cron``; default ``spec.maintenance.full_check_cron``
    spread by :mod:`kafka_iceberg.ops.spread`) of a job that selects only the table's
    ``duplicate_free`` asset check. Its runs count against the maintenance run limit (``lake/maintenance``)."""
    job = define_asset_job(
        full_check_job_name(spec),
        selection=AssetSelection.checks(AssetCheckKey(table_key(spec), CHECK_NAME)),
        description=f"Full-scan duplicate_free check of {spec.identifier} (every row, every snapshot summary).",
        tags={
            "lake/table": spec.identifier,
            "lake/check": "duplicate_free_full",
            "lake/maintenance": "full_check",
            **RUN_RETRY_TAGS,
            **run_pod_tags(),
        },
    )
    return ScheduleDefinition(
        name=f"{full_check_job_name(spec)}_schedule",
        job=job,
        cron_schedule=cron or maintenance_crons([spec])[spec.identifier]["full_check"],
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.RUNNING,
    )
