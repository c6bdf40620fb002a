"""The schema of ``tables.yaml``: pydantic models, one per section, every one ``extra="forbid"``.

:mod:`kafka_iceberg.declaration.spec` validates the file with these models and turns each table into a
:class:`~kafka_iceberg.declaration.spec.TableSpec`. :func:`json_schema` is the published JSON Schema
(``docs/tables.schema.json``, written by ``lake validate --json-schema``), so editors can check
the file as it is typed. Adding a declaration field means adding it to :class:`TableDecl`
(and to :class:`Defaults` when it may be defaulted); the JSON Schema follows.

Durations are a number of seconds or a string like ``90s``, ``15m``, ``6h``, ``2d``; they are
kept as written here and converted to seconds by :func:`kafka_iceberg.declaration.spec.parse_duration_s`.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal, Union

from croniter import croniter
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kafka_iceberg.errors import ConfigError

DURATION_PATTERN = r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$"
"""A duration string: a number (group 1) and its unit (group 2: ms, s, m, h or d)."""
DURATION = re.compile(DURATION_PATTERN)
Duration = Union[float, str]  # noqa: UP007 (a runtime alias pydantic reads)
IDENTIFIER_PATTERN = r"^[a-z_][a-z0-9_]*$"
"""A lower_snake_case name: a table name, a column, or one part of ``namespace.table``."""
IDENTIFIER = re.compile(IDENTIFIER_PATTERN)
OWNER = re.compile(r"^(team:[A-Za-z0-9_.-]+|[^@\s]+@[^@\s]+\.[^@\s]+)$")
TAG_KEY = re.compile(r"^([A-Za-z0-9_.-]+/)?[A-Za-z0-9_.-]{1,63}$")
TAG_VALUE = re.compile(r"^[A-Za-z0-9_.-]{0,63}$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _duration(value: Any) -> Any:
    if isinstance(value, str) and not DURATION.match(value.strip()):
        raise ValueError(f"{value!r} is not a duration like 90s, 15m, 6h or 2d")
    return value


def check_cron(value: str) -> str:
    """``value`` if it is a valid five-field cron expression (checked with croniter); else ValueError."""
    if len(value.split()) != 5 or not croniter.is_valid(value):
        raise ValueError(f"{value!r} is not a valid five-field cron expression (minute hour day month weekday)")
    return value


class ColumnDecl(_Section):
    """One ``schema:`` entry: a column of the record value."""

    name: str = Field(pattern=IDENTIFIER_PATTERN)
    type: str = Field(
        description="string, int, long, float, double, boolean, date, timestamp, timestamp_ntz, binary, "
        "decimal(p,s), or a nested struct<...>, array<...>, map<...> in Spark SQL syntax"
    )
    required: bool = False
    doc: str | None = Field(None, description="Column documentation, shown in the Dagster UI's column schema.")


class FormatDecl(_Section):
    """``format:`` how record values (or, as ``key_format:``, keys) are encoded.

    ``json``: schemaless JSON objects. ``avro``, ``protobuf``, ``json_schema``: the Confluent wire
    format (magic byte 0, 4-byte schema id, payload) with the schemas in a Schema Registry.
    Registry credentials come from the environment (``LAKE_SCHEMA_REGISTRY_CONFIG``, a JSON object of
    client properties), never from this file.
    """

    type: Literal["json", "avro", "protobuf", "json_schema"] = Field(
        "json", description="json, or a Schema Registry format: avro, protobuf, json_schema."
    )
    registry_url: str | None = Field(
        None,
        description="Schema Registry base URL; ${VAR} is read from the environment when a batch runs. "
        "Default: ${LAKE_SCHEMA_REGISTRY_URL}.",
    )
    subject_strategy: Literal["topic_name", "record_name", "topic_record_name"] = Field(
        "topic_name", description="Subject name strategy: <topic>-value, <record>, or <topic>-<record>."
    )
    record_name: str | None = Field(
        None, description="Fully qualified record name (record_name and topic_record_name strategies)."
    )
    columns: list[ColumnDecl] | None = Field(
        None,
        alias="schema",
        description="key_format only: the fields of the parsed key (needed for json; for a "
        "registry format the key subject's latest schema when omitted).",
    )


class FreshnessDecl(_Section):
    """``freshness:`` thresholds of the freshness check and the asset's Dagster FreshnessPolicy."""

    max_snapshot_age: Duration = "1d"
    max_valid_through_age: Duration | None | bool = Field(None, description="none/off/null disables it")

    v_d = field_validator("max_snapshot_age")(_duration)

    @field_validator("max_valid_through_age")
    @classmethod
    def _vt(cls, v: Any) -> Any:
        return v if v in (None, False, "none", "off") else _duration(v)


class LagDecl(_Section):
    """``lag:`` the lag sensor's trigger and status rules (docs/operations.md#lag-status)."""

    max_offset_lag: int = Field(10_000, ge=1)
    max_interval: Duration = "15m"
    grace: Duration = "5m"
    window: int = Field(5, ge=2)
    interval: Duration = "30s"

    v_d = field_validator("max_interval", "grace", "interval")(_duration)


class MaintenanceDecl(_Section):
    """``maintenance:`` cron schedules (UTC) and settings of the table's maintenance jobs."""

    compact: str = "0 2 * * *"
    expire: str = "0 3 * * *"
    remove_orphans: str = "0 4 * * 0"
    full_check: str = "0 5 * * *"
    retain_last: int = Field(100, ge=1)
    max_snapshot_age: Duration = "7d"
    max_snapshots: int = Field(1000, ge=2)
    compact_after_data_files: int = Field(2000, ge=1)
    orphan_older_than: Duration = "3d"
    target_file_size_bytes: int = Field(128 * 1024 * 1024, ge=1)

    v_c = field_validator("compact", "expire", "remove_orphans", "full_check")(check_cron)
    v_d = field_validator("max_snapshot_age", "orphan_older_than")(_duration)


class RetentionDecl(_Section):
    """``retention:`` thresholds of the retention-headroom sensor."""

    warn_headroom: Duration = "6h"
    error_headroom: Duration = "1h"
    warn_ratio: float = Field(0.5, gt=0, le=1)
    error_ratio: float = Field(0.9, gt=0, le=1)

    v_d = field_validator("warn_headroom", "error_headroom")(_duration)


class BadRecordsDecl(_Section):
    """``bad_records:`` what happens to a record that does not fit the table."""

    policy: Literal["quarantine", "fail"] = "quarantine"
    max_quarantine_rate: float = Field(0.01, ge=0, le=1)
    max_record_bytes: int = Field(1024 * 1024, gt=0)
    dead_letter_table: str | None = None


def _owners(v: list[str]) -> list[str]:
    bad = [o for o in v if not OWNER.match(o)]
    if bad:
        raise ValueError(f"owners {bad} must be e-mail addresses or team:<name>")
    return v


def _tags(v: dict[str, str]) -> dict[str, str]:
    bad = [f"{k}={t}" for k, t in v.items() if not TAG_KEY.match(k) or not TAG_VALUE.match(str(t))]
    if bad:
        raise ValueError(f"tags {bad}: keys and values may hold letters, digits, '_', '.', '-' (63 at most)")
    return v


class _Common(_Section):
    """Fields a table may declare and ``defaults:`` may supply."""

    consumer_group: str | None = None
    format: FormatDecl | str | None = None
    key_format: FormatDecl | str | None = Field(
        None,
        description="Format of the record key; a parsed key becomes the struct column _kafka_key_parsed "
        "(raw key bytes stay in _kafka_key when kafka_columns keeps key).",
    )
    partition_by: list[str] | None = None
    kafka_columns: list[str] | None = None
    max_records_per_partition: int | None = None
    starting_position: Literal["earliest", "latest"] | datetime | None = None
    freshness: FreshnessDecl | None = None
    unknown_fields: Literal["reject", "ignore", "evolve"] | None = None
    description: str | None = None
    lag: LagDecl | None = None
    maintenance: MaintenanceDecl | None = None
    retention: RetentionDecl | None = None
    bad_records: BadRecordsDecl | None = None
    owners: list[str] | None = Field(None, description="Asset owners: e-mail addresses or team:<name>.")
    tags: dict[str, str] | None = Field(None, description="Asset tags (merged over the defaults' tags).")

    v_o = field_validator("owners")(lambda v: v if v is None else _owners(v))
    v_t = field_validator("tags")(lambda v: v if v is None else _tags(v))


class Defaults(_Common):
    """``defaults:`` merged under every table (a table's own value wins; ``tags`` merge)."""

    columns: list[ColumnDecl] | Literal["from_registry"] | None = Field(None, alias="schema")


class TableDecl(_Common):
    """One ``tables:`` entry: a Kafka topic that becomes an Iceberg table (one Dagster asset)."""

    name: str = Field(pattern=IDENTIFIER_PATTERN, description="Short name; names the sensors (<name>_lag).")
    max_records_per_partition: int | None = Field(
        100_000, description="The most offsets each partition contributes to one micro-batch."
    )
    starting_position: Literal["earliest", "latest"] | datetime | None = Field(
        "earliest", description="Where a new table starts reading: earliest, latest, or a timestamp."
    )
    unknown_fields: Literal["reject", "ignore", "evolve"] | None = Field(
        "reject",
        description="A top-level field the table does not have: reject the record, ignore the field, or evolve the table.",
    )
    identifier: str = Field(description="Iceberg namespace.table, lower_snake_case.")
    topic: str = Field(min_length=1)
    columns: Annotated[list[ColumnDecl], Field(min_length=1)] | Literal["from_registry"] = Field(
        alias="schema",
        description="The value columns, or from_registry: create the table from the subject's "
        "latest schema when it is first created (avro, protobuf, json_schema only).",
    )
    mode: Literal["append", "upsert"] = Field(
        "append", description="append keeps every record; upsert keeps one row per key (docs/cdc.md)."
    )
    key: list[str] | None = Field(
        None, description="mode upsert: the key columns (required columns; the Iceberg identifier fields)."
    )
    cdc: Literal["debezium", "none"] | None = Field(
        None,
        description="mode upsert: debezium change events, or none "
        "(plain upserts keyed by the Kafka key; a tombstone deletes).",
    )
    consistency_group: str | None = Field(
        None,
        pattern=IDENTIFIER_PATTERN,
        description="cdc debezium: tables of one source committed together (docs/cdc.md).",
    )


class TablePatternDecl(_Common):
    """One ``tables:`` entry with ``topic_pattern:``: every matching topic becomes a table of its own
    (docs/tables.md, "Tables from topic patterns"; expanded by :mod:`kafka_iceberg.declaration.patterns`)."""

    topic_pattern: str = Field(
        min_length=1, description="Python regular expression matched against the whole topic name."
    )
    name: str = Field(description="Template of each table's short name, e.g. {table} or {topic_table}.")
    identifier: str = Field(description="Template of each table's namespace.table, e.g. cdc.{schema}_{table}.")
    exclude: list[str] | None = Field(
        None,
        description="More regular expressions (whole topic name) of topics to skip, on top of the "
        "internal topics always skipped (names starting with _, Debezium schema history, heartbeat "
        "and transaction topics, Kafka Connect's own topics).",
    )
    columns: Annotated[list[ColumnDecl], Field(min_length=1)] | Literal["from_registry"] = Field(
        alias="schema", description="The value columns of every matching topic's table, or from_registry."
    )
    mode: Literal["append", "upsert"] = "append"
    key: list[str] | None = Field(None, description="mode upsert: the key columns of every matching table.")
    cdc: Literal["debezium", "none"] | None = None
    consistency_group: str | None = Field(None, pattern=IDENTIFIER_PATTERN)


class TableEntry(TableDecl):
    """A ``tables:`` entry as written, before ``defaults:`` are merged under it: ``schema`` may come
    from the defaults (the model of a Component's ``tables`` attribute)."""

    columns: Annotated[list[ColumnDecl], Field(min_length=1)] | Literal["from_registry"] | None = Field(
        None, alias="schema", description="The value columns, or from_registry (default: the defaults' schema)."
    )


class TablesAttributes(_Section):
    """The attributes of a ``KafkaIcebergTables`` Component instance (``defs.yaml``): the two keys of
    ``tables.yaml``, every field checked where it is written (``schema`` may come from ``defaults``)."""

    defaults: Defaults | None = None
    tables: list[TableEntry] = Field(default_factory=list)


class TablesFile(_Section):
    """The whole ``tables.yaml`` (each table is validated on its own, merged over the defaults)."""

    defaults: dict[str, Any] | None = None
    tables: list[dict[str, Any]] = Field(default_factory=list)


class _TablesFileSchema(_Section):
    """``tables.yaml`` for the published JSON Schema."""

    defaults: Defaults | None = None
    tables: list[TableDecl | TablePatternDecl] = Field(default_factory=list)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of ``tables.yaml`` (draft 2020-12)."""
    schema = _TablesFileSchema.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "tables.yaml: Kafka topics ingested into Iceberg tables (see docs/tables.md)"
    return schema


def describe(error: ValidationError, raw: Any, where: str) -> str:
    """One line per problem of a pydantic ``error`` for the declaration ``raw``, e.g.
    ``table t: freshness has unknown keys ['max_age']`` or ``table t: lag.window: must be >= 2``."""
    unknown: dict[tuple, list[str]] = {}
    lines = []
    for e in error.errors():
        if "literal['from_registry']" in e["loc"] and isinstance(e.get("input"), list):
            continue  # a column list: its own errors say what is wrong
        loc = tuple(
            p
            for p in e["loc"]
            if not (isinstance(p, str) and p.startswith(("function-", "json-or-python", "list[", "literal[")))
        )
        if e["type"] == "extra_forbidden":
            unknown.setdefault(loc[:-1], []).append(str(loc[-1]))
            continue
        lines.append(f"{where}: {_message(e, _path(loc, raw))}")
    for parent, keys in unknown.items():
        what = _path(parent, raw) if parent else ""
        lines.insert(0, f"{where}: {what + ' has ' if what else ''}unknown keys {sorted(keys)}")
    return "; ".join(lines)


def _path(loc: tuple, raw: Any) -> str:
    out, node = [], raw
    for _i, part in enumerate(loc):
        if isinstance(part, int):
            entry = node[part] if isinstance(node, list) and part < len(node) else None
            name = entry.get("name") if isinstance(entry, dict) else None
            out[-1:] = [
                f"{out[-1] if out else ''} entry {name!r}" if name else f"{out[-1] if out else ''} entry {part}"
            ]
        else:
            out.append(str(part))
        node = (
            node.get(part)
            if isinstance(node, dict) and isinstance(part, str)
            else (node[part] if isinstance(node, list) and isinstance(part, int) and part < len(node) else None)
        )
    return ".".join(out)


_MESSAGES = {
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _message(e: dict, path: str) -> str:
    """``path`` and what is wrong with it, e.g. ``bad_records needs max_quarantine_rate <= 1, got 2``."""
    kind, got, ctx = e["type"], e.get("input"), e.get("ctx") or {}
    if kind in _MESSAGES:
        return f"{path} {_MESSAGES[kind]}, got {got!r}"
    if kind in _BOUNDS:
        limit = next(iter(ctx.values()), "?")
        parent, _, leaf = path.rpartition(".")
        return f"{parent + ' needs ' if parent else ''}{leaf} {_BOUNDS[kind]} {limit}, got {got!r}"
    if kind == "literal_error":
        return f"{path} must be one of {ctx.get('expected')}, got {got!r}"
    if kind == "missing":
        return f"'{path}' is required"
    return f"{path}: {e['msg'].removeprefix('Value error, ')}"


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration_s(value: Any, where: str) -> float:
    """Parse ``"90s"``, ``"15m"``, ``"6h"``, ``"2d"`` or a number of seconds into seconds.

    Raises:
        ConfigError: naming ``where`` when the value is not a duration.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = DURATION.match(str(value).strip())
    if not m:
        raise ConfigError(f"{where}: {value!r} is not a duration like 90s, 15m, 6h or 2d")
    return float(m.group(1)) * _UNITS[m.group(2)]
