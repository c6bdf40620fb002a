"""The read phase for Schema Registry formats (``format: avro | protobuf | json_schema``).

Per micro-batch, on the driver: the batch's schema ids are counted (one Spark job over the
persisted raw records), resolved once through the registry (confluent-kafka's client; ids are
immutable, so cached for good), and every writer schema is compared with the table's value
columns (:func:`kafka_iceberg.formats.plan_batch`). Allowed changes (new optional columns,
nested ones too, under ``unknown_fields: evolve``; Iceberg type promotions) are applied to the
table with pyiceberg's ``update_schema`` before the batch is decoded; the records of a schema id
whose change is blocked are quarantined (kind ``schema``) and the change is reported for the
WARN alert. Then the tasks decode the values (:func:`kafka_iceberg.formats.spark.classify_formatted`)
into the shape of :func:`kafka_iceberg.transform.classify`.
"""

from __future__ import annotations

import logging

from kafka_iceberg.batch.context import Lake
from kafka_iceberg.catalog import create_table, qualified, table_ddl
from kafka_iceberg.format_spec import KEY_PARSED
from kafka_iceberg.settings import Settings
from kafka_iceberg.spec import KAFKA_COLUMNS, TableSpec

log = logging.getLogger(__name__)
_KAFKA_NAMES = {name for name, _ in KAFKA_COLUMNS.values()} | {KEY_PARSED}


def value_schema(schema):
    """A pyiceberg ``Schema`` without the Kafka metadata columns (the table's value columns)."""
    from pyiceberg.schema import Schema

    return Schema(*[f for f in schema.fields if f.name not in _KAFKA_NAMES], schema_id=schema.schema_id)


def registry_columns(spec: TableSpec, registry=None) -> list[tuple[str, str, bool]]:
    """The table's columns for ``schema: from_registry``: the latest schema of the topic's value
    subject as (name, Spark SQL type, required), then the kept Kafka metadata columns. ``registry``:
    the credentials (``Settings.registry``; default: the environment's).

    Raises:
        RegistryUnavailableError, SchemaNotFoundError: from the registry.
        UnsupportedSchemaError: the schema has a type with no Iceberg/Spark mapping.
    """
    from kafka_iceberg.formats import table_schema_from_subject
    from kafka_iceberg.formats.spark import spark_columns

    subject = spec.format.subject(spec.topic)
    cols = spark_columns(table_schema_from_subject(spec.format.url(), subject, registry))
    kafka = [c for c in spec.table_columns() if c[0] in _KAFKA_NAMES]
    return cols + kafka


def ensure_registry_table(spark, settings: Settings, spec: TableSpec) -> None:
    """Create a ``schema: from_registry`` table from its subject's latest schema if it is missing
    (logging the column mapping). An existing table is left as it is: from then on its schema
    changes only by the evolution rules, batch by batch."""
    try:
        spark.table(qualified(settings, spec)).schema  # noqa: B018 - exists?
        return
    except Exception as exc:  # noqa: BLE001 - Spark's AnalysisException for a missing table
        if "TABLE_OR_VIEW_NOT_FOUND" not in str(exc) and "not found" not in str(exc).lower():
            raise
    cols = registry_columns(spec, settings.registry)
    log.warning("table %s: created from subject %s: %s", spec.identifier, spec.format.subject(spec.topic),
                ", ".join(f"{n} {t}{' NOT NULL' if r else ''}" for n, t, r in cols))
    create_table(spark, settings, spec.identifier, table_ddl(settings, spec, cols))


def classify_registry(lake: Lake, spec: TableSpec, raw, commit_id: str):
    """Decode and classify ``raw`` (persisted raw records) for a registry format, evolving the
    table first where allowed. Returns ``(classified, schema_changes, records_per_schema_id)``;
    ``schema_changes`` are ``{"column", "type", "change"}`` dicts (``change``: ``evolvable``,
    ``promotion`` or ``blocked``, the latter with ``schema_id`` and ``reason``).

    Raises:
        RegistryUnavailableError: the registry did not answer after retries (nothing is committed).
        ConfigError: the registry URL names an unset environment variable.
    """
    from kafka_iceberg.formats import plan_batch, resolve
    from kafka_iceberg.formats.spark import classify_formatted, schema_id_counts

    counts = schema_id_counts(raw)
    writers = resolve(spec.format.url(), counts, lake.settings.registry)
    table = lake.retry(f"table {spec.identifier}: load the table", lambda: lake.catalog.load_table(spec.identifier))
    plan = plan_batch(value_schema(table.schema()), writers, spec.unknown_fields)
    changes = []
    if plan.apply:
        _evolve(lake, spec, table, plan.apply, commit_id)
        changes += [{"column": c.path, "type": str(c.new_type), "change": c.kind} for c in plan.apply]
        table = lake.retry(f"table {spec.identifier}: reload the table", lambda: lake.catalog.load_table(spec.identifier))
    for sid, (kind, reason) in sorted(plan.refused.items()):
        if kind == "schema":
            log.warning("table %s: %s; its records are quarantined", spec.identifier, reason)
            changes.append({"column": "", "type": "", "change": "blocked", "schema_id": sid, "reason": reason})
    classified = classify_formatted(raw, value_schema(table.schema()), spec.format.type, writers, plan.refused,
                                    spec.bad_records.max_record_bytes)
    return classified, changes, counts


def _evolve(lake: Lake, spec: TableSpec, table, changes, commit_id: str) -> None:
    """Apply the allowed ``changes`` in one schema update (a metadata-only commit on the table)."""
    from kafka_iceberg.formats.evolution import Evolution, apply

    for c in changes:
        log.warning("table %s: schema evolved in run %s: %s", spec.identifier, commit_id, c.reason)
    lake.retry(f"table {spec.identifier}: evolve the schema", lambda: apply(table, Evolution(tuple(changes))))
