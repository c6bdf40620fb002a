"""The commit of an upsert table: ``MERGE INTO`` the attempt branch, with the offsets on the snapshot.

:func:`merge_changes` takes the reduced changes of :func:`kafka_iceberg.cdc.changes.reduce_changes` (one
row per key, :data:`~kafka_iceberg.cdc.changes.DELETE` marking deletes) and merges them into
``<catalog>.<db>.<table>.branch_<attempt>`` of a format-version 2 merge-on-read table, so
updates and deletes write position delete files (deletion vectors on format version 3), never
equality deletes. The snapshot's summary carries the batch's Kafka offsets, through Iceberg's
``CommitMetadata.withCommitProperties`` (``spark.sql.iceberg.snapshot-property.*`` is ignored by
MERGE; ``spark.wap.branch`` is never used: without ``write.wap.enabled`` it commits to ``main``).
The write path's conditional ``fast_forward`` then publishes the branch, as for appends.
"""

from __future__ import annotations

import uuid

from pyspark.sql import DataFrame

from kafka_iceberg.cdc.changes import DELETE, quote_ident, sql_string
from kafka_iceberg.errors import ConfigError, LakeError

UPSERT_TABLE_PROPERTIES = {
    "format-version": "2",
    "write.merge.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.delete.mode": "merge-on-read",
}
"""Table properties of an upsert table: row-level changes write position delete files."""


def merge_sql(target: str, source_view: str, columns: list[str], key_columns: list[str]) -> str:
    """``MERGE INTO target`` from ``source_view`` (``columns`` plus :data:`DELETE`) by ``key_columns``."""
    on = " AND ".join(f"t.{quote_ident(k)} = s.{quote_ident(k)}" for k in key_columns)
    sets = ", ".join(f"t.{quote_ident(c)} = s.{quote_ident(c)}" for c in columns if c not in key_columns)
    names = ", ".join(quote_ident(c) for c in columns)
    values = ", ".join(f"s.{quote_ident(c)}" for c in columns)
    update = f"WHEN MATCHED THEN UPDATE SET {sets} " if sets else ""
    return (
        f"MERGE INTO {target} t USING {source_view} s ON {on} "
        f"WHEN MATCHED AND s.{DELETE} THEN DELETE {update}"
        f"WHEN NOT MATCHED AND NOT s.{DELETE} THEN INSERT ({names}) VALUES ({values})"
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


def merge_changes(
    spark,
    table: str,
    branch: str,
    changes_df: DataFrame,
    key_columns: list[str],
    summary: dict[str, str],
    expected_rows: int | None = None,
) -> int:
    """Merge reduced changes (:func:`reduce_changes`: one row per key, :data:`DELETE` marks deletes)
    into branch ``branch`` of ``table`` (``<catalog>.<db>.<table>``) as one snapshot whose summary
    carries ``summary`` (e.g. the Kafka offsets). Returns the branch's new head snapshot id.

    Updates and deletes write position delete files (the table must have the
    :data:`UPSERT_TABLE_PROPERTIES`). When the merge changes nothing (every change was a skipped
    tombstone, or the batch deleted keys the table does not have), a zero-row append to the
    branch carries ``summary`` instead, so the offsets still advance. Idempotent per key state.

    ``expected_rows``, when given, is the number of rows of ``changes_df`` that are not deletes
    (records): each is inserted or rewritten, so the snapshot's ``added-records`` must equal it.

    Raises:
        LakeError: the branch does not exist, no snapshot carrying ``summary`` was made, or the
            merge does not reconcile with ``expected_rows`` (nothing is published).
    """
    before = branch_head(spark, table, branch)
    if before is None:
        raise LakeError(f"table {table}: branch {branch} does not exist")
    view = f"cdc_changes_{uuid.uuid4().hex}"
    changes_df.createOrReplaceTempView(view)
    columns = [c for c in changes_df.columns if c != DELETE]
    try:
        sql = merge_sql(f"{table}.branch_{branch}", view, columns, key_columns)
        with_commit_properties(spark, summary, lambda: spark.sql(sql))
    finally:
        spark.catalog.dropTempView(view)
    head = branch_head(spark, table, branch)
    if head == before:
        writer = changes_df.limit(0).drop(DELETE).writeTo(f"{table}.branch_{branch}")
        for k, v in summary.items():
            writer = writer.option(f"snapshot-property.{k}", v)
        writer.append()
        head = branch_head(spark, table, branch)
    if head is None or head == before:
        raise LakeError(f"table {table}: the merge into branch {branch} made no snapshot")
    if expected_rows is not None:
        summary_of = spark.sql(f"SELECT summary FROM {table}.snapshots WHERE snapshot_id = {head}").first()[0]
        added = int(summary_of.get("added-records", "0"))
        if added != expected_rows:
            raise LakeError(
                f"table {table}: micro-batch does not reconcile: snapshot {head} on branch {branch} added "
                f"{added} rows but {expected_rows} keys were inserted or updated; nothing was published"
            )
    return head


def prepare_table(spark, table: str, key_columns: list[str]) -> None:
    """Make ``table`` an upsert table: :data:`UPSERT_TABLE_PROPERTIES` and the key as its Iceberg
    identifier fields. Run once when the write path creates the table (a commit on ``main``).

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
