"""The read phase for Schema Registry formats (``format: avro | protobuf | json_schema``).

Per micro-batch, on the driver: the batch's schema ids are counted (one Spark job over the
persisted raw records), resolved once through the registry (confluent-kafka's client; ids are
immutable, so cached for good), and every writer schema is compared with the table's value
columns (:func:`kafka_iceberg.formats.plan_batch`). Allowed changes (new optional columns,
nested ones too, under ``unknown_fields: evolve``; Iceberg type promotions) are applied to the
table with pyiceberg's ``update_schema`` before the batch is decoded; the records of a schema id
whose change is blocked are quarantined (kind ``schema``) and the change is reported for the
WARN alert. Then the tasks decode the values (:func:`kafka_iceberg.formats.spark.classify_formatted`)
into the shape of :func:`kafka_iceberg.formats.transform.classify`.
"""

from __future__ import annotations

import logging

from kafka_iceberg.batch.context import Lake
from kafka_iceberg.declaration.format_spec import KEY_PARSED
from kafka_iceberg.declaration.spec import KAFKA_COLUMNS, TableSpec
from kafka_iceberg.formats import plan_batch, resolve
from kafka_iceberg.formats.evolution import Evolution, apply
from kafka_iceberg.formats.spark import classify_formatted, schema_id_counts

log = logging.getLogger(__name__)
_KAFKA_NAMES = {name for name, _ in KAFKA_COLUMNS.values()} | {KEY_PARSED}


def value_schema(schema):
    """A pyiceberg ``Schema`` without the Kafka metadata columns (the table's value columns)."""
    from pyiceberg.schema import Schema

    return Schema(*[f for f in schema.fields if f.name not in _KAFKA_NAMES], schema_id=schema.schema_id)


def classify_registry(lake: Lake, spec: TableSpec, raw, commit_id: str):
    """Decode and classify ``raw`` (persisted raw records) for a registry format, evolving the
    table first where allowed. Returns ``(classified, schema_changes, records_per_schema_id)``;
    ``schema_changes`` are ``{"column", "type", "change"}`` dicts (``change``: ``evolvable``,
    ``promotion`` or ``blocked``, the latter with ``schema_id`` and ``reason``).

    Raises:
        RegistryUnavailableError: the registry did not answer after retries (nothing is committed).
        ConfigError: the registry URL names an unset environment variable.
    """

    counts = schema_id_counts(raw)
    writers = resolve(spec.format.url(), counts, lake.settings.registry)
    table = lake.retry(f"table {spec.identifier}: load the table", lambda: lake.catalog.load_table(spec.identifier))
    plan = plan_batch(value_schema(table.schema()), writers, spec.unknown_fields)
    changes = []
    if plan.apply:
        _evolve(lake, spec, table, plan.apply, commit_id)
        changes += [{"column": c.path, "type": str(c.new_type), "change": c.kind} for c in plan.apply]
        table = lake.retry(
            f"table {spec.identifier}: reload the table", lambda: lake.catalog.load_table(spec.identifier)
        )
    for sid, (kind, reason) in sorted(plan.refused.items()):
        if kind == "schema":
            log.warning("table %s: %s; its records are quarantined", spec.identifier, reason)
            changes.append({"column": "", "type": "", "change": "blocked", "schema_id": sid, "reason": reason})
    classified = classify_formatted(
        raw, value_schema(table.schema()), spec.format.type, writers, plan.refused, spec.bad_records.max_record_bytes
    )
    return classified, changes, counts


def _evolve(lake: Lake, spec: TableSpec, table, changes, commit_id: str) -> None:
    """Apply the allowed ``changes`` in one schema update (a metadata-only commit on the table)."""

    for c in changes:
        log.warning("table %s: schema evolved in run %s: %s", spec.identifier, commit_id, c.reason)
    lake.retry(f"table {spec.identifier}: evolve the schema", lambda: apply(table, Evolution(tuple(changes))))
