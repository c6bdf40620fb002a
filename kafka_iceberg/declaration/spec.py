"""Table declarations: the YAML file that turns a Kafka topic into an Iceberg table.

Adding a table means adding an entry to a ``defs.yaml`` of the
:class:`~kafka_iceberg.lake_assets.component.KafkaIcebergTables` Component (or to the file named
by ``LAKE_TABLES_FILE``); no Python code changes. The format is documented in
``docs/tables.md``; its schema is the pydantic models of :mod:`kafka_iceberg.declaration.models`
(published as ``docs/tables.schema.json``). Loading validates everything up front and raises
:class:`~kafka_iceberg.errors.ConfigError` naming the table and field at fault; the
dataclasses here are what the rest of the code reads. Every default and pattern of the
declaration is written once, in those models; the dataclasses have no defaults of their own and
are built from validated models (``tests/test_declaration_defaults.py`` holds it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timezone
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kafka_iceberg.declaration.columns import (  # noqa: F401 (re-exported)
    _DECIMAL,
    _NESTED,
    _SIMPLE_TYPES,
    KAFKA_COLUMNS,
    REQUIRED_KAFKA_COLUMNS,
    ColumnSpec,
    parse_columns,
    parse_partition_by,
)
from kafka_iceberg.declaration.format_spec import (  # noqa: F401 (re-exported)
    REGISTRY_FORMATS,
    VALUE_FORMATS,
    FormatSpec,
    parse_format,
    parse_key_format,
)
from kafka_iceberg.declaration.groups import check_groups
from kafka_iceberg.declaration.models import (
    IDENTIFIER,
    BadRecordsDecl,
    Defaults,
    FreshnessDecl,
    LagDecl,
    MaintenanceDecl,
    RetentionDecl,
    TableDecl,
    TablesFile,
    describe,
    parse_duration_s,  # noqa: F401 (re-exported)
)
from kafka_iceberg.declaration.patterns import expand_entries
from kafka_iceberg.declaration.policies import (  # noqa: F401 (re-exported)
    BadRecordPolicy,
    FreshnessPolicy,
    LagPolicy,
    MaintenancePolicy,
    RetentionPolicy,
    bad_record_policy,
    freshness_policy,
    lag_policy,
    maintenance_policy,
    retention_policy,
)
from kafka_iceberg.declaration.upsert import UpsertSpec, upsert_spec
from kafka_iceberg.errors import ConfigError


@dataclass(frozen=True)
class StartingPosition:
    """Where a new table starts reading: ``earliest``, ``latest``, or a timestamp (ms since epoch)."""

    kind: str  # "earliest" | "latest" | "timestamp"
    timestamp_ms: int | None


@dataclass(frozen=True)
class TableSpec:
    """A declared Kafka-topic-to-Iceberg-table mapping (one Dagster asset each)."""

    name: str  # short name of the declared table, e.g. "flights" (the asset key is lake/<identifier>)
    identifier: str  # Iceberg "namespace.table" inside the catalog
    topic: str
    consumer_group: str
    value_format: str
    columns: tuple[ColumnSpec, ...]
    partition_by: tuple[str, ...]
    kafka_columns: tuple[str, ...]
    max_records_per_partition: int
    starting_position: StartingPosition
    freshness: FreshnessPolicy
    unknown_fields: str  # "reject" | "ignore" | "evolve"
    description: str
    bad_records: BadRecordPolicy
    lag: LagPolicy
    maintenance: MaintenancePolicy
    retention: RetentionPolicy
    owners: tuple[str, ...]  # e-mail addresses or team:<name> (Dagster asset owners)
    tags: tuple[tuple[str, str], ...]  # (key, value) pairs (Dagster asset tags)
    format: FormatSpec
    key_format: FormatSpec | None
    columns_from_registry: bool  # schema: from_registry (columns come from the subject at creation)
    upsert: UpsertSpec | None  # mode: upsert (key and cdc, docs/cdc.md); None for append

    @property
    def namespace(self) -> str:
        """The Iceberg namespace part of :attr:`identifier`."""
        return self.identifier.rsplit(".", 1)[0]

    def kafka_column(self, declared: str) -> str:
        """Table column name of a kept Kafka metadata column (e.g. ``offset`` -> ``_kafka_offset``)."""
        return KAFKA_COLUMNS[declared][0]

    def table_columns(self) -> list[tuple[str, str, bool]]:
        """All table columns as (name, Spark SQL type, required), value columns first."""
        cols = [(c.name, c.spark_type, c.required) for c in self.columns]
        cols += [(KAFKA_COLUMNS[k][0], KAFKA_COLUMNS[k][1], k in REQUIRED_KAFKA_COLUMNS) for k in self.kafka_columns]
        return cols


def _parse_starting_position(value: Any) -> StartingPosition:
    if value in ("earliest", "latest"):
        return StartingPosition(value, None)
    ts = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return StartingPosition("timestamp", int(ts.timestamp() * 1000))


def _or_default(decl: TableDecl, field: str) -> Any:
    """``decl``'s value of ``field``, or the field's default in :class:`TableDecl` when unset or null."""
    value = getattr(decl, field)
    return TableDecl.model_fields[field].default if value is None else value


def _kafka_columns(declared: list[str] | None, where: str) -> tuple[str, ...]:
    for k in declared or ():
        if k not in KAFKA_COLUMNS:
            raise ConfigError(f"{where}: kafka_columns entry {k!r} is not one of {sorted(KAFKA_COLUMNS)}")
    kept = set(declared or ()) | set(REQUIRED_KAFKA_COLUMNS)
    return tuple(k for k in KAFKA_COLUMNS if k in kept)  # canonical order


def _validate(raw: Any, defaults: dict[str, Any]) -> tuple[TableDecl, str]:
    """The table declaration ``raw`` merged over ``defaults`` (``tags`` merge), validated."""
    if not isinstance(raw, dict):
        raise ConfigError(f"every tables entry must be a mapping, got {raw!r}")
    merged = {**defaults, **raw}
    if isinstance(defaults.get("tags"), dict) and isinstance(raw.get("tags"), dict):
        merged["tags"] = {**defaults["tags"], **raw["tags"]}
    name = merged.get("name")
    if not isinstance(name, str) or not IDENTIFIER.match(name):
        raise ConfigError(f"table name {name!r} must match {IDENTIFIER.pattern}")
    where = f"table {name}"
    try:
        return TableDecl.model_validate(merged), where
    except ValidationError as exc:
        raise ConfigError(describe(exc, merged, where)) from None


def _parse_table(raw: Any, defaults: dict[str, Any]) -> TableSpec:
    decl, where = _validate(raw, defaults)
    identifier = decl.identifier
    parts = identifier.split(".")
    if len(parts) < 2 or not all(IDENTIFIER.match(p) for p in parts):
        raise ConfigError(f"{where}: identifier {identifier!r} must be namespace.table in lower_snake_case")
    fmt = parse_format(decl.format, where, "format")
    key_format = parse_key_format(decl, where)
    from_registry = decl.columns == "from_registry"
    if from_registry and not fmt.uses_registry:
        raise ConfigError(f"{where}: schema: from_registry needs a registry format (avro, protobuf or json_schema)")
    columns = parse_columns(decl.columns, where)
    kafka_columns = _kafka_columns(decl.kafka_columns, where)
    bound = _or_default(decl, "max_records_per_partition")
    if bound <= 0:
        raise ConfigError(f"{where}: max_records_per_partition must be positive")
    upsert = upsert_spec(where, decl.mode, decl.key, decl.cdc, columns, decl.consistency_group)
    if upsert is not None and decl.unknown_fields == "evolve":
        raise ConfigError(f"{where}: unknown_fields: evolve is not supported with mode: upsert")
    return TableSpec(
        name=decl.name,
        identifier=identifier,
        topic=decl.topic,
        consumer_group=decl.consumer_group or f"lake.{identifier}",
        value_format=fmt.type,
        columns=columns,
        partition_by=parse_partition_by(
            decl.partition_by,
            None if from_registry else {c.name for c in columns} | {KAFKA_COLUMNS[k][0] for k in kafka_columns},
            where,
        ),
        kafka_columns=kafka_columns,
        max_records_per_partition=bound,
        starting_position=_parse_starting_position(_or_default(decl, "starting_position")),
        freshness=freshness_policy(decl.freshness or FreshnessDecl(), where),
        unknown_fields=_or_default(decl, "unknown_fields"),
        bad_records=bad_record_policy(decl.bad_records or BadRecordsDecl(), where, identifier),
        description=(decl.description or "").strip(),
        lag=lag_policy(decl.lag or LagDecl(), where),
        maintenance=maintenance_policy(decl.maintenance or MaintenanceDecl(), where, raw.get("maintenance") or {}),
        retention=retention_policy(decl.retention or RetentionDecl(), where),
        owners=tuple(decl.owners or ()),
        tags=tuple(sorted((decl.tags or {}).items())),
        format=fmt,
        key_format=key_format,
        columns_from_registry=from_registry,
        upsert=upsert,
    )


def load_table_specs(path: Path | str, list_topics: Callable[[], list[str] | None] | None = None) -> list[TableSpec]:
    """Every table declared in the YAML file at ``path`` (:func:`parse_declarations`, with
    ``list_topics`` for ``topic_pattern:`` entries); ConfigError when the file is missing, not YAML, or a
    declaration is invalid."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as exc:
        raise ConfigError(f"table declarations file {path} does not exist") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    return parse_declarations(doc, str(path), list_topics)


def parse_declarations(
    doc: Any, where: str, list_topics: Callable[[], list[str] | None] | None = None
) -> list[TableSpec]:
    """The specs, in order, of a declarations mapping ``doc`` (``defaults`` merged under every entry of
    ``tables``; tables.yaml or a Component's attributes). A ``topic_pattern:`` entry gives one table per
    matching topic of ``list_topics()`` (called once, only when a pattern is declared; none when it is
    None or returns None; :mod:`kafka_iceberg.declaration.patterns`). ConfigError, prefixed ``where``,
    when a declaration is invalid or two tables share a name, identifier or topic."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: the declarations must be a mapping with 'defaults' and 'tables'")
    try:
        top = TablesFile.model_validate(doc)
    except ValidationError as exc:
        raise ConfigError(describe(exc, doc, where)) from None
    try:
        Defaults.model_validate(top.defaults or {})
    except ValidationError as exc:
        raise ConfigError(
            describe(exc, top.defaults, f"{where}: defaults").replace("defaults: unknown", "defaults has unknown")
        ) from None
    specs = [_parse_table(t, base) for t, base in expand_entries(top.tables, top.defaults or {}, list_topics)]
    check_unique(specs, where)
    check_groups(specs, where)
    return specs


def check_unique(specs: list[TableSpec], where: str) -> None:
    """ConfigError (prefixed ``where``) when two ``specs`` share a name, identifier, topic or table."""
    for attr in ("name", "identifier", "topic"):
        values = [getattr(s, attr) for s in specs]
        dupes = {v for v in values if values.count(v) > 1}
        if dupes:
            raise ConfigError(f"{where}: {attr} must be unique across tables, repeated: {sorted(dupes)}")
    tables = [s.identifier for s in specs] + [s.bad_records.dead_letter_identifier for s in specs]
    clashes = {t for t in tables if tables.count(t) > 1}
    if clashes:
        raise ConfigError(
            f"{where}: every table and dead-letter table needs its own identifier, repeated: {sorted(clashes)}"
        )


def find_table(specs: list[TableSpec], name: str) -> TableSpec:
    """The declared table whose ``name`` or ``identifier`` is ``name`` (``flights`` or ``nyc.flights``);
    ConfigError, listing the declared tables, when there is none."""
    for spec in specs:
        if name in (spec.name, spec.identifier):
            return spec
    raise ConfigError(f"unknown table {name!r}; declared: {[s.name for s in specs]}")


def parse_table_spec(raw: dict[str, Any], defaults: dict[str, Any] | None = None) -> TableSpec:
    """Validate one table declaration (a ``tables:`` entry, as a dict) merged over ``defaults``;
    ConfigError naming the table and the field at fault."""
    return _parse_table(raw, defaults or {})
