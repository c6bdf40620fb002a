"""The composition root of the Dagster code location: the tables of the ``KafkaIcebergTables``
Component instances in the defs folder ``LAKE_DEFS_MODULE`` (default ``kafka_iceberg.defs``; or of the file
``LAKE_TABLES_FILE``), with what a location has once: the demo's downstream asset and ``ingest_all``
(when the demo's tables are declared), the replay job, the shared sensors, resources and executor.

With :mod:`kafka_iceberg.lake_assets.component` (the per-table definitions), the only module that
imports :mod:`sensors` and :mod:`schedules`; they take their shared names from
:mod:`kafka_iceberg.lake_assets.vocabulary`, never from an asset module. Settings are read once
(:func:`kafka_iceberg.config.settings.load_settings`: the environment, no connection) and the resources
built once from them; loading the code location opens no catalog and no broker connection, so a
catalog or broker outage leaves the UI and the sensors up (the sensors' ticks report the outage).
Only a tables file with a ``topic_pattern:`` entry lists the broker's topics at load
(:func:`topic_lister`); a reload of the code location lists them again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from dagster import (
    AssetSelection,
    Definitions,
    ExecutorDefinition,
    define_asset_job,
    in_process_executor,
    multiprocess_executor,
)

from kafka_iceberg import sensors
from kafka_iceberg.batch.worker import assign_workers, worker_count
from kafka_iceberg.config.settings import Settings, load_settings, require_declared_tables
from kafka_iceberg.declaration.spec import TableSpec, load_table_specs
from kafka_iceberg.errors import BrokerUnavailableError
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata
from kafka_iceberg.lake_assets.analytics import KEY as DOWNSTREAM_KEY
from kafka_iceberg.lake_assets.analytics import SOURCE_TABLES, hourly_departure_delay_asset, refresh_sensor
from kafka_iceberg.lake_assets.component import component_specs, defs_tree, quiet_components, table_definitions
from kafka_iceberg.lake_assets.liveness import liveness_executor
from kafka_iceberg.lake_assets.replay import replay_job
from kafka_iceberg.lake_assets.worker import worker_job
from kafka_iceberg.ops.spread import maintenance_crons
from kafka_iceberg.resources import default_resources

log = logging.getLogger(__name__)

TOPIC_LISTING_TIMEOUT_S = 10.0
"""At most this long (seconds; less when ``LAKE_KAFKA_TIMEOUT_S`` is less) the load waits for the topic list."""


def topic_lister(settings: Settings) -> Callable[[], list[str] | None]:
    """The topic listing for the declaration's ``topic_pattern:`` entries, called once when the code
    location loads and only when a pattern is declared. A broker that does not answer gives None:
    the location loads without the tables of topic patterns and logs a warning saying so; the next
    reload of the code location ("Reload definitions") lists the topics again."""

    def list_topics() -> list[str] | None:
        try:
            meta = KafkaMetadata(KafkaConfig.from_settings(settings))
            return meta.list_topics(timeout_s=min(TOPIC_LISTING_TIMEOUT_S, settings.kafka_timeout_s))
        except BrokerUnavailableError as exc:
            log.warning(
                "tables from topic patterns are not loaded (no tables from any topic_pattern entry of %s): %s. "
                "Reload the code location once the broker answers.",
                settings.tables_file,
                exc,
            )
            return None

    return list_topics


def executor(settings: Settings) -> ExecutorDefinition:
    """The executor of every job, from ``LAKE_DAGSTER_EXECUTOR``: ``in_process`` (default; SQLite
    admits one committing process, so steps share one process and one Spark session), or with a
    PostgreSQL catalog ``multiprocess`` or ``k8s`` (dagster-k8s) to run tables in parallel. Each
    tags its runs with their worker's liveness and reaps dead runs (:mod:`kafka_iceberg.lake_assets.liveness`)."""
    if settings.dagster_executor == "multiprocess":
        return liveness_executor(multiprocess_executor)
    if settings.dagster_executor == "k8s":
        from dagster_k8s import k8s_job_executor

        return liveness_executor(k8s_job_executor)
    return liveness_executor(in_process_executor)


ingest_all = define_asset_job(
    "ingest_all",
    selection=AssetSelection.groups("lake", "analytics"),
    description="One micro-batch of every table, then the downstream assets, then all checks.",
)


def location_definitions(settings: Settings, specs: list[TableSpec]) -> Definitions:
    """The definitions a code location has once, whatever Component instances declare its tables
    ``specs``: the resources, the executor, the replay job, the run-failure and run-liveness sensors,
    the worker jobs (:func:`kafka_iceberg.batch.worker.worker_count`) and the sensors that watch every table, the demo's
    downstream asset (with the sensor that refreshes it) and ``ingest_all`` when ``specs`` declare the
    demo's source tables (:data:`kafka_iceberg.lake_assets.analytics.SOURCE_TABLES`). Opens no connection."""
    sqlite = settings.catalog.is_sqlite
    demo = SOURCE_TABLES <= {s.identifier for s in specs}
    workers = worker_count(len(specs), sqlite, os.cpu_count(), settings.stream.workers)
    groups = assign_workers(specs, workers) if specs else {}
    crons = maintenance_crons(specs)  # spread over every table, as the schedules would be
    workers_jobs = [worker_job(k, group, sqlite, crons) for k, group in groups.items() if group]
    return Definitions(
        assets=[hourly_departure_delay_asset(sqlite_catalog=sqlite)] if demo else [],
        jobs=[*([ingest_all] if demo else []), replay_job(sqlite_catalog=sqlite), *workers_jobs],
        sensors=[
            *sensors.location_sensors(groups, workers_jobs),
            *([refresh_sensor([DOWNSTREAM_KEY])] if demo else []),
        ],
        resources=default_resources(settings),
        executor=executor(settings),
    )


def build_definitions(settings: Settings, specs: list[TableSpec]) -> Definitions:
    """The code location's definitions for the declared tables ``specs`` (the per-table definitions of
    :func:`kafka_iceberg.lake_assets.component.table_definitions` and the per-location ones, with code
    references to ``LAKE_TABLES_FILE``). Opens no connection."""
    return Definitions.merge(
        table_definitions(settings, specs, settings.tables_file), location_definitions(settings, specs)
    )


def load_definitions(settings: Settings) -> tuple[Definitions, list[TableSpec]]:
    """The code location and its declared tables: the tables of ``LAKE_TABLES_FILE`` when it is set,
    else the ``KafkaIcebergTables`` instances of the defs folder ``LAKE_DEFS_MODULE`` (default
    ``kafka_iceberg.defs``; each builds its tables' definitions), merged with the per-location definitions.

    Raises:
        ConfigError: a declaration is invalid, two instances declare the same table, or the defs
            folder cannot be imported, or no tables are declared outside ``LAKE_DEV``.
    """
    require_declared_tables(settings)
    if settings.tables_file is not None:
        specs = load_table_specs(settings.tables_file, topic_lister(settings))
        return build_definitions(settings, specs), specs
    tree = defs_tree(settings.defs_module)
    specs = component_specs(tree)
    with quiet_components():
        tables = tree.build_defs()
    return Definitions.merge(tables, location_definitions(settings, specs)), specs


settings = load_settings()
defs, specs = load_definitions(settings)
