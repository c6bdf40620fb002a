"""Parsed record keys (``key_format``): the key as the struct column ``_kafka_key_parsed``.

The column is added to the table (``ALTER TABLE ... ADD COLUMN``, optional, every field optional)
when the table is ensured: its fields are ``key_format.schema`` when declared, else the latest
schema of the key subject (``<topic>-key`` under the default strategy). From then on the column is
the contract for keys; it does not evolve (new key fields are dropped, the raw key stays in
``_kafka_key`` when kept).

In the read phase, before the value is classified, :func:`parse_keys` adds two columns to the
raw records: ``_key`` (the parsed key, a struct of the column's fields; null for a null or bad
key) and ``_key_problem`` (null, or ``struct<kind, reason>``). Registry formats are decoded in the
Spark tasks like values (:func:`kafka_iceberg.formats.spark.decode_dataframe`, the writer schemas
resolved once on the driver); json keys are parsed by Spark's ``from_json``. After the value is
classified, :func:`with_key_problem` makes a bad key a bad record (the value's problem first), so
it goes to the dead-letter table with its kind (``missing_magic_byte``, ``unknown_schema_id``,
``undecodable``, ``schema``, ``malformed``) and a reason starting with ``the key``.
"""

from __future__ import annotations

import logging

from pyspark.sql import functions as F

from kafka_iceberg.declaration.format_spec import KEY_PARSED
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.formats import UnsupportedSchemaError, classify, iceberg_schema, resolve, table_schema_from_subject
from kafka_iceberg.formats.spark import ERROR, ERROR_KIND, VALUE, decode_dataframe, schema_id_counts, spark_sql_type
from kafka_iceberg.formats.transform import PROBLEM

log = logging.getLogger(__name__)

KEY = "_key"
KEY_PROBLEM = "_key_problem"
_CORRUPT = "_corrupt_record"


def key_column_type(spec: TableSpec, registry=None) -> str:
    """The Spark SQL type of ``_kafka_key_parsed``: ``STRUCT<...>`` of the declared key fields, or
    of the key subject's latest schema (every nested field optional); ``registry``: the run's
    registry settings (credentials) or None.

    Raises:
        RegistryUnavailableError, SchemaNotFoundError: from the registry.
        UnsupportedSchemaError: the key schema is not a record/object/message (e.g. an Avro ``string``).
    """
    fmt = spec.key_format
    if fmt.columns:
        return "STRUCT<" + ", ".join(f"`{n}`: {t}" for n, t, _ in fmt.columns) + ">"
    from pyiceberg.types import StructType

    schema = table_schema_from_subject(fmt.url(), fmt.subject(spec.topic, is_key=True), registry)
    return spark_sql_type(StructType(*schema.fields))


def ensure_key_column(lake, spec: TableSpec) -> None:
    """Add the optional ``_kafka_key_parsed`` column to ``spec``'s table when it has a
    ``key_format`` and lacks the column (one metadata commit; logged). ``lake``: a ``batch.context.Lake``.

    Raises:
        as :func:`key_column_type`; CatalogUnavailableError when retries run out.
    """
    if spec.key_format is None:
        return
    qualified = f"{lake.catalog_name}.{spec.identifier}"

    def exists():
        return True if KEY_PARSED in lake.spark.table(qualified).columns else None

    if lake.retry(f"table {spec.identifier}: read the table schema", exists):
        return
    typ = key_column_type(spec, lake.settings.registry)
    comment = f"the record key parsed as {spec.key_format.type}"
    lake.sql(
        f"table {spec.identifier}: add column {KEY_PARSED}",
        f"ALTER TABLE {qualified} ADD COLUMN `{KEY_PARSED}` {typ} COMMENT '{comment}'",
        before_retry=exists,
    )
    log.warning("table %s: added column %s %s (key_format %s)", spec.identifier, KEY_PARSED, typ, spec.key_format.type)


def _problem(kind, reason):
    return F.struct(kind.alias("kind"), reason.alias("reason"))


def parse_keys(lake, spec: TableSpec, raw):
    """``raw`` (:data:`kafka_iceberg.kafka.records.RAW_SCHEMA_DDL`) with ``_key`` and ``_key_problem``
    added (see the module docstring). A null key is not a bad key unless ``key_format.schema``
    has a required field.

    Raises:
        RegistryUnavailableError: the registry did not answer after retries (nothing is committed).
    """
    qualified = f"{lake.catalog_name}.{spec.identifier}"
    if spec.key_format.uses_registry:
        from pyiceberg.schema import Schema

        table = lake.retry(f"table {spec.identifier}: load the table", lambda: lake.catalog.load_table(spec.identifier))
        struct = table.schema().find_field(KEY_PARSED).field_type
        parsed = _registry_keys(spec, raw, Schema(*struct.fields), lake.settings.registry)
    else:
        struct = lake.retry(
            f"table {spec.identifier}: read the table schema",
            lambda: lake.spark.table(qualified).schema[KEY_PARSED].dataType,
        )
        parsed = _json_keys(raw, struct)
    return _required(parsed, [n for n, _, required in spec.key_format.columns if required])


def key_refusals(key_schema, writers) -> dict[int, tuple[str, str]]:
    """Key schema id -> (kind, reason) for writers that do not fit the key column: a change
    :func:`kafka_iceberg.formats.evolution.classify` calls ``blocked``, a wider type (the column
    is not promoted), or a schema with no Iceberg mapping. New fields are not refused (dropped)."""

    out = {}
    for sid, writer in sorted(writers.items()):
        if writer is None:
            continue
        try:
            ev = classify(key_schema, iceberg_schema(writer))
        except UnsupportedSchemaError as e:
            out[sid] = ("undecodable", f"key schema id {sid} has no table mapping: {e}")
            continue
        bad = ev.of("blocked") + ev.of("promotion")
        if bad:
            out[sid] = ("schema", f"key schema id {sid} does not fit {KEY_PARSED}: " + "; ".join(c.reason for c in bad))
    return out


def _registry_keys(spec: TableSpec, raw, key_schema, registry):

    writers = resolve(spec.key_format.url(), schema_id_counts(raw, "key"), registry)
    cols = list(raw.columns)
    decoded = decode_dataframe(
        raw,
        writers,
        key_schema,
        spec.key_format.type,
        keep=cols,
        column="key",
        refused=key_refusals(key_schema, writers),
    )
    problem = F.when(
        F.col("key").isNotNull() & F.col(ERROR_KIND).isNotNull(),
        _problem(F.col(ERROR_KIND), F.concat(F.lit("the key: "), F.col(ERROR))),
    )
    return decoded.select(*cols, F.when(F.col("key").isNotNull(), F.col(VALUE)).alias(KEY), problem.alias(KEY_PROBLEM))


def _json_keys(raw, struct):
    from pyspark.sql import types as T

    cols = list(raw.columns)
    text = F.col("key").cast("string")
    schema = T.StructType(list(struct.fields) + [T.StructField(_CORRUPT, T.StringType())])
    k = F.from_json(text, schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT})
    shown = F.substring(text, 1, 200)
    problem = (
        F.when(F.col("key").isNull(), F.lit(None))
        .when(
            F.col("_k").isNull()
            | (F.col(f"_k.{_CORRUPT}").isNotNull() & F.from_json(text, "MAP<STRING,STRING>").isNull()),
            _problem(F.lit("malformed"), F.concat(F.lit("the key is not a JSON object: "), shown)),
        )
        .when(
            F.col(f"_k.{_CORRUPT}").isNotNull(),
            _problem(F.lit("schema"), F.concat(F.lit(f"the key does not fit {KEY_PARSED}: "), shown)),
        )
    )
    return raw.withColumn("_k", k).select(
        *cols,
        F.when(F.col("key").isNotNull() & problem.isNull(), F.col("_k").dropFields(_CORRUPT)).alias(KEY),
        problem.alias(KEY_PROBLEM),
    )


def _required(parsed, required: list[str]):
    """A key that lacks a required declared field (or is null) is a ``schema`` bad key."""
    rule = F.col(KEY_PROBLEM)
    for name in required:
        missing = F.col(KEY).isNull() | F.col(KEY).getField(name).isNull()
        rule = F.coalesce(
            rule,
            F.when(missing, _problem(F.lit("schema"), F.lit(f"the key: required field {name} is missing or null"))),
        )
    return parsed.withColumn(KEY_PROBLEM, rule) if required else parsed


def with_key_problem(classified):
    """``classified`` with ``_problem`` set to the key's problem where the value has none."""

    return classified.withColumn(PROBLEM, F.coalesce(F.col(PROBLEM), F.col(KEY_PROBLEM)))
