"""The formats inside Spark: schema ids of a DataFrame of raw records, and decoding in the tasks.

For the write path, per micro-batch::

    ids = schema_ids_in(raw_df)                  # one small Spark job: distinct 4-byte ids
    writers = resolve(url, ids)                  # driver, once per id (cached for good)
    decoded = decode_dataframe(raw_df, writers, table_value_schema, "avro")

``decoded`` has the raw columns asked for, then ``j`` (the value as a struct of the table's value
columns; null for a bad record), then ``_format_error_kind`` and ``_format_error``: null for a good
record, else the bad-record kind (:data:`kafka_iceberg.formats.wire.BAD_KINDS`) and reason. The
writer schemas travel to the tasks inside the ``mapInArrow`` closure; tasks never call the registry.

:func:`classify_formatted` gives the shape of ``kafka_iceberg.formats.transform.classify`` (raw columns,
``j``, ``_problem``), so the write path's later steps (table rows, dead-letter rows, counts) work
on it unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute

from kafka_iceberg.formats.decode import decode_values
from kafka_iceberg.formats.resolver import WriterSchema
from kafka_iceberg.formats.types import UnsupportedSchemaError, arrow_schema

ERROR_KIND = "_format_error_kind"
ERROR = "_format_error"
VALUE = "j"


def schema_ids_in(df, column: str = "value") -> set[int]:
    """The distinct schema ids of the framed values in ``df[column]`` (values without the magic
    byte are left out; the decoder reports them). Runs one Spark job."""
    from pyspark.sql import functions as F

    head = F.substring(F.col(column), 1, 5)
    rows = (
        df.where(F.length(column) >= 5)
        .where(F.hex(F.substring(F.col(column), 1, 1)) == "00")
        .select(F.conv(F.hex(F.substring(head, 2, 4)), 16, 10).cast("long").alias("id"))
        .distinct()
        .collect()
    )
    return {int(r["id"]) for r in rows}


def output_schema(value_schema: pa.Schema, keep: pa.Schema) -> pa.Schema:
    """Arrow schema of :func:`decode_dataframe`'s output: kept columns, ``j`` (a nullable struct of
    the value columns), then the two error columns."""
    return pa.schema(
        list(keep)
        + [pa.field(VALUE, pa.struct(list(value_schema)))]
        + [pa.field(ERROR_KIND, pa.string()), pa.field(ERROR, pa.string())]
    )


def decode_batch(
    batch: pa.RecordBatch,
    writers: Mapping[int, WriterSchema | None],
    value_schema: pa.Schema,
    fmt: str,
    keep: Sequence[str],
    out_schema: pa.Schema,
    column: str = "value",
    refused: Mapping[int, tuple[str, str]] | None = None,
) -> pa.RecordBatch:
    """One input batch -> one output batch with a row per input row (see the module docstring)."""

    n = batch.num_rows
    result = decode_values(batch.column(column).to_pylist(), writers, value_schema, fmt, refused)
    where = [None] * n
    for row, i in enumerate(result.row_index):
        where[i] = row
    taken = result.rows.take(pa.array(where, pa.int64()))
    valid = pa.array([w is not None for w in where])
    struct = pa.StructArray.from_arrays(
        [taken.column(f.name).combine_chunks() for f in value_schema],
        fields=list(value_schema),
        mask=pa.compute.invert(valid),
    )
    kinds, reasons = [None] * n, [None] * n
    for b in result.bad:
        kinds[b.index], reasons[b.index] = b.kind, b.reason
    arrays = [batch.column(k) for k in keep] + [struct]
    arrays += [pa.array(kinds, pa.string()), pa.array(reasons, pa.string())]
    return pa.RecordBatch.from_arrays(arrays, schema=out_schema)


def decode_dataframe(
    df,
    writers: Mapping[int, WriterSchema | None],
    table_schema,
    fmt: str,
    keep: Sequence[str] = ("partition", "offset"),
    column: str = "value",
    refused: Mapping[int, tuple[str, str]] | None = None,
):
    """``df`` (raw records with a binary ``column``) decoded in the Spark tasks (``mapInArrow``).

    ``table_schema``: the table's value columns as a pyiceberg ``Schema``. ``writers``: from
    :func:`kafka_iceberg.formats.resolve` on the driver. ``refused``: ``BatchPlan.refused``.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    value_schema = arrow_schema(table_schema)
    keep = list(keep)
    keep_schema = pa.schema([pa.field(f.name, _spark_to_arrow(f.dataType)) for f in df.schema.fields if f.name in keep])
    keep_schema = pa.schema([keep_schema.field(k) for k in keep])
    out_schema = output_schema(value_schema, keep_schema)
    writers, refused = dict(writers), dict(refused or {})

    def run(batches):
        for b in batches:
            yield decode_batch(b, writers, value_schema, fmt, keep, out_schema, column, refused)

    source = df.select(*keep, *([] if column in keep else [column]))
    return source.mapInArrow(run, from_arrow_schema(out_schema))


def _spark_to_arrow(t) -> pa.DataType:
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(t)


def classify_formatted(
    raw,
    table_schema,
    fmt: str,
    writers: Mapping[int, WriterSchema | None],
    refused: Mapping[int, tuple[str, str]] | None = None,
    max_record_bytes: int | None = None,
):
    """Raw records (``kafka_iceberg.kafka.records.RAW_SCHEMA_DDL``) decoded and classified in the shape
    of ``kafka_iceberg.formats.transform.classify``: every raw column, ``j`` (a struct of the table's value
    columns, ``table_schema`` as a pyiceberg ``Schema``) and ``_problem`` (null, or
    ``struct<kind, reason>``). Kinds in order: ``tombstone`` (null value), ``oversize`` (key +
    value above ``max_record_bytes``), then the format's kinds (:data:`~kafka_iceberg.formats.wire.BAD_KINDS`).
    """
    from pyspark.sql import functions as F

    cols = list(raw.columns)
    decoded = decode_dataframe(raw, writers, table_schema, fmt, keep=cols, refused=refused)
    size = F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))

    def problem(kind, reason):
        return F.struct(kind.alias("kind"), reason.alias("reason"))

    rule = F.when(F.col("value").isNull(), problem(F.lit("tombstone"), F.lit("the value is null (a tombstone)")))
    if max_record_bytes is not None:
        rule = rule.when(
            size > max_record_bytes,
            problem(
                F.lit("oversize"),
                F.concat(
                    F.lit("key + value are "),
                    size.cast("string"),
                    F.lit(f" bytes, above max_record_bytes {max_record_bytes}"),
                ),
            ),
        )
    rule = rule.when(F.col(ERROR_KIND).isNotNull(), problem(F.col(ERROR_KIND), F.col(ERROR)))
    return decoded.select(*cols, F.when(rule.isNull(), F.col(VALUE)).alias(VALUE), rule.alias("_problem"))


def spark_sql_type(t) -> str:
    """The Spark SQL type of Iceberg type ``t`` for ``CREATE TABLE`` (nested fields optional;
    uuid -> STRING as the decoders produce it, fixed -> BINARY).

    Raises:
        UnsupportedSchemaError: a type Spark cannot hold (Iceberg ``time``).
    """
    from pyiceberg import types as it

    if isinstance(t, it.StructType):
        return "STRUCT<" + ", ".join(f"`{f.name}`: {spark_sql_type(f.field_type)}" for f in t.fields) + ">"
    if isinstance(t, it.ListType):
        return f"ARRAY<{spark_sql_type(t.element_type)}>"
    if isinstance(t, it.MapType):
        return f"MAP<{spark_sql_type(t.key_type)}, {spark_sql_type(t.value_type)}>"
    if isinstance(t, it.DecimalType):
        return f"DECIMAL({t.precision},{t.scale})"
    simple = {
        it.BooleanType: "BOOLEAN",
        it.IntegerType: "INT",
        it.LongType: "BIGINT",
        it.FloatType: "FLOAT",
        it.DoubleType: "DOUBLE",
        it.DateType: "DATE",
        it.TimestampType: "TIMESTAMP_NTZ",
        it.TimestamptzType: "TIMESTAMP",
        it.StringType: "STRING",
        it.UUIDType: "STRING",
        it.BinaryType: "BINARY",
        it.FixedType: "BINARY",
    }
    if type(t) not in simple:
        raise UnsupportedSchemaError(f"Iceberg type {t} has no Spark SQL type")
    return simple[type(t)]


def spark_columns(schema) -> list[tuple[str, str, bool]]:
    """A pyiceberg ``Schema``'s top-level fields as ``(name, Spark SQL type, required)``."""
    return [(f.name, spark_sql_type(f.field_type), f.required) for f in schema.fields]


def schema_id_counts(df, column: str = "value") -> dict[int, int]:
    """Records per schema id of the framed values in ``df[column]`` (values without the magic
    byte are left out; the decoder reports them). Runs one Spark job."""
    from pyspark.sql import functions as F

    sid = F.conv(F.hex(F.substring(F.col(column), 2, 4)), 16, 10).cast("long")
    rows = (
        df.where(F.length(column) >= 5)
        .where(F.hex(F.substring(F.col(column), 1, 1)) == "00")
        .groupBy(sid.alias("id"))
        .count()
        .collect()
    )
    return {int(r["id"]): int(r["count"]) for r in rows}
