"""Table declarations: the YAML file that turns a Kafka topic into an Iceberg table.

Adding a table means adding an entry to a ``defs.yaml`` of the
:class:`~kafka_iceberg.lake_assets.component.KafkaIcebergTables` Component (or to the file named
by ``LAKE_TABLES_FILE``); no Python code changes. The format is documented in
``docs/tables.md``; its schema is the pydantic models of :mod:`kafka_iceberg.declaration.models`
(published as ``docs/tables.schema.json``). Loading validates everything up front and raises
:class:`~kafka_iceberg.errors.ConfigError` naming the table and field at fault; the
dataclasses here are what the rest of the code reads.
"""

from __future__ import annotations

import re
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
from kafka_iceberg.declaration.models import (
    BadRecordsDecl,
    Defaults,
    FreshnessDecl,
    LagDecl,
    MaintenanceDecl,
    RetentionDecl,
    TableDecl,
    TablesFile,
    describe,
    parse_duration_s,
)
from kafka_iceberg.declaration.patterns import expand_entries
from kafka_iceberg.declaration.upsert import UpsertSpec, upsert_spec
from kafka_iceberg.errors import ConfigError
from kafka_iceberg.ops.retention import RetentionPolicy

IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*$")
"""A lower_snake_case name: a table name, a column, or one part of ``namespace.table``."""


@dataclass(frozen=True)
class StartingPosition:
    """Where a new table starts reading: ``earliest``, ``latest``, or a timestamp (ms since epoch)."""

    kind: str  # "earliest" | "latest" | "timestamp"
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class FreshnessPolicy:
    """Freshness thresholds, in seconds.

    ``max_snapshot_age_s``: the latest snapshot must be younger than this, unless the table
    has no lag (nothing to ingest is not staleness).
    ``max_valid_through_age_s``: now minus the snapshot's valid-through timestamp; ``None``
    disables it (for replays of historical data, where event time is years old).
    """

    max_snapshot_age_s: float
    max_valid_through_age_s: float | None


@dataclass(frozen=True)
class LagPolicy:
    """When the lag sensor triggers a micro-batch, and how it evaluates lag.

    ``max_offset_lag`` (records by offset, summed over partitions): trigger at or above it.
    ``max_interval_s``: trigger when any lag is left and the last commit is older than this
    (the micro-batch cadence). ``grace_s``: how much longer than ``max_interval_s`` a table
    with lag may go without a commit before it is STOP. ``window``: the commits across which
    growing lag makes it WARN. ``interval_s``: seconds between sensor evaluations.
    See :mod:`kafka_iceberg.ops.lag`.
    """

    max_offset_lag: int = 10_000
    max_interval_s: float = 900.0
    window: int = 5
    interval_s: float = 30.0
    grace_s: float = 300.0


@dataclass(frozen=True)
class MaintenancePolicy:
    """Maintenance schedules (cron, UTC) and their settings for one table.

    ``retain_last`` (snapshots) and ``max_snapshot_age_s`` drive ``expire_snapshots``;
    ``orphan_older_than_s`` is ``remove_orphan_files``' safety window (>= 24 h, longer than
    the longest micro-batch); ``target_file_size_bytes`` drives ``rewrite_data_files``;
    ``full_check_cron``: the full-scan ``duplicate_free`` check (after a run it is incremental).
    """

    compact_cron: str = "0 2 * * *"
    expire_cron: str = "0 3 * * *"
    remove_orphans_cron: str = "0 4 * * 0"
    retain_last: int = 100
    max_snapshot_age_s: float = 7 * 86400.0
    orphan_older_than_s: float = 3 * 86400.0
    target_file_size_bytes: int = 128 * 1024 * 1024
    full_check_cron: str = "0 5 * * *"
    pinned: tuple[str, ...] = ()  # crons the table declares itself (run as written; others spread, ops/spread.py)


@dataclass(frozen=True)
class BadRecordPolicy:
    """What happens to a record that does not fit the table (see docs/tables.md#bad-records).

    ``policy``: ``quarantine`` writes it to the dead-letter table in the same micro-batch as
    the good records; ``fail`` fails the run and commits nothing.
    ``max_quarantine_rate``: the ``quarantine`` asset check fails when the latest micro-batch
    quarantined more than this fraction (0..1) of the records it read.
    ``max_record_bytes``: a record whose key plus value is larger (bytes) is a bad record.
    ``dead_letter_identifier``: the dead-letter Iceberg table (``namespace.table``).
    """

    policy: str = "quarantine"
    max_quarantine_rate: float = 0.01
    max_record_bytes: int = 1024 * 1024
    dead_letter_identifier: str = ""


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
    description: str = ""
    bad_records: BadRecordPolicy = BadRecordPolicy()
    lag: LagPolicy = LagPolicy()
    maintenance: MaintenancePolicy = MaintenancePolicy()
    retention: RetentionPolicy = RetentionPolicy()
    owners: tuple[str, ...] = ()  # e-mail addresses or team:<name> (Dagster asset owners)
    tags: tuple[tuple[str, str], ...] = ()  # (key, value) pairs (Dagster asset tags)
    format: FormatSpec = FormatSpec()
    key_format: FormatSpec | None = None
    columns_from_registry: bool = False  # schema: from_registry (columns come from the subject at creation)
    upsert: UpsertSpec | None = None  # mode: upsert (key and cdc, docs/cdc.md); None for append

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
        return StartingPosition(value)
    ts = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return StartingPosition("timestamp", int(ts.timestamp() * 1000))


def _maintenance(m: MaintenanceDecl, where: str, own: dict) -> MaintenancePolicy:
    orphan_s = parse_duration_s(m.orphan_older_than, f"{where} maintenance.orphan_older_than")
    if orphan_s < 86400:
        raise ConfigError(f"{where}: maintenance.orphan_older_than must be at least 24h (longer than any micro-batch)")
    return MaintenancePolicy(
        m.compact,
        m.expire,
        m.remove_orphans,
        m.retain_last,
        parse_duration_s(m.max_snapshot_age, f"{where} maintenance.max_snapshot_age"),
        orphan_s,
        m.target_file_size_bytes,
        m.full_check,
        tuple(k for k in ("compact", "expire", "remove_orphans", "full_check") if k in own),
    )


def _retention(r: RetentionDecl, where: str) -> RetentionPolicy:
    policy = RetentionPolicy(
        parse_duration_s(r.warn_headroom, where), parse_duration_s(r.error_headroom, where), r.warn_ratio, r.error_ratio
    )
    if not (policy.error_headroom_s <= policy.warn_headroom_s and policy.warn_ratio <= policy.error_ratio):
        raise ConfigError(
            f"{where}: retention needs error_headroom <= warn_headroom and 0 < warn_ratio <= error_ratio <= 1"
        )
    return policy


def _bad_records(b: BadRecordsDecl, where: str, identifier: str) -> BadRecordPolicy:
    dlq = b.dead_letter_table or f"{identifier}_dead_letter"
    parts = dlq.split(".")
    if len(parts) < 2 or not all(IDENTIFIER.match(p) for p in parts) or dlq == identifier:
        raise ConfigError(
            f"{where}: bad_records.dead_letter_table {dlq!r} must be another namespace.table in lower_snake_case"
        )
    return BadRecordPolicy(b.policy, b.max_quarantine_rate, b.max_record_bytes, dlq)


def _lag(lag: LagDecl, where: str) -> LagPolicy:
    return LagPolicy(
        lag.max_offset_lag,
        parse_duration_s(lag.max_interval, f"{where} lag.max_interval"),
        lag.window,
        parse_duration_s(lag.interval, f"{where} lag.interval"),
        parse_duration_s(lag.grace, f"{where} lag.grace"),
    )


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
    bound = 100_000 if decl.max_records_per_partition is None else decl.max_records_per_partition
    if bound <= 0:
        raise ConfigError(f"{where}: max_records_per_partition must be positive")
    upsert = upsert_spec(where, decl.mode, decl.key, decl.cdc, columns)
    if upsert is not None and decl.unknown_fields == "evolve":
        raise ConfigError(f"{where}: unknown_fields: evolve is not supported with mode: upsert")
    fresh = decl.freshness or FreshnessDecl()
    vt = fresh.max_valid_through_age if "max_valid_through_age" in fresh.model_fields_set else fresh.max_snapshot_age
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
        starting_position=_parse_starting_position(decl.starting_position or "earliest"),
        freshness=FreshnessPolicy(
            parse_duration_s(fresh.max_snapshot_age, f"{where} freshness.max_snapshot_age"),
            None
            if vt in (None, False, "none", "off")
            else parse_duration_s(vt, f"{where} freshness.max_valid_through_age"),
        ),
        unknown_fields=decl.unknown_fields or "reject",
        bad_records=_bad_records(decl.bad_records or BadRecordsDecl(), where, identifier),
        description=(decl.description or "").strip(),
        lag=_lag(decl.lag or LagDecl(), where),
        maintenance=_maintenance(decl.maintenance or MaintenanceDecl(), where, raw.get("maintenance") or {}),
        retention=_retention(decl.retention or RetentionDecl(), where),
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
