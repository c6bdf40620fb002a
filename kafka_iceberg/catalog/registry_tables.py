"""Tables declared with ``schema: from_registry``: created from their value subject's latest schema."""

from __future__ import annotations

import logging

from kafka_iceberg.catalog.tables import create_table, qualified, table_ddl
from kafka_iceberg.config.settings import Settings
from kafka_iceberg.declaration.format_spec import KEY_PARSED
from kafka_iceberg.declaration.spec import KAFKA_COLUMNS, TableSpec
from kafka_iceberg.formats import table_schema_from_subject
from kafka_iceberg.formats.spark import spark_columns

log = logging.getLogger(__name__)
_KAFKA_NAMES = {name for name, _ in KAFKA_COLUMNS.values()} | {KEY_PARSED}


def registry_columns(spec: TableSpec, registry=None) -> list[tuple[str, str, bool]]:
    """The table's columns for ``schema: from_registry``: the latest schema of the topic's value
    subject as (name, Spark SQL type, required), then the kept Kafka metadata columns. ``registry``:
    the credentials (``Settings.registry``; default: the environment's).

    Raises:
        RegistryUnavailableError, SchemaNotFoundError: from the registry.
        UnsupportedSchemaError: the schema has a type with no Iceberg/Spark mapping.
    """

    subject = spec.format.subject(spec.topic)
    cols = spark_columns(table_schema_from_subject(spec.format.url(), subject, registry))
    kafka = [c for c in spec.table_columns() if c[0] in _KAFKA_NAMES]
    return cols + kafka


def ensure_registry_table(spark, settings: Settings, spec: TableSpec) -> None:
    """Create a ``schema: from_registry`` table from its subject's latest schema if it is missing
    (logging the column mapping). An existing table is left as it is: from then on its schema
    changes only by the evolution rules, batch by batch."""
    if spark.catalog.tableExists(qualified(settings, spec)):
        return
    cols = registry_columns(spec, settings.registry)
    log.warning(
        "table %s: created from subject %s: %s",
        spec.identifier,
        spec.format.subject(spec.topic),
        ", ".join(f"{n} {t}{' NOT NULL' if r else ''}" for n, t, r in cols),
    )
    create_table(spark, settings, spec.identifier, table_ddl(settings, spec, cols))
