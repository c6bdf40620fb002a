"""The formats inside Spark: schema ids of a DataFrame of raw records, and decoding in the tasks.

For the write path, per micro-batch::

    ids = schema_ids_in(raw_df)                  # one small Spark job: distinct 4-byte ids
    writers = resolve(url, ids)                  # driver, once per id (cached for good)
    decoded = decode_dataframe(raw_df, writers, table_value_schema, "avro")

``decoded`` has the raw columns asked for, then the table's value columns (all nullable), then
``_format_error_kind`` and ``_format_error``: null for a good record, else the bad-record kind
(:data:`kafka_iceberg.formats.wire.BAD_KINDS`) and reason. The writer schemas travel to the tasks
inside the ``mapInArrow`` closure; tasks never call the registry.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import pyarrow as pa

from kafka_iceberg.formats.resolver import WriterSchema

ERROR_KIND = "_format_error_kind"
ERROR = "_format_error"


def schema_ids_in(df, column: str = "value") -> set[int]:
    """The distinct schema ids of the framed values in ``df[column]`` (values without the magic
    byte are left out; the decoder reports them). Runs one Spark job."""
    from pyspark.sql import functions as F

    head = F.substring(F.col(column), 1, 5)
    rows = (df.where(F.length(column) >= 5).where(F.hex(F.substring(F.col(column), 1, 1)) == "00")
            .select(F.conv(F.hex(F.substring(head, 2, 4)), 16, 10).cast("long").alias("id")).distinct().collect())
    return {int(r["id"]) for r in rows}


def output_schema(value_schema: pa.Schema, keep: pa.Schema) -> pa.Schema:
    """Arrow schema of :func:`decode_dataframe`'s output: kept columns, value columns (nullable),
    then the two error columns."""
    values = [f.with_nullable(True) for f in value_schema]
    return pa.schema(list(keep) + values + [pa.field(ERROR_KIND, pa.string()), pa.field(ERROR, pa.string())])


def decode_batch(batch: pa.RecordBatch, writers: Mapping[int, WriterSchema | None], value_schema: pa.Schema,
                 fmt: str, keep: Sequence[str], out_schema: pa.Schema, column: str = "value") -> pa.RecordBatch:
    """One input batch -> one output batch with a row per input row (see the module docstring)."""
    from kafka_iceberg.formats.decode import decode_values

    n = batch.num_rows
    result = decode_values(batch.column(column).to_pylist(), writers, value_schema, fmt)
    where = [None] * n
    for row, i in enumerate(result.row_index):
        where[i] = row
    taken = result.rows.take(pa.array(where, pa.int64()))
    kinds, reasons = [None] * n, [None] * n
    for b in result.bad:
        kinds[b.index], reasons[b.index] = b.kind, b.reason
    arrays = [batch.column(k) for k in keep] + [taken.column(f.name).combine_chunks() for f in value_schema]
    arrays += [pa.array(kinds, pa.string()), pa.array(reasons, pa.string())]
    return pa.RecordBatch.from_arrays(arrays, schema=out_schema)


def decode_dataframe(df, writers: Mapping[int, WriterSchema | None], table_schema, fmt: str,
                     keep: Sequence[str] = ("partition", "offset"), column: str = "value"):
    """``df`` (raw records with a binary ``column``) decoded in the Spark tasks (``mapInArrow``).

    ``table_schema``: the table's value columns as a pyiceberg ``Schema``. ``writers``: from
    :func:`kafka_iceberg.formats.resolve` on the driver.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    from kafka_iceberg.formats.types import arrow_schema

    value_schema = arrow_schema(table_schema)
    keep = list(keep)
    keep_schema = pa.schema([pa.field(f.name, _spark_to_arrow(f.dataType)) for f in df.schema.fields
                             if f.name in keep])
    keep_schema = pa.schema([keep_schema.field(k) for k in keep])
    out_schema = output_schema(value_schema, keep_schema)
    writers = dict(writers)

    def run(batches):
        for b in batches:
            yield decode_batch(b, writers, value_schema, fmt, keep, out_schema, column)

    return df.select(*keep, column).mapInArrow(run, from_arrow_schema(out_schema))


def _spark_to_arrow(t) -> pa.DataType:
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(t)
