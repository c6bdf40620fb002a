"""Dagster-native health and catalog metadata of the table and topic assets.

- :func:`freshness_policy`: the asset's Dagster ``FreshnessPolicy`` (a time window) from the
  table's ``freshness.max_snapshot_age``, so the UI's freshness and health badges work. The
  lag-aware ``freshness`` asset check stays: Dagster's policy counts materializations, the
  check forgives a quiet topic with nothing to ingest.
- :func:`column_schema`: ``dagster/column_schema`` with column docs, from the declaration (at
  definition time) or from the Iceberg table's schema (at each materialization, so columns
  added by schema evolution show up); Kafka metadata columns carry docs of their own.
- :func:`definition_metadata`: ``dagster/table_name``, the column schema, and
  ``dagster/code_references`` to the table's declaration in ``tables.yaml`` and the write path.
- :data:`RETRY_POLICY` and :data:`NOT_RETRYABLE`: micro-batches are safe to retry by design
  (the snapshot summary decides what is read); bad input is not retried.
(The topic asset's observations of its watermarks and ``retention.ms`` are made by the
retention sensor, :func:`kafka_iceberg.sensors.retention.topic_observation`.)
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from dagster import (
    Backoff,
    CodeReferencesMetadataValue,
    FreshnessPolicy,
    Jitter,
    LocalFileCodeReference,
    MetadataValue,
    RetryPolicy,
    TableColumn,
    TableColumnConstraints,
    TableSchema,
)

from kafka_iceberg.declaration.spec import KAFKA_COLUMNS, TableSpec
from kafka_iceberg.errors import ConfigError, DataLossError, MalformedRecordError, OffsetsAheadError, TopicNotFoundError

RETRY_POLICY = RetryPolicy(max_retries=3, delay=15, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS)
"""Up to 3 retries of a failed micro-batch step, after about 15, 30 and 60 s (broker or catalog
unavailable, a commit conflict, a read timeout)."""

NOT_RETRYABLE = (ConfigError, DataLossError, MalformedRecordError, OffsetsAheadError, TopicNotFoundError)
"""Errors a retry cannot fix (bad declaration or records, data loss, a missing topic): the
asset raises them as ``Failure(allow_retries=False)``."""

KAFKA_COLUMN_DOCS = {
    "topic": "Kafka topic the record was read from",
    "partition": "Kafka partition of the record",
    "offset": "Kafka offset of the record in its partition (with the partition, unique per table)",
    "timestamp": "Kafka record timestamp (CreateTime or LogAppendTime), UTC",
    "key": "Kafka record key, raw bytes",
    "headers": "Kafka record headers: key and raw value",
}
_ICEBERG_DOCS = {column: KAFKA_COLUMN_DOCS[declared] for declared, (column, _) in KAFKA_COLUMNS.items()}


def freshness_policy(spec: TableSpec) -> FreshnessPolicy:
    """A time-window policy failing when no materialization happened within
    ``freshness.max_snapshot_age`` (seconds), warning at half of it. Dagster's windows are at
    least a minute: shorter ages are raised to one minute (and have no warn window)."""
    fail = timedelta(seconds=max(60.0, spec.freshness.max_snapshot_age_s))
    warn = fail / 2 if fail / 2 >= timedelta(minutes=1) else None
    return FreshnessPolicy.time_window(fail_window=fail, warn_window=warn)


def column_schema(spec: TableSpec, iceberg_fields=None):
    """The table's columns with types, nullability and docs (a ``TableSchemaMetadataValue``).

    ``iceberg_fields``: pyiceberg ``NestedField`` s of the live table (name, field_type,
    required, doc); ``None``: the declared columns plus the kept Kafka columns."""
    docs = {c.name: c.doc for c in spec.columns if c.doc} | _ICEBERG_DOCS
    if iceberg_fields is None:
        rows = [(name, typ.lower(), required) for name, typ, required in spec.table_columns()]
    else:
        rows = [(f.name, str(f.field_type), bool(f.required)) for f in iceberg_fields]
    return MetadataValue.table_schema(
        TableSchema(
            columns=[
                TableColumn(
                    name=name,
                    type=typ,
                    description=docs.get(name),
                    constraints=TableColumnConstraints(nullable=not req),
                )
                for name, typ, req in rows
            ]
        )
    )


def declaration_line(tables_file: Path, spec: TableSpec) -> int | None:
    """The 1-based line of ``name: <spec.name>`` in ``tables_file``, or ``None``."""
    try:
        lines = tables_file.read_text().splitlines()
    except OSError:
        return None
    for number, line in enumerate(lines, start=1):
        text = line.strip().lstrip("-").strip()
        if text.startswith("name:") and text.split(":", 1)[1].strip().strip("'\"") == spec.name:
            return number
    return None


def definition_metadata(spec: TableSpec, tables_file: Path | None, catalog_name: str = "lake") -> dict[str, object]:
    """Definition metadata of the table asset (see the module docstring)."""
    refs = []
    if tables_file is not None:
        refs.append(
            LocalFileCodeReference(
                file_path=str(Path(tables_file).resolve()),
                line_number=declaration_line(Path(tables_file), spec),
                label=f"declaration of {spec.name}",
            )
        )
    refs.append(LocalFileCodeReference(file_path=str(Path(__file__).with_name("tables.py")), label="asset definition"))
    return {
        "dagster/table_name": f"{catalog_name}.{spec.identifier}",
        "dagster/column_schema": column_schema(spec),
        "dagster/code_references": CodeReferencesMetadataValue(code_references=refs),
    }


__all__ = [
    "KAFKA_COLUMN_DOCS",
    "NOT_RETRYABLE",
    "RETRY_POLICY",
    "column_schema",
    "declaration_line",
    "definition_metadata",
    "freshness_policy",
]
