"""Turning raw Kafka records into table rows, and classifying the ones that do not fit.

The Iceberg table schema is the contract (docs/tables.md#the-table-schema-is-the-contract):
every record is checked against the table's *current* value columns (the declared ones, plus
any that schema evolution added), in one Spark pass, and gets a problem (a kind and a
human-readable reason) or none:

=================  =====================================================================
``tombstone``      the value is null
``oversize``       key plus value are larger than ``bad_records.max_record_bytes``
``malformed``      the value is not a JSON object (not JSON, an array, a bare string ...)
``schema``         a JSON object that does not fit: a field of another type (``"abc"`` or
                   ``12.5`` for an ``int``, a number out of the type's range) or a
                   required field that is missing or null
``unknown_field``  with ``unknown_fields: reject`` (or a field ``evolve`` cannot add), a
                   top-level field the table does not have
=================  =====================================================================

Good records become table rows (:func:`table_rows`); bad ones become dead-letter rows
(:func:`dead_letter_rows`) or fail the run, as the table's ``bad_records.policy`` says.

Schema evolution (``unknown_fields: evolve``): :func:`new_fields` finds top-level fields
the table lacks in a batch and infers a type for each (JSON numbers without a fraction ->
``bigint``, with one -> ``double``, booleans, strings); the write path adds them as optional
columns with an Iceberg schema update before it writes the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from kafka_iceberg.declaration.columns import KAFKA_COLUMNS
from kafka_iceberg.declaration.format_spec import KEY_PARSED
from kafka_iceberg.declaration.models import IDENTIFIER
from kafka_iceberg.declaration.spec import TableSpec

_CORRUPT = "_corrupt_record"
PROBLEM = "_problem"
PROBLEM_KINDS = ("tombstone", "oversize", "malformed", "schema", "unknown_field")

DEAD_LETTER_COLUMNS = (
    # (name, Spark SQL type, required)
    ("topic", "STRING", True),
    ("partition", "INT", True),
    ("offset", "BIGINT", True),
    ("timestamp", "TIMESTAMP", False),
    ("key", "BINARY", False),
    ("value", "BINARY", False),
    ("headers", "ARRAY<STRUCT<key: STRING, value: BINARY>>", False),
    ("error_kind", "STRING", True),
    ("error", "STRING", True),
    ("run_id", "STRING", True),
    ("quarantined_at", "TIMESTAMP", True),
)
"""Columns of a dead-letter table: the raw record, why it was quarantined, and by which run."""


@dataclass(frozen=True)
class ValueColumn:
    """One value column of the table as it is in the catalog: name, Spark SQL type
    (e.g. ``bigint``, ``decimal(10,2)``) and whether it is required (NOT NULL)."""

    name: str
    type: str
    required: bool


@dataclass(frozen=True)
class NewField:
    """A top-level JSON field the table does not have, seen in a batch.

    ``type`` is the inferred Spark SQL type (``bigint``, ``double``, ``boolean``, ``string``),
    or ``None`` when the field cannot become a column automatically; ``why_not`` says why
    (a nested object or array, or a name that is not a lower_snake_case identifier).
    """

    name: str
    type: str | None
    why_not: str | None = None


_NOT_VALUE_COLUMNS = {name for name, _ in KAFKA_COLUMNS.values()} | {KEY_PARSED}


def value_columns(table_schema: T.StructType) -> list[ValueColumn]:
    """The table's value columns (every column but the Kafka metadata ones), from its Spark schema."""
    return [
        ValueColumn(f.name, f.dataType.simpleString(), not f.nullable)
        for f in table_schema.fields
        if f.name not in _NOT_VALUE_COLUMNS
    ]


_ICEBERG_SQL = {
    "IntegerType": "int",
    "LongType": "bigint",
    "DoubleType": "double",
    "StringType": "string",
    "BooleanType": "boolean",
    "TimestamptzType": "timestamp",
}


def iceberg_value_columns(schema) -> list[ValueColumn] | None:
    """:func:`value_columns` from a pyiceberg ``Schema`` (no Spark catalog lookup), for tables whose
    value columns all have one of the Spark SQL types pyarrow parses (:data:`kafka_iceberg.formats.arrow_json.ARROW_TYPES`);
    None when a column has another type (ask Spark then)."""
    out = []
    for f in schema.fields:
        if f.name in _NOT_VALUE_COLUMNS:
            continue
        sql = _ICEBERG_SQL.get(type(f.field_type).__name__)
        if sql is None:
            return None
        out.append(ValueColumn(f.name, sql, f.required))
    return out


def _sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _problem(kind: str, reason_sql: str) -> str:
    return f"named_struct('kind', '{kind}', 'reason', {reason_sql})"


def problem_expression(spec: TableSpec, columns: list[ValueColumn]) -> str:
    """A Spark SQL expression over ``key``, ``value`` and ``j`` (the value parsed into the
    columns) that is NULL for a good record and ``struct<kind, reason>`` for a bad one."""
    bound = spec.bad_records.max_record_bytes
    size = "(coalesce(length(key), 0) + coalesce(length(value), 0))"
    # which field does not fit its type (evaluated only for records that failed to parse)
    as_map = "from_json(CAST(value AS STRING), 'MAP<STRING,STRING>')"
    misfits = ", ".join(
        f"CASE WHEN m[{_sql_string(c.name)}] IS NOT NULL AND try_cast(m[{_sql_string(c.name)}] AS {c.type}) IS NULL "
        f"THEN concat('{c.name} is ', substr(m[{_sql_string(c.name)}], 1, 60), ', not {c.type}') END"
        for c in columns
        if c.type != "string"
    )
    # bind the map once per bad record: aggregate over a one-element array
    misfit_reason = (
        f"coalesce(nullif(aggregate(array({as_map}), '', (acc, m) -> concat_ws('; ', {misfits})), ''), "
        "'a field does not fit its declared type')"
        if misfits
        else "'a field does not fit its declared type'"
    )
    oversize = f"concat(CAST({size} AS STRING), {_sql_string(f' bytes, over the bound of {bound} bytes')})"
    cases = [
        f"WHEN value IS NULL THEN {_problem('tombstone', repr('the value is null (a tombstone)'))}",
        f"WHEN {size} > {bound} THEN {_problem('oversize', oversize)}",
        f"WHEN j IS NULL OR (j.`{_CORRUPT}` IS NOT NULL AND {as_map} IS NULL) THEN "
        + _problem("malformed", "concat('the value is not a JSON object: ', substr(CAST(value AS STRING), 1, 200))"),
        f"WHEN j.`{_CORRUPT}` IS NOT NULL THEN "
        + _problem("schema", f"concat('the value does not fit the table schema: ', {misfit_reason})"),
    ]
    for c in columns:
        if c.required:
            cases.append(
                f"WHEN j.`{c.name}` IS NULL THEN {_problem('schema', repr(f'required field {c.name} is missing or null'))}"
            )
    if spec.unknown_fields in ("reject", "evolve"):
        declared = ", ".join(_sql_string(c.name) for c in columns)
        unknown = f"array_except(json_object_keys(CAST(value AS STRING)), array({declared}))"
        cases.append(
            f"WHEN size({unknown}) > 0 THEN "
            + _problem("unknown_field", f"concat('fields not in the table schema: ', array_join({unknown}, ', '))")
        )
    return "CASE " + " ".join(cases) + " ELSE NULL END"


def classify(raw: DataFrame, spec: TableSpec, columns: list[ValueColumn]) -> DataFrame:
    """Parse raw records (:data:`kafka_iceberg.kafka.records.RAW_SCHEMA_DDL`) against ``columns``.

    Returns the raw columns plus ``j`` (the parsed value, a struct of ``columns``) and
    :data:`PROBLEM` (NULL for a good record, else ``struct<kind STRING, reason STRING>``).
    """
    fields = [(c.name, c.type) for c in columns] + [(_CORRUPT, "string")]
    schema = ", ".join(f"`{n}` {t}" for n, t in fields)
    parsed = raw.withColumn(
        "j",
        F.from_json(
            F.col("value").cast("string"), schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
        ),
    )
    return parsed.withColumn(PROBLEM, F.expr(problem_expression(spec, columns)))


def classify_parsed(read: DataFrame, spec: TableSpec, columns: list[ValueColumn]) -> DataFrame:
    """Like :func:`classify`, for records the read task already parsed with pyarrow
    (:mod:`kafka_iceberg.formats.arrow_json`: ``j`` and ``_arrow``): a record pyarrow found good keeps its
    ``j`` and no problem; every other one is parsed with ``from_json`` and classified by
    :func:`problem_expression`, exactly as :func:`classify` would."""
    fields = [(c.name, c.type) for c in columns] + [(_CORRUPT, "string")]
    schema = ", ".join(f"`{n}` {t}" for n, t in fields)
    spark_j = F.from_json(
        F.col("value").cast("string"), schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
    )
    arrow = F.col("_arrow")
    parsed = read.withColumn("j", F.when(arrow, F.col("j")).otherwise(spark_j))
    return parsed.withColumn(PROBLEM, F.when(~arrow, F.expr(problem_expression(spec, columns))))


def table_rows(classified: DataFrame, spec: TableSpec, columns: list[ValueColumn]) -> DataFrame:
    """The good records of a :func:`classify` result as table rows: ``columns`` in order, then the
    table's Kafka metadata columns (``spec.kafka_columns``)."""
    kafka = {
        "topic": F.col("topic"),
        "partition": F.col("partition"),
        "offset": F.col("offset"),
        "timestamp": F.expr("timestamp_millis(timestamp_ms)"),
        "key": F.col("key"),
        "headers": F.col("headers"),
    }
    out = [F.col(f"j.`{c.name}`").alias(c.name) for c in columns]
    out += [kafka[k].alias(spec.kafka_column(k)) for k in spec.kafka_columns]
    out += [F.col("_key").alias(KEY_PARSED)] if spec.key_format is not None else []  # batch.keys.parse_keys
    return classified.where(F.col(PROBLEM).isNull()).select(*out)


def dead_letter_rows(classified: DataFrame, run_id: str) -> DataFrame:
    """The bad records of a :func:`classify` result as dead-letter rows (:data:`DEAD_LETTER_COLUMNS`)."""
    return classified.where(F.col(PROBLEM).isNotNull()).select(
        "topic",
        "partition",
        "offset",
        F.expr("timestamp_millis(timestamp_ms)").alias("timestamp"),
        "key",
        "value",
        "headers",
        F.col(f"{PROBLEM}.kind").alias("error_kind"),
        F.col(f"{PROBLEM}.reason").alias("error"),
        F.lit(run_id).alias("run_id"),
        F.current_timestamp().alias("quarantined_at"),
    )


_INFERRED = {
    T.LongType: "bigint",
    T.DoubleType: "double",
    T.BooleanType: "boolean",
    T.StringType: "string",
}


def new_fields(spark, raw: DataFrame, columns: list[ValueColumn]) -> list[NewField]:
    """Top-level fields of JSON-object values in ``raw`` that ``columns`` lack, with inferred types.

    One pass over ``raw`` to find the field names; when there are any, Spark's JSON schema
    inference over the values that carry them. Values that are not JSON objects are skipped
    here (they are quarantined as malformed). Returns the fields sorted by name.
    """
    declared = F.array(*[F.lit(c.name) for c in columns]) if columns else F.array().cast("array<string>")
    keys = raw.select(F.explode(F.array_except(F.json_object_keys(F.col("value").cast("string")), declared)).alias("k"))
    names = sorted(r["k"] for r in keys.distinct().collect())
    if not names:
        return []
    carriers = raw.where(
        F.arrays_overlap(F.json_object_keys(F.col("value").cast("string")), F.array(*map(F.lit, names)))
    )
    inferred = spark.read.json(carriers.select(F.col("value").cast("string")).rdd.map(lambda r: r[0]))
    types = {f.name: f.dataType for f in inferred.schema.fields}
    out = []
    for name in names:
        dtype = types.get(name, T.StringType())
        if not IDENTIFIER.match(name):
            out.append(NewField(name, None, "the name is not a lower_snake_case identifier"))
        elif type(dtype) not in _INFERRED:
            out.append(
                NewField(
                    name, None, f"its values are {dtype.simpleString()}; only primitive fields evolve automatically"
                )
            )
        else:
            out.append(NewField(name, _INFERRED[type(dtype)]))
    return out


__all__ = [
    "DEAD_LETTER_COLUMNS",
    "PROBLEM",
    "PROBLEM_KINDS",
    "NewField",
    "ValueColumn",
    "classify",
    "classify_parsed",
    "dead_letter_rows",
    "new_fields",
    "problem_expression",
    "table_rows",
    "value_columns",
]
