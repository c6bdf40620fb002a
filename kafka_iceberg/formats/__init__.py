"""Schema Registry formats: Avro, Protobuf and JSON Schema in the Confluent wire format.

The write path calls, per micro-batch:

1. driver: ``ids = schema_ids(values)`` (or collect ids from the tasks), then
   ``writers = resolve(url, ids)`` -> {schema id: :class:`WriterSchema` or None}; raises
   :class:`RegistryUnavailableError` after retries. Ship ``writers`` to the tasks.
2. driver: ``plan = plan_batch(table_value_schema, writers, unknown_fields)`` -> :class:`BatchPlan`
   (changes to apply first: new optional columns, promotions; schema ids refused with a reason);
   ``classify`` gives the :class:`Evolution` of one writer.
3. task: ``decode_values(values, writers, arrow_schema(table_value_schema), fmt, plan.refused)`` ->
   :class:`Decoded` (good rows as Arrow, their input positions, one :class:`BadRecord` per bad one).

New tables: ``table_schema_from_subject(url, subject)``. Type mapping: docs/tables.md#formats.
"""

from kafka_iceberg.formats.decode import Decoded, as_struct_column, decode_values
from kafka_iceberg.formats.evolution import BatchPlan, Change, Evolution, classify, plan_batch
from kafka_iceberg.formats.resolver import (
    RegistryUnavailableError,
    SchemaNotFoundError,
    WriterSchema,
    client_config,
    resolve,
    schema_ids,
    subject_name,
)
from kafka_iceberg.formats.types import UnsupportedSchemaError, arrow_schema, iceberg_schema, table_schema_from_subject
from kafka_iceberg.formats.wire import BAD_KINDS, BadRecord, frame

FORMATS = ("avro", "protobuf", "json_schema")

__all__ = [
    "BAD_KINDS",
    "BadRecord",
    "BatchPlan",
    "Change",
    "plan_batch",
    "as_struct_column",
    "Decoded",
    "Evolution",
    "FORMATS",
    "RegistryUnavailableError",
    "SchemaNotFoundError",
    "UnsupportedSchemaError",
    "WriterSchema",
    "arrow_schema",
    "classify",
    "client_config",
    "decode_values",
    "frame",
    "iceberg_schema",
    "resolve",
    "schema_ids",
    "subject_name",
    "table_schema_from_subject",
]
