"""The commit of an upsert table: ``MERGE INTO`` the attempt branch, with the offsets on the snapshot.

:func:`merge_changes` takes the reduced changes of :func:`kafka_iceberg.cdc.changes.reduce_changes` (one
row per key, :data:`~kafka_iceberg.cdc.changes.DELETE` marking deletes), keeps those newer than the
table's row of their key by source position (:data:`~kafka_iceberg.cdc.changes.POSITION`, a column of
the table) and merges them into ``<catalog>.<db>.<table>.branch_<attempt>`` of a format-version 2
merge-on-read table, so
updates and deletes write position delete files (deletion vectors on format version 3), never
equality deletes. The snapshot's summary carries the batch's Kafka offsets, through Iceberg's
``CommitMetadata.withCommitProperties`` (``spark.sql.iceberg.snapshot-property.*`` is ignored by
MERGE; ``spark.wap.branch`` is never used: without ``write.wap.enabled`` it commits to ``main``).
The write path's conditional ``fast_forward`` then publishes the branch, as for appends.
"""

from __future__ import annotations

import uuid

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kafka_iceberg.cdc import tombstones
from kafka_iceberg.cdc.changes import (
    DELETE,
    POSITION,
    POSITION_TYPE,
    CrossPartitionKeyError,
    key_match,
    quote_ident,
    sql_string,
)
from kafka_iceberg.errors import ConfigError, LakeError

UPSERT_TABLE_PROPERTIES = {
    "format-version": "2",
    "write.merge.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.delete.mode": "merge-on-read",
}
"""Table properties of an upsert table: row-level changes write position delete files."""


def newer_sql(change: str, row: str) -> str:
    """SQL: the change position ``change`` is newer than the row position ``row`` (both
    :data:`~kafka_iceberg.cdc.changes.POSITION` structs). A row without a position (written before
    positions were kept, or absent) is older than any change; an LSN compares with an LSN; without
    LSNs, offsets compare within one partition only. Equal positions are not newer (a re-sent change)."""
    return (
        f"({row} IS NULL OR ({change}.lsn IS NOT NULL AND {row}.lsn IS NOT NULL AND {change}.lsn > {row}.lsn) "
        f"OR ({change}.lsn IS NULL AND {row}.lsn IS NULL AND {change}.`partition` = {row}.`partition` "
        f"AND {change}.`offset` > {row}.`offset`))"
    )


def unorderable_sql(change: str, row: str) -> str:
    """SQL: the order of ``change`` and ``row`` (positions as in :func:`newer_sql`) is unknown: one has
    an LSN and the other not, or neither has one and they come from different partitions."""
    return (
        f"({row} IS NOT NULL AND (({change}.lsn IS NULL) <> ({row}.lsn IS NULL) "
        f"OR ({change}.lsn IS NULL AND {row}.lsn IS NULL AND {change}.`partition` <> {row}.`partition`)))"
    )


def merge_sql(target: str, source_view: str, columns: list[str], key_columns: list[str]) -> str:
    """``MERGE INTO target`` from ``source_view`` (``columns``, :data:`POSITION` among them, plus
    :data:`DELETE`) by ``key_columns``: a matched row is deleted or updated only by a newer change."""
    on = key_match(key_columns, "t", "s")
    sets = ", ".join(f"t.{quote_ident(c)} = s.{quote_ident(c)}" for c in columns if c not in key_columns)
    names = ", ".join(quote_ident(c) for c in columns)
    values = ", ".join(f"s.{quote_ident(c)}" for c in columns)
    newer = newer_sql(f"s.{quote_ident(POSITION)}", f"t.{quote_ident(POSITION)}")
    return (
        f"MERGE INTO {target} t USING {source_view} s ON {on} "
        f"WHEN MATCHED AND s.{DELETE} AND {newer} THEN DELETE "
        f"WHEN MATCHED AND {newer} THEN UPDATE SET {sets} "
        f"WHEN NOT MATCHED AND NOT s.{DELETE} THEN INSERT ({names}) VALUES ({values})"
    )


def ensure_position_column(spark, table: str) -> bool:
    """Add :data:`POSITION` to ``table`` (``<catalog>.<db>.<table>``) when it lacks it: an Iceberg
    schema update adding an optional column, which rows written before read as NULL (older than any
    change). Returns True when this call added it."""
    if POSITION in {f.name for f in spark.table(table).schema.fields}:
        return False
    try:
        spark.sql(
            f"ALTER TABLE {table} ADD COLUMN {quote_ident(POSITION)} {POSITION_TYPE} "
            "COMMENT 'source position of the last applied change: source.lsn, else Kafka partition and offset'"
        )
    except Exception as exc:
        if "already exists" not in str(exc).lower():
            raise
        return False  # another writer added it meanwhile
    return True


def positioned(
    spark,
    target: str,
    changes_df: DataFrame,
    key_columns: list[str],
    read_positions: bool = True,
    deleted: DataFrame | None = None,
):
    """``changes_df`` left-joined with the :data:`POSITION` of ``target``'s rows by key, plus ``_newer``
    (:func:`newer_sql`) and ``_unorderable`` (:func:`unorderable_sql`). ``read_positions=False``
    treats every row as having none (the column was just added). With ``deleted`` (key columns and
    the position of each deleted key, :mod:`kafka_iceberg.cdc.tombstones`) an upsert is newer only when
    it is also newer than its key's tombstone, or cannot be ordered against it. Lazy."""
    keys = ", ".join(quote_ident(k) for k in key_columns)
    pos = quote_ident(POSITION) if read_positions else f"CAST(NULL AS {POSITION_TYPE})"
    current = spark.sql(f"SELECT {keys}, {pos} AS {quote_ident(POSITION)} FROM {target}")
    change, row = f"s.{quote_ident(POSITION)}", f"t.{quote_ident(POSITION)}"
    joined = changes_df.alias("s").join(current.alias("t"), F.expr(key_match(key_columns, "s", "t")), "left")
    newer = newer_sql(change, row)
    if deleted is not None:
        tomb = f"d.{quote_ident(POSITION)}"
        joined = joined.join(deleted.alias("d"), F.expr(key_match(key_columns, "s", "d")), "left")
        newer = f"({newer} AND (s.{DELETE} OR {newer_sql(change, tomb)} OR {unorderable_sql(change, tomb)}))"
    return joined.select(
        "s.*",
        F.expr(newer).alias("_newer"),
        F.expr(unorderable_sql(change, row)).alias("_unorderable"),
        F.expr(row).alias("_row_position"),
    )


def refuse_unorderable(joined: DataFrame, key_columns: list[str], table: str) -> None:
    """Fail when a change of :func:`positioned` cannot be ordered against its row.

    Raises:
        CrossPartitionKeyError: naming up to 5 such keys with both positions.
    """
    bad = joined.where("_unorderable").limit(5).collect()
    if not bad:
        return

    def where(p) -> str:
        return f"lsn {p['lsn']}" if p["lsn"] is not None else f"partition {p['partition']} offset {p['offset']}"

    shown = "; ".join(
        ", ".join(f"{k}={r[k]!r}" for k in key_columns)
        + f" (change at {where(r[POSITION])}, row at {where(r['_row_position'])})"
        for r in bad
    )
    raise CrossPartitionKeyError(
        f"table {table}: the order of the changes of key(s) {shown} and their rows is unknown: without a source "
        "position (source.lsn) offsets order changes within one partition only. Nothing was committed. When every "
        f"change of such a key in the row's partition is applied, clear the rows' position (UPDATE {table} SET "
        f"{POSITION} = NULL WHERE ...) and the next micro-batch applies the change."
    )


def branch_head(spark, table: str, branch: str) -> int | None:
    """The snapshot id ``branch`` of ``table`` (``<catalog>.<db>.<table>``) points at, or None."""
    rows = spark.sql(f"SELECT snapshot_id FROM {table}.refs WHERE name = {sql_string(branch)}").collect()
    return int(rows[0][0]) if rows else None


class _PythonCallable:
    """A ``java.util.concurrent.Callable`` implemented in Python (a py4j callback)."""

    def __init__(self, fn):
        self.fn, self.error = fn, None

    def call(self):
        try:
            self.fn()
        except Exception as exc:  # re-raised on the Python side after Java unwinds
            self.error = exc
            raise
        return None

    class Java:
        implements = ["java.util.concurrent.Callable"]


def with_commit_properties(spark, properties: dict[str, str], fn) -> None:
    """Run ``fn`` (which commits through Spark) with ``properties`` added to the summary of the
    snapshots it commits, via Iceberg's ``CommitMetadata.withCommitProperties`` (a py4j callback;
    ``spark.sql.iceberg.snapshot-property.*`` is ignored by MERGE).

    Raises:
        whatever ``fn`` raised.
    """
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)
    jvm = gateway.jvm
    props = jvm.java.util.HashMap()
    for k, v in properties.items():
        props.put(k, v)
    callable_ = _PythonCallable(fn)
    try:
        jvm.org.apache.iceberg.spark.CommitMetadata.withCommitProperties(
            props, callable_, jvm.java.lang.Class.forName("java.lang.RuntimeException")
        )
    except Exception:
        if callable_.error is not None:
            raise callable_.error from None
        raise


def record_tombstones(spark, table: str, changes_df: DataFrame, key_columns: list[str], create: bool = True) -> int:
    """Record the deletes of ``changes_df`` as tombstones of ``table`` (:func:`tombstones.record_deletes`;
    ``create=False`` when its tombstone table is known to exist): a tombstone moves to a newer delete, or to
    one that cannot be ordered against it. Returns the deletes."""
    pos, tomb = f"s.{quote_ident(POSITION)}", f"t.{quote_ident(POSITION)}"
    newer = f"{newer_sql(pos, tomb)} OR {unorderable_sql(pos, tomb)}"
    return tombstones.record_deletes(spark, table, changes_df, key_columns, newer, create)


def empty_append(spark, table: str, branch: str, rows: DataFrame, summary: dict[str, str]) -> int | None:
    """Append zero rows (``rows`` gives the columns) to ``branch`` of ``table`` as a snapshot whose summary
    carries ``summary``; returns the branch's new head."""
    writer = rows.limit(0).writeTo(f"{table}.branch_{branch}")
    for k, v in summary.items():
        writer = writer.option(f"snapshot-property.{k}", v)
    writer.append()
    return branch_head(spark, table, branch)


def merge_changes(
    spark,
    table: str,
    branch: str,
    changes_df: DataFrame,
    key_columns: list[str],
    summary: dict[str, str],
    expected_rows: int | None = None,
) -> int:
    """Merge reduced changes (:func:`reduce_changes`: one row per key with its :data:`POSITION`,
    :data:`DELETE` marking deletes) into branch ``branch`` of ``table`` (``<catalog>.<db>.<table>``)
    as one snapshot whose summary carries ``summary`` (e.g. the Kafka offsets). Returns the branch's
    new head snapshot id.

    Only changes newer than the branch's row of their key (:func:`newer_sql`) are applied, and the
    row keeps the change's position; an upsert must also be newer than its key's tombstone, and the
    batch's deletes are recorded as tombstones (committed on the tombstone table, before this merge:
    :mod:`kafka_iceberg.cdc.tombstones`); :data:`POSITION` is added to the table first when it lacks it
    (:func:`ensure_position_column`). Updates and deletes write position delete files (the table
    must have the :data:`UPSERT_TABLE_PROPERTIES`). When the merge changes nothing (every change was
    a skipped tombstone, older than its row, or deleted an absent key), a zero-row append to the
    branch carries ``summary`` instead, so the offsets still advance. Idempotent per key state.

    The snapshot's ``added-records`` must equal the changes applied that are not deletes (each is
    inserted or rewritten), or ``expected_rows`` when given (records).

    Raises:
        CrossPartitionKeyError: a change cannot be ordered against its row (:func:`refuse_unorderable`).
        LakeError: the branch does not exist, no snapshot carrying ``summary`` was made, or the
            merge does not reconcile (nothing is published).
    """
    before = branch_head(spark, table, branch)
    if before is None:
        raise LakeError(f"table {table}: branch {branch} does not exist")
    added = ensure_position_column(spark, table)
    target = f"{table}.branch_{branch}"
    deleted = tombstones.positions(spark, table, key_columns)
    joined = positioned(spark, target, changes_df, key_columns, not added, deleted).persist()
    view = f"cdc_changes_{uuid.uuid4().hex}"
    try:
        refuse_unorderable(joined, key_columns, table)
        record_tombstones(spark, table, changes_df, key_columns, create=deleted is None)
        applied = joined.where("_newer").drop("_newer", "_unorderable", "_row_position")
        if expected_rows is None:
            expected_rows = applied.where(f"NOT {DELETE}").count()
        applied.createOrReplaceTempView(view)
        sql = merge_sql(target, view, [c for c in applied.columns if c != DELETE], key_columns)
        with_commit_properties(spark, summary, lambda: spark.sql(sql))
        head = branch_head(spark, table, branch)
        if head == before:  # nothing merged: a zero-row append carries the summary
            head = empty_append(spark, table, branch, applied.drop(DELETE), summary)
    finally:
        spark.catalog.dropTempView(view)
        joined.unpersist()
    if head is None or head == before:
        raise LakeError(f"table {table}: the merge into branch {branch} made no snapshot")
    reconcile(spark, table, branch, head, expected_rows)
    return head


def reconcile(spark, table: str, branch: str, head: int, expected_rows: int) -> None:
    """Check that snapshot ``head`` added ``expected_rows`` records.

    Raises:
        LakeError: it did not (nothing is published).
    """
    summary_of = spark.sql(f"SELECT summary FROM {table}.snapshots WHERE snapshot_id = {head}").first()[0]
    added = int(summary_of.get("added-records", "0"))
    if added != expected_rows:
        raise LakeError(
            f"table {table}: micro-batch does not reconcile: snapshot {head} on branch {branch} added "
            f"{added} rows but {expected_rows} keys were inserted or updated; nothing was published"
        )


def prepare_table(spark, table: str, key_columns: list[str]) -> None:
    """Make ``table`` an upsert table: :data:`UPSERT_TABLE_PROPERTIES`, the key as its Iceberg
    identifier fields, and the :data:`POSITION` column. Run once when the write path creates the
    table (commits on ``main``).

    Raises:
        ConfigError: a key column is nullable (identifier fields must be NOT NULL).
    """
    fields = {f.name: f for f in spark.table(table).schema.fields}
    nullable = [k for k in key_columns if k not in fields or fields[k].nullable]
    if nullable:
        raise ConfigError(f"table {table}: key column(s) {nullable} must exist and be NOT NULL (required: true)")
    props = ", ".join(f"{sql_string(k)}={sql_string(v)}" for k, v in UPSERT_TABLE_PROPERTIES.items())
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ({props})")
    spark.sql(f"ALTER TABLE {table} SET IDENTIFIER FIELDS {', '.join(quote_ident(k) for k in key_columns)}")
    ensure_position_column(spark, table)
