"""Parsing raw Kafka records into the table's declared schema, with Spark SQL.

The JSON value is parsed by ``from_json`` in PERMISSIVE mode with a corrupt-record column,
then every record is validated in the same pass. A record that fails validation aborts
the Spark job through ``raise_error`` with a message carrying its topic, partition and
offset; :func:`bad_record_from_exception` turns that back into a
:class:`~kafka_iceberg.errors.MalformedRecordError` on the driver. Nothing is committed
for a batch with a bad record (quarantine to a dead-letter table is planned; see
docs/tables.md).

Validation, in order: a null value (tombstone); a value that is not a JSON object fitting
the schema (malformed JSON, or a value whose type does not match, e.g. ``"abc"`` for an
``int``); a required field that is missing or null; and, with ``unknown_fields: fail``,
a top-level field the schema does not declare.
"""

from __future__ import annotations

import re

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kafka_iceberg.errors import MalformedRecordError
from kafka_iceberg.spec import TableSpec

_CORRUPT = "_corrupt_record"
_MARKER = "LAKE_BAD_RECORD"
_BAD = re.compile(_MARKER + r"\|(?P<topic>[^|]*)\|(?P<partition>-?\d+)\|(?P<offset>-?\d+)\|(?P<reason>[^\n]*)")


def _sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def problem_expression(spec: TableSpec) -> str:
    """A Spark SQL expression over columns ``value`` and ``j`` (the parsed struct) that is
    NULL for a good record and a human-readable reason for a bad one."""
    cases = [
        "WHEN value IS NULL THEN 'the value is null (a tombstone)'",
        f"WHEN j IS NULL OR j.`{_CORRUPT}` IS NOT NULL THEN "
        "concat('the value is not a JSON object matching the declared schema: ', "
        "substr(CAST(value AS STRING), 1, 200))",
    ]
    for col in spec.columns:
        if col.required:
            cases.append(f"WHEN j.`{col.name}` IS NULL THEN 'required field {col.name} is missing or null'")
    if spec.unknown_fields == "fail":
        declared = ", ".join(_sql_string(c.name) for c in spec.columns)
        unknown = f"array_except(json_object_keys(CAST(value AS STRING)), array({declared}))"
        cases.append(
            f"WHEN size({unknown}) > 0 THEN concat('unknown fields not in the table schema: ', array_join({unknown}, ', '))"
        )
    return "CASE " + " ".join(cases) + " ELSE NULL END"


def parse_records(raw: DataFrame, spec: TableSpec) -> DataFrame:
    """Turn raw records (:data:`kafka_iceberg.reader.RAW_SCHEMA_DDL`) into table rows.

    Returns a DataFrame whose columns are ``spec.table_columns()`` in order. Evaluating it
    raises (inside Spark) on the first bad record; wrap the action with
    :func:`bad_record_from_exception`.
    """
    fields = [(c.name, c.spark_type) for c in spec.columns] + [(_CORRUPT, "STRING")]
    schema = ", ".join(f"`{n}` {t}" for n, t in fields)
    struct_type = "STRUCT<" + ", ".join(f"`{n}`: {t}" for n, t in fields) + ">"
    parsed = raw.withColumn(
        "j",
        F.from_json(
            F.col("value").cast("string"),
            schema,
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT},
        ),
    ).withColumn("_problem", F.expr(problem_expression(spec)))
    # Every value column is read through this guard, so a bad record raises before any
    # other check (such as Spark's NOT NULL assertion on a required column) can fire.
    checked = parsed.withColumn(
        "j",
        F.expr(
            "CASE WHEN _problem IS NULL THEN j ELSE CAST(raise_error(concat("
            f"'{_MARKER}|', topic, '|', CAST(partition AS STRING), '|', CAST(offset AS STRING), '|', _problem"
            f")) AS {struct_type}) END"
        ),
    )
    kafka = {
        "topic": F.col("topic"),
        "partition": F.col("partition"),
        "offset": F.col("offset"),
        "timestamp": F.expr("timestamp_millis(timestamp_ms)"),
        "key": F.col("key"),
        "headers": F.col("headers"),
    }
    columns = [F.col(f"j.`{c.name}`").alias(c.name) for c in spec.columns]
    columns += [kafka[k].alias(spec.kafka_column(k)) for k in spec.kafka_columns]
    return checked.select(*columns)


def bad_record_from_exception(exc: BaseException, table: str) -> MalformedRecordError | None:
    """If ``exc`` (usually a Py4J/Spark exception) was raised by a bad record, the matching
    :class:`MalformedRecordError`; otherwise ``None``."""
    m = _BAD.search(str(exc))
    if not m:
        return None
    return MalformedRecordError(table, m["topic"], int(m["partition"]), int(m["offset"]), m["reason"].strip())
