"""The composition root of the Dagster code location: the ``KafkaIcebergTables`` Component instances
in the defs folder ``LAKE_DEFS_MODULE`` (default ``kafka_iceberg.defs``), or one instance holding the
tables of the file ``LAKE_TABLES_FILE``. Each instance brings everything its tables need
(:func:`kafka_iceberg.lake_assets.component.lake_definitions`: resources, jobs, sensors, checks, alerts).

Settings are read once (:func:`kafka_iceberg.config.settings.load_settings`: the environment, no
connection); loading the code location opens no catalog and no broker connection, so a catalog or
broker outage leaves the UI and the sensors up (the sensors' ticks report the outage). Only a tables
file with a ``topic_pattern:`` entry lists the broker's topics at load (:func:`topic_lister`); a
reload of the code location lists them again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dagster import Definitions

from kafka_iceberg.config.settings import Settings, load_settings, require_declared_tables
from kafka_iceberg.declaration.spec import TableSpec, load_table_specs
from kafka_iceberg.errors import BrokerUnavailableError
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata
from kafka_iceberg.lake_assets.component import (
    component_specs,
    defs_tree,
    executor,
    ingest_all,
    lake_definitions,
    quiet_components,
)

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


def build_definitions(settings: Settings, specs: list[TableSpec]) -> Definitions:
    """The code location of one ``KafkaIcebergTables`` instance with the tables ``specs``, the default
    resource keys and the environment's connections (code references to ``LAKE_TABLES_FILE``). Opens no
    connection."""
    return lake_definitions(settings, specs, settings.tables_file)


def load_definitions(settings: Settings) -> tuple[Definitions, list[TableSpec]]:
    """The code location and its declared tables: the tables of ``LAKE_TABLES_FILE`` when it is set,
    else the ``KafkaIcebergTables`` instances of the defs folder ``LAKE_DEFS_MODULE`` (default
    ``kafka_iceberg.defs``; each builds everything its tables need).

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
        return tree.build_defs(), specs


__all__ = ["build_definitions", "executor", "ingest_all", "load_definitions", "topic_lister"]

settings = load_settings()
defs, specs = load_definitions(settings)
