"""Schema evolution in the read phase (``unknown_fields: evolve``) and the value columns of a
table as Spark's catalog sees them."""

from __future__ import annotations

import logging

from kafka_iceberg.batch.context import Lake
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.formats.transform import new_fields, value_columns

log = logging.getLogger(__name__)


def table_value_columns(lake: Lake, identifier: str):
    """The value columns (``ValueColumn``) of table ``identifier`` from Spark's catalog (retried
    while the catalog is unavailable).

    Raises:
        CatalogUnavailableError: the catalog did not answer within ``catalog_retry_s`` (60 s; ``LAKE_DEV_HOOKS``).
    """
    qualified = f"{lake.catalog_name}.{identifier}"
    return lake.retry(
        f"table {identifier}: read the table schema", lambda: value_columns(lake.spark.table(qualified).schema)
    )


def evolve_schema(lake: Lake, spec: TableSpec, raw, commit_id: str) -> list[dict]:
    """Schema evolution (``unknown_fields: evolve``): add an optional column for every new
    top-level field of a primitive type in this batch (``ALTER TABLE ... ADD COLUMN``), before the
    batch is written. Fields that cannot be added stay unknown and their records are
    quarantined. Returns the columns added as ``{"column", "type"}``."""
    fields = new_fields(lake.spark, raw, table_value_columns(lake, spec.identifier))
    added = []
    for f in fields:
        if f.type is None:
            log.warning(
                "table %s: new field %r is not added: %s; its records are quarantined",
                spec.identifier,
                f.name,
                f.why_not,
            )
            continue
        comment = f"added by schema evolution from topic {spec.topic} in run {commit_id}".replace("'", "")
        sql = (
            f"ALTER TABLE {lake.catalog_name}.{spec.identifier} ADD COLUMN `{f.name}` {f.type.upper()} "
            f"COMMENT '{comment}'"
        )

        def exists(name=f.name):
            return True if any(c.name == name for c in table_value_columns(lake, spec.identifier)) else None

        if exists() is None:
            lake.sql(f"table {spec.identifier}: add column {f.name}", sql, before_retry=exists)
        log.warning("table %s: schema evolved: added optional column %s %s", spec.identifier, f.name, f.type)
        added.append({"column": f.name, "type": f.type})
    return added
