"""Change data capture: applying change events to an Iceberg table by key (``mode: upsert``).

A micro-batch of raw Kafka records (:data:`kafka_iceberg.kafka.records.RAW_SCHEMA_DDL`) becomes one
``MERGE INTO`` on the attempt branch, in three steps:

1. :func:`parse_changes` reads each record as a change: with ``cdc: debezium`` a Debezium
   envelope (``op`` c/r/u/d, ``before``, ``after``, ``source.lsn``; JsonConverter output with
   or without schemas); with ``cdc: none`` a plain upsert keyed by the Kafka key, where a
   tombstone (null value) deletes the key. Debezium's own tombstones (the null value that
   follows a delete) are counted as read and skipped. A bad change gets a problem
   (``kind``, ``reason``) for the dead-letter table: ``missing_key``, ``unknown_op``,
   ``malformed``, ``schema`` (the row does not fit the table) or ``unknown_field``.
2. :func:`reduce_changes` keeps the last change per key, ordered by the source position
   (``source.lsn``), then (partition, offset), and gives it its :data:`POSITION`. A key whose changes
   span Kafka partitions is ordered by its source position when every change has one; otherwise the
   batch fails with :class:`CrossPartitionKeyError` (the order cannot be known, so it is not guessed).
3. :func:`kafka_iceberg.cdc.upsert.merge_changes` keeps the changes newer than the table's rows (by
   :data:`POSITION`, kept per row) and merges them into ``<table>.branch_<attempt>`` of a
   format-version 2 merge-on-read table (updates and deletes write position delete files,
   never equality deletes), with the batch's summary (the Kafka offsets) on the snapshot.

A merge of the final state per key is idempotent, so re-applying a batch after a crash
converges to the same table; a change older than the row's (a re-sent one, or one that took
another partition) is not applied.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from kafka_iceberg.declaration.upsert import CDC_MODES, UpsertSpec, upsert_spec  # noqa: F401 (re-exported)
from kafka_iceberg.errors import ConfigError, LakeError

PROBLEM = "_problem"
"""Column of a parsed change: NULL for a good change, else ``struct<kind STRING, reason STRING>``
(the same name as :data:`kafka_iceberg.formats.transform.PROBLEM`, so ``dead_letter_rows`` takes it)."""
ACTION = "_cdc_action"
"""Column of a parsed change: ``upsert``, ``delete`` or ``skip`` (a Debezium tombstone)."""
LSN = "_cdc_lsn"
"""Column of a parsed change: the source position (Debezium ``source.lsn``, bigint), or NULL."""
POSITION = "_cdc_position"
"""Column of a reduced change and of the upsert table: the position of the row's last applied change,
``struct<lsn BIGINT, partition INT, offset BIGINT>`` (``lsn`` NULL when the change had none);
:mod:`kafka_iceberg.cdc.upsert` applies a change only when it is newer than this."""
POSITION_TYPE = "struct<lsn: bigint, partition: int, offset: bigint>"
"""Spark SQL type of :data:`POSITION`."""
DELETE = "_cdc_delete"
"""Column of a reduced change: True when the key's last change deletes it."""
PROBLEM_KINDS = ("missing_key", "unknown_op", "malformed", "schema", "unknown_field")


class CrossPartitionKeyError(LakeError):
    """A key's changes came from several Kafka partitions (in one micro-batch, or a change and the
    row it would replace) without a source position to order them by; applying them in any order
    would be a guess."""


@dataclass(frozen=True)
class Column:
    """A table column: name, Spark SQL type (``bigint``, ``string``, ...) and whether it is NOT NULL.
    (:class:`kafka_iceberg.formats.transform.ValueColumn` has the same shape and works too.)"""

    name: str
    type: str
    required: bool = False


def value_columns(columns) -> list:
    """``columns`` without :data:`POSITION` (the table's columns, read from its schema, include it;
    a change never carries it)."""
    return [c for c in columns if c.name != POSITION]


def quote_ident(name: str) -> str:
    """``name`` as a back-quoted Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def key_match(key_columns: list[str], left: str, right: str) -> str:
    """SQL: rows aliased ``left`` and ``right`` have the same key."""
    return " AND ".join(f"{left}.{quote_ident(k)} = {right}.{quote_ident(k)}" for k in key_columns)


def sql_string(value: str) -> str:
    """``value`` as a Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _problem(kind: str, reason_sql: str) -> str:
    return f"named_struct('kind', '{kind}', 'reason', {reason_sql})"


def _unwrap(json_sql: str) -> str:
    """JsonConverter with schemas wraps the data as ``{"schema": ..., "payload": ...}``; the payload."""
    payload = f"get_json_object({json_sql}, '$.payload')"
    wrapped = f"ltrim({json_sql}) LIKE '{{\"schema\"%'"  # JsonConverter writes "schema" first: a cheap test
    return f"CASE WHEN {wrapped} AND {payload} IS NOT NULL THEN {payload} ELSE {json_sql} END"


def _struct_ddl(columns, extra: tuple[tuple[str, str], ...] = ()) -> str:
    return ", ".join(f"{quote_ident(c.name)} {c.type}" for c in columns) + "".join(
        f", {quote_ident(n)} {t}" for n, t in extra
    )


def _envelope(raw: DataFrame, cdc: str, columns, key: list[str]) -> DataFrame:
    """Adds ``_op`` (c/r/u/d, or NULL), ``_rowtext`` (the row's JSON), :data:`LSN` and ``_k``
    (the key columns from the Kafka key, ``cdc: none`` only)."""
    df = raw.withColumn("_v", F.expr(_unwrap("CAST(value AS STRING)")))
    if cdc == "debezium":
        env = "STRUCT<op: STRING, before: STRING, after: STRING, source: STRUCT<lsn: BIGINT>>"
        df = df.withColumn("_env", F.from_json("_v", env))
        return (
            df.withColumn("_op", F.expr("_env.op"))
            .withColumn("_rowtext", F.expr("CASE WHEN _env.op = 'd' THEN _env.before ELSE _env.after END"))
            .withColumn(LSN, F.expr("_env.source.lsn"))
            .withColumn("_k", F.lit(None))
        )
    by_name = {c.name: c for c in columns}
    ktext = _unwrap("CAST(key AS STRING)")
    kjson = f"from_json({ktext}, '{_struct_ddl([by_name[k] for k in key])}')"
    if len(key) == 1:  # a bare (non-JSON-object) key is the value of the single key column
        kjson = (
            f"named_struct({sql_string(key[0])}, coalesce({kjson}.{quote_ident(key[0])}, "
            f"try_cast(CAST(key AS STRING) AS {by_name[key[0]].type})))"
        )
    return (
        df.withColumn("_op", F.expr("CASE WHEN value IS NULL THEN 'd' ELSE 'u' END"))
        .withColumn("_rowtext", F.col("_v"))
        .withColumn(LSN, F.lit(None).cast("bigint"))
        .withColumn("_k", F.expr(kjson))
    )


def _misfit_reason(columns) -> str:
    """SQL naming the first fields of ``_rowtext`` that do not fit their column type."""
    as_map = "from_json(_rowtext, 'MAP<STRING,STRING>')"
    misfits = ", ".join(
        f"CASE WHEN m[{sql_string(c.name)}] IS NOT NULL AND try_cast(m[{sql_string(c.name)}] AS {c.type}) IS NULL "
        f"THEN concat({sql_string(c.name + ' is ')}, substr(m[{sql_string(c.name)}], 1, 60), {sql_string(', not ' + c.type)}) END"
        for c in columns
        if c.type != "string" and c.type not in _TEMPORAL
    )
    fallback = "'a field does not fit its column type'"
    if not misfits:
        return fallback
    return f"coalesce(nullif(aggregate(array({as_map}), '', (acc, m) -> concat_ws('; ', {misfits})), ''), {fallback})"


def _problem_sql(cdc: str, columns, key: list[str], reject_unknown: bool) -> str:
    """NULL for a good change, else its problem (evaluated over the columns :func:`_envelope` adds)."""
    keys = [f"_r.{quote_ident(k)}" for k in key] if cdc == "debezium" else [f"_k.{quote_ident(k)}" for k in key]
    missing_key = f"WHEN {' OR '.join(k + ' IS NULL' for k in keys)} THEN " + _problem(
        "missing_key", sql_string(f"the change has no value for key column(s) {', '.join(key)}")
    )
    cases = [missing_key] if cdc == "none" else []  # a tombstone needs a key too
    cases += [
        "WHEN value IS NULL THEN NULL",
        "WHEN from_json(_v, 'MAP<STRING,STRING>') IS NULL THEN "
        + _problem("malformed", "concat('the value is not a JSON object: ', substr(CAST(value AS STRING), 1, 200))"),
        "WHEN _op IS NULL OR _op NOT IN ('c', 'r', 'u', 'd') THEN "
        + _problem("unknown_op", "concat('unknown change op ', coalesce(_op, 'null'), ' (expected c, r, u or d)')"),
        "WHEN _rowtext IS NULL THEN "
        + _problem(
            "malformed", "concat('op ', _op, ' has no row (', CASE WHEN _op = 'd' THEN 'before' ELSE 'after' END, ')')"
        ),
        missing_key,
        "WHEN _op = 'd' THEN NULL",
    ]
    cases += [
        f"WHEN _rt.{quote_ident(c.name)} IS NOT NULL AND _r.{quote_ident(c.name)} IS NULL THEN "
        + _problem(
            "schema",
            f"concat({sql_string(c.name + ' is ')}, substr(_rt.{quote_ident(c.name)}, 1, 60), {sql_string(', not ' + c.type)})",
        )
        for c in columns
        if c.type in _TEMPORAL
    ]
    cases += [
        "WHEN _r._corrupt IS NOT NULL THEN "
        + _problem("schema", f"concat('the row does not fit the table: ', {_misfit_reason(columns)})"),
    ]
    for c in columns:
        if c.required and c.name not in key:
            cases.append(
                f"WHEN _r.{quote_ident(c.name)} IS NULL THEN "
                + _problem("schema", sql_string(f"required column {c.name} is missing or null"))
            )
    if reject_unknown:
        unknown = f"array_except(json_object_keys(_rowtext), array({', '.join(sql_string(c.name) for c in columns)}))"
        cases.append(
            f"WHEN size({unknown}) > 0 THEN "
            + _problem("unknown_field", f"concat('fields not in the table: ', array_join({unknown}, ', '))")
        )
    return "CASE " + " ".join(cases) + " ELSE NULL END"


_TEMPORAL = {
    # Debezium with time.precision.mode=connect: timestamp = ms since epoch, date = days since epoch
    "timestamp": "CASE WHEN {v} RLIKE '^-?[0-9]+$' THEN timestamp_millis(CAST({v} AS BIGINT)) ELSE try_cast({v} AS TIMESTAMP) END",
    "date": "CASE WHEN {v} RLIKE '^-?[0-9]+$' THEN date_add(DATE'1970-01-01', CAST({v} AS INT)) ELSE try_cast({v} AS DATE) END",
}


def _typed_row(columns, kafka_key: list[str]) -> str:
    """SQL building ``_r`` from ``_rt`` (temporal columns still text): temporal columns converted,
    the columns in ``kafka_key`` taken from the Kafka key ``_k``, ``_corrupt`` kept."""

    def value(c) -> str:
        if c.name in kafka_key:
            return f"_k.{quote_ident(c.name)}"
        if c.type in _TEMPORAL:
            return _TEMPORAL[c.type].format(v=f"_rt.{quote_ident(c.name)}")
        return f"_rt.{quote_ident(c.name)}"

    return (
        "named_struct("
        + ", ".join(f"{sql_string(c.name)}, {value(c)}" for c in columns)
        + ", '_corrupt', _rt._corrupt)"
    )


def parse_changes(raw: DataFrame, columns, key: list[str], cdc: str, reject_unknown: bool = True) -> DataFrame:
    """Parse raw Kafka records (``RAW_SCHEMA_DDL``: topic, partition, offset, timestamp_ms, key,
    value, headers) as change events for a table with ``columns`` keyed by ``key``.

    ``columns`` may include :data:`POSITION`; it is left out. Returns the raw columns plus :data:`ACTION` (``upsert``/``delete``/``skip``), :data:`LSN`
    (bigint source position or NULL), ``_r`` (the row: a struct of ``columns``, key columns
    taken from the Kafka key with ``cdc: none``) and :data:`PROBLEM`. Lazy: no Spark job runs.

    Raises:
        ConfigError: ``cdc`` is not one of :data:`CDC_MODES`, or a key column is not in ``columns``.
    """
    if cdc not in CDC_MODES:
        raise ConfigError(f"cdc: {cdc!r} is not one of {', '.join(CDC_MODES)}")
    columns = value_columns(columns)
    missing = [k for k in key if k not in {c.name for c in columns}]
    if not key or missing:
        raise ConfigError(f"key column(s) {missing or '(none)'} are not columns of the table")
    df = _envelope(raw, cdc, columns, key)
    schema = _struct_ddl(
        [Column(c.name, "string" if c.type in _TEMPORAL else c.type) for c in columns], (("_corrupt", "string"),)
    )
    df = df.withColumn(
        "_rt", F.from_json("_rowtext", schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt"})
    )
    df = df.withColumn("_r", F.expr(_typed_row(columns, key if cdc == "none" else [])))
    df = df.withColumn(PROBLEM, F.expr(_problem_sql(cdc, columns, key, reject_unknown)))
    skip = "WHEN value IS NULL THEN 'skip'" if cdc == "debezium" else ""
    df = df.withColumn(ACTION, F.expr(f"CASE {skip} WHEN _op = 'd' THEN 'delete' ELSE 'upsert' END"))
    return df.drop("_v", "_env", "_op", "_rowtext", "_k", "_rt")


def change_counts(parsed: DataFrame) -> dict[str, int]:
    """Counts of a :func:`parse_changes` result (records): ``read``, ``upserts``, ``deletes``,
    ``skipped`` (Debezium tombstones) and ``bad`` (changes with a problem). One Spark job."""
    good = F.col(PROBLEM).isNull()
    row = parsed.agg(
        F.count(F.lit(1)).alias("read"),
        F.count(F.when(good & (F.col(ACTION) == "upsert"), 1)).alias("upserts"),
        F.count(F.when(good & (F.col(ACTION) == "delete"), 1)).alias("deletes"),
        F.count(F.when(good & (F.col(ACTION) == "skip"), 1)).alias("skipped"),
        F.count(F.when(~good, 1)).alias("bad"),
    ).first()
    return {k: int(row[k] or 0) for k in ("read", "upserts", "deletes", "skipped", "bad")}


def check_partitions(parsed: DataFrame, key: list[str], table: str) -> None:
    """Fail when a key's good changes came from several partitions and some lack a source position.

    Raises:
        CrossPartitionKeyError: naming up to 5 such keys.
    """
    good = parsed.where(F.col(PROBLEM).isNull() & (F.col(ACTION) != "skip"))
    keys = [F.col(f"_r.{quote_ident(k)}").alias(k) for k in key]
    bad = (
        good.groupBy(*keys)
        .agg(
            F.countDistinct("partition").alias("partitions"),
            F.count(F.when(F.col(LSN).isNull(), 1)).alias("unordered"),
        )
        .where("partitions > 1 AND unordered > 0")
        .limit(5)
        .collect()
    )
    if bad:
        shown = "; ".join(", ".join(f"{k}={r[k]!r}" for k in key) for r in bad)
        raise CrossPartitionKeyError(
            f"table {table}: the changes of key(s) {shown} span several Kafka partitions and carry no source position "
            "(source.lsn), so their order is unknown; produce each key to one partition (key the topic by the table key). "
            "Nothing was committed."
        )


def reduce_changes(
    parsed: DataFrame, columns, key: list[str], table: str = "?", extra: dict[str, str] | None = None
) -> DataFrame:
    """The last good change per key of a :func:`parse_changes` result, in source order
    (:data:`LSN`, then partition, then offset).

    Returns one row per key: ``columns`` in order, then ``extra`` (table column name -> a SQL
    expression over the raw columns, e.g. ``{"_kafka_offset": "offset"}``), then :data:`POSITION`
    (the change's LSN, partition and offset) and :data:`DELETE`.

    Raises:
        CrossPartitionKeyError: see :func:`check_partitions` (runs one Spark job).
    """
    check_partitions(parsed, key, table)
    columns = value_columns(columns)
    good = parsed.where(F.col(PROBLEM).isNull() & (F.col(ACTION) != "skip"))
    order = Window.partitionBy(*[F.col(f"_r.{quote_ident(k)}") for k in key]).orderBy(
        F.col(LSN).desc_nulls_last(), F.col("partition").desc(), F.col("offset").desc()
    )
    last = good.withColumn("_n", F.row_number().over(order)).where("_n = 1")
    out = [F.col(f"_r.{quote_ident(c.name)}").alias(c.name) for c in columns]
    out += [F.expr(sql).alias(name) for name, sql in (extra or {}).items()]
    position = F.struct(F.col(LSN).alias("lsn"), F.col("partition").alias("partition"), F.col("offset").alias("offset"))
    return last.select(*out, position.alias(POSITION), (F.col(ACTION) == "delete").alias(DELETE))
