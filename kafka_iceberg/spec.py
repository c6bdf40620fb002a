"""Table declarations: the YAML file that turns a Kafka topic into an Iceberg table.

Adding a table means adding an entry to ``lake_assets/tables.yaml`` (or the file named
by ``LAKE_TABLES_FILE``); no Python code changes. The format is documented in
``docs/tables.md``. Loading validates everything up front and raises
:class:`~kafka_iceberg.errors.ConfigError` naming the table and field at fault.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from kafka_iceberg.errors import ConfigError
from kafka_iceberg.retention import RetentionPolicy

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
    "binary": "BINARY",
}
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
_TRANSFORM = re.compile(r"^(identity|years|months|days|hours)\((\w+)\)$|^bucket\((\d+),\s*(\w+)\)$|^truncate\((\d+),\s*(\w+)\)$|^(\w+)$")
IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*$")
"""A lower_snake_case name: a table name, a column, or one part of ``namespace.table``."""

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

_REQUIRED_KAFKA_COLUMNS = ("partition", "offset")
VALUE_FORMATS = ("json",)  # "avro" with a schema registry is the next one; see docs/tables.md


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
        return f"DECIMAL({m.group(1)},{m.group(2)})" if m else _SIMPLE_TYPES[self.type]


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
    See :mod:`kafka_iceberg.lag`.
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
    the longest micro-batch); ``target_file_size_bytes`` drives ``rewrite_data_files``.
    """

    compact_cron: str = "0 2 * * *"
    expire_cron: str = "0 3 * * *"
    remove_orphans_cron: str = "0 4 * * 0"
    retain_last: int = 100
    max_snapshot_age_s: float = 7 * 86400.0
    orphan_older_than_s: float = 3 * 86400.0
    target_file_size_bytes: int = 128 * 1024 * 1024


BAD_RECORD_POLICIES = ("quarantine", "fail")
UNKNOWN_FIELD_POLICIES = ("reject", "ignore", "evolve")


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
        cols += [(KAFKA_COLUMNS[k][0], KAFKA_COLUMNS[k][1], k in _REQUIRED_KAFKA_COLUMNS) for k in self.kafka_columns]
        return cols


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration_s(value: Any, where: str) -> float:
    """Parse ``"90s"``, ``"15m"``, ``"6h"``, ``"2d"`` or a number of seconds into seconds.

    Raises:
        ConfigError: naming ``where`` when the value is not a duration.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = _DURATION.match(str(value).strip())
    if not m:
        raise ConfigError(f"{where}: {value!r} is not a duration like 90s, 15m, 6h or 2d")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _parse_starting_position(value: Any, where: str) -> StartingPosition:
    if value in ("earliest", "latest"):
        return StartingPosition(value)
    try:
        ts = value if isinstance(value, datetime) else datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError as exc:
        raise ConfigError(f"{where}: starting_position must be earliest, latest or an ISO-8601 timestamp, got {value!r}") from exc
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=timezone.utc)
    return StartingPosition("timestamp", int(ts.timestamp() * 1000))


def _check_keys(raw: dict[str, Any], known: set[str], what: str) -> None:
    """Raise ConfigError ``<what> has unknown keys [...]`` for keys of ``raw`` outside ``known``."""
    extra = set(raw) - known
    if extra:
        raise ConfigError(f"{what} has unknown keys {sorted(extra)}")


_CRON = re.compile(r"^\S+(\s+\S+){4}$")


def _parse_maintenance(raw: dict[str, Any], where: str) -> MaintenancePolicy:
    keys = {"compact", "expire", "remove_orphans", "retain_last", "max_snapshot_age", "orphan_older_than",
            "target_file_size_bytes"}
    _check_keys(raw, keys, f"{where}: maintenance")
    d = MaintenancePolicy()
    crons = {k: str(raw.get(k, default)) for k, default in
             (("compact", d.compact_cron), ("expire", d.expire_cron), ("remove_orphans", d.remove_orphans_cron))}
    for k, cron in crons.items():
        if not _CRON.match(cron):
            raise ConfigError(f"{where}: maintenance.{k} {cron!r} is not a five-field cron expression")
    try:
        retain_last = int(raw.get("retain_last", d.retain_last))
        target = int(raw.get("target_file_size_bytes", d.target_file_size_bytes))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: maintenance.retain_last and target_file_size_bytes must be whole numbers") from exc
    orphan_s = parse_duration_s(raw.get("orphan_older_than", d.orphan_older_than_s), f"{where} maintenance.orphan_older_than")
    if retain_last < 1:
        raise ConfigError(f"{where}: maintenance.retain_last must be >= 1 (the newest ingest snapshot holds the offsets)")
    if orphan_s < 86400:
        raise ConfigError(f"{where}: maintenance.orphan_older_than must be at least 24h (longer than any micro-batch)")
    return MaintenancePolicy(
        compact_cron=crons["compact"],
        expire_cron=crons["expire"],
        remove_orphans_cron=crons["remove_orphans"],
        retain_last=retain_last,
        max_snapshot_age_s=parse_duration_s(raw.get("max_snapshot_age", d.max_snapshot_age_s), f"{where} maintenance.max_snapshot_age"),
        orphan_older_than_s=orphan_s,
        target_file_size_bytes=target,
    )


def _parse_retention(raw: dict[str, Any], where: str) -> RetentionPolicy:
    _check_keys(raw, {"warn_headroom", "error_headroom", "warn_ratio", "error_ratio"}, f"{where}: retention")
    d = RetentionPolicy()
    try:
        policy = RetentionPolicy(
            warn_headroom_s=parse_duration_s(raw.get("warn_headroom", d.warn_headroom_s), f"{where} retention.warn_headroom"),
            error_headroom_s=parse_duration_s(raw.get("error_headroom", d.error_headroom_s), f"{where} retention.error_headroom"),
            warn_ratio=float(raw.get("warn_ratio", d.warn_ratio)),
            error_ratio=float(raw.get("error_ratio", d.error_ratio)),
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: retention.warn_ratio and error_ratio must be numbers") from exc
    if not (policy.error_headroom_s <= policy.warn_headroom_s and 0 < policy.warn_ratio <= policy.error_ratio <= 1):
        raise ConfigError(f"{where}: retention needs error_headroom <= warn_headroom and 0 < warn_ratio <= error_ratio <= 1")
    return policy


def _parse_bad_records(raw: dict[str, Any], where: str, identifier: str) -> BadRecordPolicy:
    _check_keys(raw, {"policy", "max_quarantine_rate", "max_record_bytes", "dead_letter_table"}, f"{where}: bad_records")
    policy = raw.get("policy", "quarantine")
    if policy not in BAD_RECORD_POLICIES:
        raise ConfigError(f"{where}: bad_records.policy must be one of {BAD_RECORD_POLICIES}, got {policy!r}")
    try:
        rate = float(raw.get("max_quarantine_rate", BadRecordPolicy.max_quarantine_rate))
        size = int(raw.get("max_record_bytes", BadRecordPolicy.max_record_bytes))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: bad_records.max_quarantine_rate must be a number and max_record_bytes a whole number") from exc
    if not 0 <= rate <= 1 or size <= 0:
        raise ConfigError(f"{where}: bad_records needs 0 <= max_quarantine_rate <= 1 and max_record_bytes > 0")
    dlq = str(raw.get("dead_letter_table") or f"{identifier}_dead_letter")
    parts = dlq.split(".")
    if len(parts) < 2 or not all(IDENTIFIER.match(p) for p in parts) or dlq == identifier:
        raise ConfigError(f"{where}: bad_records.dead_letter_table {dlq!r} must be another namespace.table in lower_snake_case")
    return BadRecordPolicy(policy, rate, size, dlq)


def _parse_table(raw: dict[str, Any], defaults: dict[str, Any]) -> TableSpec:
    merged = {**defaults, **raw}
    name = merged.get("name")
    if not name or not IDENTIFIER.match(str(name)):
        raise ConfigError(f"table name {name!r} must match {IDENTIFIER.pattern}")
    where = f"table {name}"
    known = {
        "name", "identifier", "topic", "consumer_group", "format", "schema", "partition_by", "kafka_columns",
        "max_records_per_partition", "starting_position", "freshness", "unknown_fields", "description", "lag",
        "maintenance", "retention", "bad_records",
    }
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; known keys are {sorted(known)}")
    for key in ("identifier", "topic", "schema"):
        if not merged.get(key):
            raise ConfigError(f"{where}: '{key}' is required")
    identifier = str(merged["identifier"])
    parts = identifier.split(".")
    if len(parts) < 2 or not all(IDENTIFIER.match(p) for p in parts):
        raise ConfigError(f"{where}: identifier {identifier!r} must be namespace.table in lower_snake_case")

    fmt = merged.get("format") or {"type": "json"}
    value_format = fmt.get("type") if isinstance(fmt, dict) else fmt
    if value_format not in VALUE_FORMATS:
        raise ConfigError(f"{where}: format {value_format!r} is not supported yet; supported: {VALUE_FORMATS}")

    columns = []
    for i, col in enumerate(merged["schema"]):
        if not isinstance(col, dict) or "name" not in col or "type" not in col:
            raise ConfigError(f"{where}: schema entry {i} needs 'name' and 'type'")
        _check_keys(col, {"name", "type", "required", "doc"}, f"{where}: schema entry {col['name']!r}")
        ctype = str(col["type"]).strip().lower()
        if ctype not in _SIMPLE_TYPES and not _DECIMAL.match(ctype):
            raise ConfigError(f"{where}: column {col['name']!r} has unsupported type {ctype!r}; supported: {sorted(_SIMPLE_TYPES)} and decimal(p,s)")
        if not IDENTIFIER.match(str(col["name"])):
            raise ConfigError(f"{where}: column name {col['name']!r} must match {IDENTIFIER.pattern}")
        columns.append(ColumnSpec(str(col["name"]), ctype, bool(col.get("required", False)), col.get("doc")))
    names = [c.name for c in columns]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: duplicate column names in schema")

    kafka_columns = list(merged.get("kafka_columns") or [])
    for k in kafka_columns:
        if k not in KAFKA_COLUMNS:
            raise ConfigError(f"{where}: kafka_columns entry {k!r} is not one of {sorted(KAFKA_COLUMNS)}")
    for k in _REQUIRED_KAFKA_COLUMNS:
        if k not in kafka_columns:
            kafka_columns.append(k)
    kafka_columns = [k for k in KAFKA_COLUMNS if k in kafka_columns]  # canonical order

    clashes = sorted(set(names) & {c for c, _ in KAFKA_COLUMNS.values()})
    if clashes:
        raise ConfigError(f"{where}: schema columns {clashes} collide with Kafka metadata column names")
    all_columns = set(names) | {KAFKA_COLUMNS[k][0] for k in kafka_columns}
    partition_by = tuple(str(p).strip() for p in merged.get("partition_by") or ())
    for p in partition_by:
        m = _TRANSFORM.match(p)
        if not m:
            raise ConfigError(f"{where}: partition_by entry {p!r} is not a transform like days(col), bucket(16, col) or col")
        source = next(g for g in (m.group(2), m.group(4), m.group(6), m.group(7)) if g)
        if source not in all_columns:
            raise ConfigError(f"{where}: partition_by {p!r} refers to unknown column {source!r}")

    try:
        bound = int(merged.get("max_records_per_partition", 100_000))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: max_records_per_partition must be a whole number of records") from exc
    if bound <= 0:
        raise ConfigError(f"{where}: max_records_per_partition must be positive")
    fresh = merged.get("freshness") or {}
    _check_keys(fresh, {"max_snapshot_age", "max_valid_through_age"}, f"{where}: freshness")
    vt = fresh.get("max_valid_through_age", fresh.get("max_snapshot_age", "1d"))
    freshness = FreshnessPolicy(
        parse_duration_s(fresh.get("max_snapshot_age", "1d"), f"{where} freshness.max_snapshot_age"),
        None if vt in (None, False, "none", "off") else parse_duration_s(vt, f"{where} freshness.max_valid_through_age"),
    )
    lag_raw = merged.get("lag") or {}
    _check_keys(lag_raw, {"max_offset_lag", "max_interval", "window", "interval", "grace"}, f"{where}: lag")
    try:
        lag = LagPolicy(
            max_offset_lag=int(lag_raw.get("max_offset_lag", LagPolicy.max_offset_lag)),
            max_interval_s=parse_duration_s(lag_raw.get("max_interval", "15m"), f"{where} lag.max_interval"),
            window=int(lag_raw.get("window", LagPolicy.window)),
            interval_s=parse_duration_s(lag_raw.get("interval", "30s"), f"{where} lag.interval"),
            grace_s=parse_duration_s(lag_raw.get("grace", "5m"), f"{where} lag.grace"),
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: lag.max_offset_lag and lag.window must be whole numbers") from exc
    if lag.max_offset_lag < 1 or lag.window < 2:
        raise ConfigError(f"{where}: lag.max_offset_lag must be >= 1 and lag.window >= 2")
    maintenance = _parse_maintenance(merged.get("maintenance") or {}, where)
    retention = _parse_retention(merged.get("retention") or {}, where)
    unknown_fields = merged.get("unknown_fields", "reject")
    if unknown_fields not in UNKNOWN_FIELD_POLICIES:
        raise ConfigError(f"{where}: unknown_fields must be one of {UNKNOWN_FIELD_POLICIES}, got {unknown_fields!r}")
    bad_records = _parse_bad_records(merged.get("bad_records") or {}, where, identifier)
    return TableSpec(
        name=str(name),
        identifier=identifier,
        topic=str(merged["topic"]),
        consumer_group=str(merged.get("consumer_group") or f"lake.{identifier}"),
        value_format=str(value_format),
        columns=tuple(columns),
        partition_by=partition_by,
        kafka_columns=tuple(kafka_columns),
        max_records_per_partition=bound,
        starting_position=_parse_starting_position(merged.get("starting_position", "earliest"), where),
        freshness=freshness,
        unknown_fields=unknown_fields,
        bad_records=bad_records,
        description=str(merged.get("description", "")).strip(),
        lag=lag,
        maintenance=maintenance,
        retention=retention,
    )


def load_table_specs(path: Path | str) -> list[TableSpec]:
    """Load and validate every table declared in the YAML file at ``path``.

    The file has an optional ``defaults`` mapping (merged under every table) and a
    ``tables`` list. Returns the specs in file order.

    Raises:
        ConfigError: the file is missing, not YAML, or any declaration is invalid;
            or two tables share a name, identifier or topic.
    """
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as exc:
        raise ConfigError(f"table declarations file {path} does not exist") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    defaults = doc.get("defaults") or {}
    specs = [_parse_table(t, defaults) for t in doc.get("tables") or []]
    for attr in ("name", "identifier", "topic"):
        values = [getattr(s, attr) for s in specs]
        dupes = {v for v in values if values.count(v) > 1}
        if dupes:
            raise ConfigError(f"{path}: {attr} must be unique across tables, repeated: {sorted(dupes)}")
    tables = [s.identifier for s in specs] + [s.bad_records.dead_letter_identifier for s in specs]
    clashes = {t for t in tables if tables.count(t) > 1}
    if clashes:
        raise ConfigError(f"{path}: every table and dead-letter table needs its own identifier, repeated: {sorted(clashes)}")
    return specs


def find_table(specs: list[TableSpec], name: str) -> TableSpec:
    """The declared table whose ``name`` or ``identifier`` is ``name`` (``flights`` or ``nyc.flights``).

    Raises:
        ConfigError: no declared table has that name or identifier (the message lists them).
    """
    for spec in specs:
        if name in (spec.name, spec.identifier):
            return spec
    raise ConfigError(f"unknown table {name!r}; declared: {[s.name for s in specs]}")


def parse_table_spec(raw: dict[str, Any], defaults: dict[str, Any] | None = None) -> TableSpec:
    """Validate one table declaration (a ``tables:`` entry, as a dict) merged over ``defaults``.

    Raises:
        ConfigError: naming the table and the field at fault.
    """
    return _parse_table(raw, defaults or {})
