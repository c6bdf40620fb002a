"""Declared columns: their types (Spark SQL names) and the Kafka metadata columns a table may keep."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kafka_iceberg.errors import ConfigError

# Declared type -> Spark SQL type. Spark's Iceberg writer maps these to Iceberg types
# (int, long, float, double, boolean, string, binary, date, timestamptz, decimal).
_SIMPLE_TYPES = {
    "string": "STRING",
    "int": "INT",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "boolean": "BOOLEAN",
    "date": "DATE",
    "timestamp": "TIMESTAMP",
    "timestamp_ntz": "TIMESTAMP_NTZ",
    "binary": "BINARY",
}
_NESTED = re.compile(r"^(struct|array|map)<.+>$", re.DOTALL)
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
KAFKA_COLUMNS = {
    # declared name -> (column name in the table, Spark SQL type)
    "topic": ("_kafka_topic", "STRING"),
    "partition": ("_kafka_partition", "INT"),
    "offset": ("_kafka_offset", "BIGINT"),
    "timestamp": ("_kafka_timestamp", "TIMESTAMP"),
    "key": ("_kafka_key", "BINARY"),
    "headers": ("_kafka_headers", "ARRAY<STRUCT<key: STRING, value: BINARY>>"),
}
"""Kafka metadata columns a table may keep. ``partition`` and ``offset`` are always kept:
they are what the duplicate-free check and exactly-once verification are keyed on."""

REQUIRED_KAFKA_COLUMNS = ("partition", "offset")


@dataclass(frozen=True)
class ColumnSpec:
    """One declared column of the JSON value: its name, declared type and nullability."""

    name: str
    type: str  # declared type, e.g. "long" or "decimal(10,2)"
    required: bool = False
    doc: str | None = None

    @property
    def spark_type(self) -> str:
        """The Spark SQL type name for this column (e.g. ``BIGINT``)."""
        m = _DECIMAL.match(self.type)
        if m:
            return f"DECIMAL({m.group(1)},{m.group(2)})"
        return self.type if _NESTED.match(self.type) else _SIMPLE_TYPES[self.type]


def parse_columns(declared, where: str) -> tuple[ColumnSpec, ...]:
    """The declared columns (``ColumnDecl`` models, or ``"from_registry"`` for none) as
    :class:`ColumnSpec` values; ``where`` names the declaration in errors.

    Raises:
        ConfigError: an unsupported type, a duplicate name, or a name of a Kafka metadata column.
    """
    columns = []
    for col in () if declared == "from_registry" else declared:
        ctype = col.type.strip().lower()
        if ctype not in _SIMPLE_TYPES and not _DECIMAL.match(ctype) and not _NESTED.match(ctype):
            raise ConfigError(
                f"{where}: column {col.name!r} has unsupported type {ctype!r}; supported: "
                f"{sorted(_SIMPLE_TYPES)}, decimal(p,s) and struct<...>, array<...>, map<...>"
            )
        columns.append(ColumnSpec(col.name, ctype, col.required, col.doc))
    names = [c.name for c in columns]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: duplicate column names in schema")
    clashes = sorted(set(names) & {c for c, _ in KAFKA_COLUMNS.values()})
    if clashes:
        raise ConfigError(f"{where}: schema columns {clashes} collide with Kafka metadata column names")
    return tuple(columns)


_TRANSFORM = re.compile(
    r"^(identity|years|months|days|hours)\((\w+)\)$|^bucket\((\d+),\s*(\w+)\)$|^truncate\((\d+),\s*(\w+)\)$|^(\w+)$"
)


def parse_partition_by(declared: list[str] | None, known: set[str] | None, where: str) -> tuple[str, ...]:
    """The ``partition_by`` transforms; ``known``: the table's columns (None: not known yet, the columns
    come from the registry).

    Raises:
        ConfigError: an entry is not a transform, or names an unknown column.
    """
    partition_by = tuple(str(p).strip() for p in declared or ())
    for p in partition_by:
        m = _TRANSFORM.match(p)
        if not m:
            raise ConfigError(
                f"{where}: partition_by entry {p!r} is not a transform like days(col), bucket(16, col) or col"
            )
        source = next(g for g in (m.group(2), m.group(4), m.group(6), m.group(7)) if g)
        if known is not None and source not in known:
            raise ConfigError(f"{where}: partition_by {p!r} refers to unknown column {source!r}")
    return partition_by
