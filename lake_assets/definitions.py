"""The Dagster code location: one asset and two checks per declared table, one downstream asset."""

from __future__ import annotations

import os

from dagster import AssetSelection, Definitions, define_asset_job, in_process_executor, multiprocess_executor

import schedules
import sensors
from kafka_iceberg.settings import load_settings
from kafka_iceberg.spec import load_table_specs
from lake_assets.analytics import hourly_departure_delay
from lake_assets.quality import quarantine_check
from lake_assets.replay import replay_job
from lake_assets.tables import table_asset, table_checks, topic_asset
from resources import default_resources

settings = load_settings()
specs = load_table_specs(settings.tables_file)


def _executor():
    # SQLite admits one committing process: run steps in one process (and one Spark session).
    # With a PostgreSQL catalog, LAKE_DAGSTER_EXECUTOR=multiprocess or k8s runs tables in parallel.
    choice = os.environ.get("LAKE_DAGSTER_EXECUTOR", "in_process")
    if choice == "multiprocess":
        return multiprocess_executor
    if choice == "k8s":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor
    return in_process_executor


ingest_all = define_asset_job(
    "ingest_all",
    selection=AssetSelection.groups("lake", "analytics"),
    description="One micro-batch of every table, then the downstream assets, then all checks.",
)

defs = Definitions(
    assets=[
        *(topic_asset(s) for s in specs),
        *(table_asset(s, sqlite_catalog=settings.catalog.is_sqlite) for s in specs),
        hourly_departure_delay,
    ],
    asset_checks=[*(c for s in specs for c in table_checks(s)), *(quarantine_check(s) for s in specs)],
    jobs=[ingest_all, replay_job(sqlite_catalog=settings.catalog.is_sqlite)],
    sensors=sensors.all_sensors(specs),
    schedules=schedules.all_schedules(specs, sqlite_catalog=settings.catalog.is_sqlite),
    resources=default_resources(settings),
    executor=_executor(),
)
