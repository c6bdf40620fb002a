"""Dagster jobs and schedules around :mod:`kafka_iceberg.ops.maintenance` (thin).

The crons come from :func:`kafka_iceberg.ops.spread.maintenance_crons` (spread over time). Every
maintenance run is tagged ``lake/maintenance: <kind>``; dagster.yaml's run-queue limit on that tag
(:data:`MAINTENANCE_TAG`, 2) bounds how many run at once, and the op runs in the table's pool
(:func:`kafka_iceberg.lake_assets.vocabulary.table_pool`), so it never commits alongside the
table's micro-batch (on SQLite, alongside any commit).
"""

import dataclasses
from collections.abc import Sequence

from dagster import (
    AssetObservation,
    DefaultScheduleStatus,
    OpExecutionContext,
    ScheduleDefinition,
    job,
    op,
)

from kafka_iceberg.batch.context import Lake
from kafka_iceberg.catalog.tables import load_table, metadata_view
from kafka_iceberg.config.run_pods import run_pod_tags
from kafka_iceberg.config.settings import load_settings
from kafka_iceberg.declaration.groups import group_of
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.vocabulary import RUN_RETRY_TAGS, table_key, table_pool
from kafka_iceberg.ops.rota import KINDS, record_run, run_job
from kafka_iceberg.ops.spread import maintenance_crons
from kafka_iceberg.resources import LAKE_KEYS, ResourceKeys

MAINTENANCE_TAG = "lake/maintenance"
"""Run tag of every scheduled maintenance run (value: the job kind); dagster.yaml's
``concurrency.runs.tag_concurrency_limits`` bounds the runs carrying it (all kinds together)."""


def _group_lake(spark, catalog, spec: TableSpec) -> Lake | None:
    """The connections a consistency group member's compaction completes its group with (None for other
    tables): ``spark``, the process's settings with ``catalog``'s (a catalog resource) and its catalog."""
    if group_of(spec) is None:
        return None
    return Lake(spark, dataclasses.replace(load_settings(), catalog=catalog.catalog_settings()), None, catalog.load())


def _maintenance_job(
    spec: TableSpec, kind: str, sqlite_catalog: bool, keys: ResourceKeys = LAKE_KEYS, members: Sequence[str] = ()
):
    @op(
        name=f"{kind}_{spec.name}_op",
        pool=table_pool(spec, sqlite_catalog),
        required_resource_keys=keys.required("pyspark", "catalog"),
    )
    def _op(context: OpExecutionContext):
        pyspark, catalog = keys.of(context, "pyspark", "catalog")
        result = run_job(
            pyspark.spark_session,
            catalog.name,
            spec,
            kind,
            lambda: metadata_view(load_table(catalog.load(), spec.identifier)),
            lake=_group_lake(pyspark.spark_session, catalog, spec),
            members=members,
        )
        context.log.info(
            f"{spec.identifier} {result.procedure}: files {result.files_before} -> {result.files_after}, "
            f"bytes {result.bytes_before} -> {result.bytes_after}, "
            f"delete files {result.delete_files_before} -> {result.delete_files_after}"
        )
        context.log_event(AssetObservation(asset_key=table_key(spec), metadata=result.as_metadata()))
        record_run(catalog.load(), spec.identifier, kind)  # a worker that takes the table over knows it ran

    @job(
        name=f"{kind}_{spec.name}",
        description=f"{kind.replace('_', ' ')} on {spec.identifier}",
        tags={"lake/table": spec.identifier, MAINTENANCE_TAG: kind, **RUN_RETRY_TAGS, **run_pod_tags()},
    )
    def _job():
        _op()

    return _job


def maintenance_schedules(
    spec: TableSpec,
    sqlite_catalog: bool,
    crons: dict[str, str] | None = None,
    keys: ResourceKeys = LAKE_KEYS,
    members: Sequence[str] = (),
) -> list[ScheduleDefinition]:
    """The table's three maintenance schedules (running by default, UTC). ``crons``: job kind -> cron,
    from :func:`kafka_iceberg.ops.spread.maintenance_crons` over all the location's tables (default:
    spread among this table alone); ``keys``: the lake's resource keys; ``members``: the identifiers of
    the table's consistency group (its compaction first completes the group: :func:`~kafka_iceberg.ops.rota.run_job`)."""
    crons = crons or maintenance_crons([spec])[spec.identifier]
    return [
        ScheduleDefinition(
            name=f"{kind}_{spec.name}_schedule",
            job=_maintenance_job(spec, kind, sqlite_catalog, keys, members),
            cron_schedule=crons[kind],
            execution_timezone="UTC",
            default_status=DefaultScheduleStatus.RUNNING,
        )
        for kind in KINDS
    ]
