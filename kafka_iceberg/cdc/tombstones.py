"""Tombstones of an upsert table: the source position of each deleted key, so that a change older than
the delete, read in a later micro-batch, does not bring the key back (docs/cdc.md).

A deleted key leaves no row in the upsert table, so its position is kept in a sibling Iceberg table,
``<namespace>.<table>_cdc_tombstones`` (the key columns, :data:`~kafka_iceberg.cdc.changes.POSITION` and
``deleted_at``), one row per key, created at the first delete. :func:`record_deletes` merges a micro-batch's
deletes into it **before** the batch's own merge is published: positions only grow, so a tombstone written by
an attempt that then crashes only refuses changes older than a delete that the rerun applies anyway.
Tombstones older than :data:`TOMBSTONE_RETENTION_S` are pruned by the ``expire_snapshots`` maintenance job
(:func:`prune`), which also expires the tombstone table's snapshots; ``compact`` compacts it.
"""

from __future__ import annotations

import uuid

from pyspark.sql import DataFrame

from kafka_iceberg.cdc.changes import DELETE, POSITION, POSITION_TYPE, key_match, quote_ident, sql_string

SUFFIX = "_cdc_tombstones"
"""The tombstone table of ``<catalog>.<ns>.<table>`` is ``<catalog>.<ns>.<table>`` + this suffix."""
DELETED_AT = "deleted_at"
"""Column of the tombstone table: when the delete was recorded (timestamp, UTC)."""
TOMBSTONE_RETENTION_S = 7 * 24 * 3600.0
"""How long a tombstone is kept (seconds): Kafka's default ``retention.ms``. A change older than a delete
that arrives later than this after the delete was recorded inserts its key again."""
TABLE_PROPERTIES = {
    "format-version": "2",
    "write.merge.mode": "copy-on-write",
    "write.delete.mode": "copy-on-write",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "20",
}
"""Properties of a tombstone table: small, rewritten in place (no delete files to read at every micro-batch)."""


def tombstone_table(table: str) -> str:
    """The tombstone table of upsert table ``table`` (``<catalog>.<ns>.<table>``), same form."""
    return table + SUFFIX


def exists(spark, table: str) -> bool:
    """Whether the tombstone table of ``table`` exists (a catalog call)."""
    return bool(spark.catalog.tableExists(tombstone_table(table)))


def positions(spark, table: str, key_columns: list[str]) -> DataFrame | None:
    """The tombstones of ``table``: its key columns and :data:`POSITION` per deleted key (lazy), or None
    when no delete was ever recorded."""
    if not exists(spark, table):
        return None
    keys = ", ".join(quote_ident(k) for k in key_columns)
    return spark.sql(f"SELECT {keys}, {quote_ident(POSITION)} FROM {tombstone_table(table)}")


def ensure_table(spark, table: str, key_columns: list[str]) -> str:
    """Create the tombstone table of ``table`` when missing, its key columns typed as in ``table``;
    returns its name."""
    name = tombstone_table(table)
    fields = {f.name: f for f in spark.table(table).schema.fields}
    cols = ", ".join(f"{quote_ident(k)} {fields[k].dataType.simpleString()} NOT NULL" for k in key_columns)
    props = ", ".join(f"{sql_string(k)}={sql_string(v)}" for k, v in TABLE_PROPERTIES.items())
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {name} ({cols}, {quote_ident(POSITION)} {POSITION_TYPE}, "
        f"{DELETED_AT} timestamp) USING iceberg TBLPROPERTIES ({props})"
    )
    return name


def record_deletes(
    spark, table: str, changes: DataFrame, key_columns: list[str], newer: str, create: bool = True
) -> int:
    """Merge the deletes of ``changes`` (reduced changes with :data:`POSITION` and :data:`DELETE`) into the
    tombstone table of ``table``: a key's tombstone moves only to a newer position (SQL ``newer``, over
    ``s.`` the delete and ``t.`` the tombstone) and is created when missing. ``create=False``: the caller
    knows the tombstone table exists (no DDL). Commits on the tombstone table's ``main`` (one snapshot),
    nothing when there is no delete. Returns the deletes seen (records).

    Raises:
        Any Spark / Iceberg error of the merge, unchanged (the micro-batch then fails unpublished).
    """
    deletes = changes.where(DELETE).select(*[quote_ident(k) for k in key_columns], quote_ident(POSITION)).persist()
    try:
        n = deletes.count()
        if n == 0:
            return 0
        name = ensure_table(spark, table, key_columns) if create else tombstone_table(table)
        view = f"cdc_deletes_{uuid.uuid4().hex}"
        deletes.createOrReplaceTempView(view)
        on = key_match(key_columns, "t", "s")
        names = ", ".join(quote_ident(c) for c in [*key_columns, POSITION])
        values = ", ".join(f"s.{quote_ident(c)}" for c in [*key_columns, POSITION])
        pos = quote_ident(POSITION)
        try:
            spark.sql(
                f"MERGE INTO {name} t USING {view} s ON {on} "
                f"WHEN MATCHED AND ({newer}) THEN UPDATE SET t.{pos} = s.{pos}, t.{DELETED_AT} = current_timestamp() "
                f"WHEN NOT MATCHED THEN INSERT ({names}, {DELETED_AT}) VALUES ({values}, current_timestamp())"
            )
        finally:
            spark.catalog.dropTempView(view)
        return n
    finally:
        deletes.unpersist()


def prune(spark, table: str, older_than_s: float = TOMBSTONE_RETENTION_S) -> int:
    """Delete the tombstones of ``table`` recorded more than ``older_than_s`` seconds ago. Returns the
    tombstones left (records); 0 when there is no tombstone table."""
    if not exists(spark, table):
        return 0
    name = tombstone_table(table)
    spark.sql(f"DELETE FROM {name} WHERE {DELETED_AT} < current_timestamp() - INTERVAL {int(older_than_s)} SECONDS")
    return int(spark.table(name).count())
