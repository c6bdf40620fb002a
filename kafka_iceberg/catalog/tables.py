"""The Iceberg catalog, seen from Spark (writes) and from pyiceberg (metadata reads).

Spark talks to the catalog (Iceberg's ``JdbcCatalog``, REST, Glue, Hive or Nessie; one configuration,
:mod:`kafka_iceberg.catalog.config`) through the Iceberg Spark runtime jar; pyiceberg opens the same
catalog under the same catalog name. The write path uses
Spark for everything that changes a table (DDL, data commits, branch and maintenance
procedures) and pyiceberg for cheap metadata reads (snapshots, summaries, refs).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError, ServerError, ServiceUnavailableError
from pyiceberg.table import Table
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_before_delay, wait_exponential

from kafka_iceberg.catalog import metadata_cache
from kafka_iceberg.catalog.config import CatalogConfig
from kafka_iceberg.cdc.upsert import UPSERT_TABLE_PROPERTIES
from kafka_iceberg.cdc.upsert import prepare_table as prepare_upsert_table
from kafka_iceberg.config.settings import CatalogSettings, Settings
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.errors import CatalogUnavailableError, ConfigError
from kafka_iceberg.formats.transform import DEAD_LETTER_COLUMNS
from kafka_iceberg.state import IngestState, SnapshotInfo, state_at

log = logging.getLogger(__name__)

TABLE_PROPERTIES = {
    "format-version": "2",
    "write.parquet.compression-codec": "zstd",
    # each micro-batch makes several metadata commits (branch, write, publish, drop branch)
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "50",
    "lake.managed-by": "kafka-iceberg-lake",
}
"""Table properties set when the write path creates a table."""


def catalog_config(cat: CatalogSettings) -> CatalogConfig:
    """``cat.config``, or for settings built without one the sql catalog of ``cat``'s SQLAlchemy uri."""
    return cat.config or CatalogConfig(cat.name, {"type": "sql", "uri": cat.sqlalchemy_uri, "warehouse": cat.warehouse})


def load_catalog(cat: CatalogSettings, retry_s: float = 0.0) -> Catalog:
    """pyiceberg's view of the same catalog (same catalog name): :meth:`CatalogConfig.load`, any
    type, with its ``s3.*`` properties (a ``SqlCatalog`` for sql/jdbc).

    ``retry_s``: seconds to keep retrying while the catalog is locked or unreachable
    (see :func:`with_catalog_retry`); 0 tries once.

    Raises:
        CatalogUnavailableError: the catalog (database or REST/HTTP server) cannot be opened.
    """
    if retry_s > 0:
        return with_catalog_retry(f"open catalog {cat.name}", lambda: load_catalog(cat), retry_s)
    if cat.is_sqlite:
        Path(cat.sqlalchemy_uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    if cat.warehouse.startswith("file://"):
        Path(cat.warehouse[len("file://") :]).mkdir(parents=True, exist_ok=True)
    cfg = catalog_config(cat)
    try:
        catalog = cfg.load()
    except Exception as exc:  # sqlalchemy.exc.OperationalError, requests' ConnectionError, HTTP 5xx and friends
        raise CatalogUnavailableError(
            f"cannot open Iceberg catalog {cat.name} at {_no_password(cfg.properties.get('uri', cfg.type))}: {exc}"
        ) from exc
    if cat.is_sqlite and getattr(catalog, "engine", None) is not None:
        from sqlalchemy import event

        event.listen(catalog.engine, "connect", _sqlite_wal)
        catalog.engine.dispose()  # the connections pyiceberg opened at its start reconnect with it
    return catalog


def _sqlite_wal(dbapi_connection, _record) -> None:
    """On each connection to a SQLite catalog: write-ahead logging (readers, such as sensors and Spark's JDBC
    reads, no longer block the one committer, nor it them; persistent in the file) with
    ``synchronous=NORMAL``: a commit no longer waits for an fsync, only a checkpoint does. A killed
    process loses no commit; a power loss may lose the newest, and the table then re-reads their offsets
    from Kafka (its data files become orphans). Local disks only: WAL needs shared memory between processes."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _no_password(uri: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", uri)


def is_unavailable_error(exc: BaseException) -> bool:
    """True when ``exc`` from pyiceberg says the catalog cannot be reached (SQLAlchemy errors,
    HTTP connection errors, REST 5xx), rather than a bad request."""
    if isinstance(exc, (ServerError, ServiceUnavailableError, ConnectionError, TimeoutError)):
        return True
    return type(exc).__module__.startswith(("sqlalchemy", "requests", "urllib3"))


def load_table(catalog: Catalog, identifier: str) -> Table | None:
    """The table as the catalog names it now, or ``None`` when it does not exist. On a SQL catalog a
    metadata.json this process already parsed is not read again (:mod:`kafka_iceberg.catalog.metadata_cache`).

    Raises:
        CatalogUnavailableError: the catalog (database or REST/HTTP server) cannot be queried.
    """
    try:
        return metadata_cache.load(catalog, identifier)
    except NoSuchTableError:
        return None
    except Exception as exc:
        if is_unavailable_error(exc):
            raise CatalogUnavailableError(f"cannot read table {identifier} from catalog {catalog.name}: {exc}") from exc
        raise


@dataclass(frozen=True)
class TableMetadataView:
    """Snapshots and refs of one table, as plain values (see :mod:`kafka_iceberg.state`)."""

    snapshots: dict[int, SnapshotInfo]
    refs: dict[str, int]  # branch or tag name -> snapshot id
    metadata_location: str
    table: object = field(default=None, compare=False, repr=False)  # the pyiceberg Table it was read from

    @property
    def main(self) -> int | None:
        """Snapshot id ``main`` points at, or None for a table without one."""
        return self.refs.get("main")


def metadata_view(table: Table) -> TableMetadataView:
    """Build a :class:`TableMetadataView` from a loaded pyiceberg table."""
    snaps = {}
    for s in table.metadata.snapshots:
        summary = dict(s.summary.additional_properties) if s.summary else {}
        if s.summary is not None:
            summary["operation"] = s.summary.operation.value
        snaps[s.snapshot_id] = SnapshotInfo(s.snapshot_id, s.parent_snapshot_id, s.timestamp_ms, summary)
    refs = {name: ref.snapshot_id for name, ref in table.metadata.refs.items()}
    return TableMetadataView(snaps, refs, table.metadata_location, table)


def read_state(catalog: Catalog, identifier: str) -> IngestState:
    """The table's current ingest state (committed offsets and more, from ``main``'s snapshot
    summaries); :meth:`IngestState.empty` for a table that does not exist yet.

    Raises:
        CatalogUnavailableError: the catalog database cannot be queried.
    """
    return table_state(load_table(catalog, identifier))


def table_state(table) -> IngestState:
    """The ingest state of a loaded pyiceberg ``table`` (from ``main``'s snapshot summaries);
    :meth:`IngestState.empty` for None (a table not created yet)."""
    if table is None:
        return IngestState.empty()
    view = metadata_view(table)
    return state_at(view.snapshots, view.main)


def qualified(settings: Settings, spec: TableSpec) -> str:
    """``<catalog>.<namespace>.<table>`` for Spark SQL."""
    return f"{settings.catalog.name}.{spec.identifier}"


def table_ddl(settings: Settings, spec: TableSpec, columns: list[tuple[str, str, bool]] | None = None) -> str:
    """``CREATE TABLE IF NOT EXISTS`` statement for a declared table (``columns``: (name, Spark SQL
    type, required) of every column, default :meth:`TableSpec.table_columns`)."""
    cols = ",\n  ".join(f"`{n}` {t}{' NOT NULL' if req else ''}" for n, t, req in columns or spec.table_columns())
    parts = f"\nPARTITIONED BY ({', '.join(spec.partition_by)})" if spec.partition_by else ""
    properties = {**TABLE_PROPERTIES, **(UPSERT_TABLE_PROPERTIES if spec.upsert else {})}
    props = ", ".join(f"'{k}'='{v}'" for k, v in properties.items())
    comment = spec.description.replace("'", "")
    return (
        f"CREATE TABLE IF NOT EXISTS {qualified(settings, spec)} (\n  {cols}\n) USING iceberg{parts}\n"
        f"COMMENT '{comment or 'Ingested from Kafka topic ' + spec.topic}'\nTBLPROPERTIES ({props})"
    )


def create_table(spark, settings: Settings, identifier: str, ddl: str) -> bool:
    """Create a missing table: run a ``CREATE TABLE IF NOT EXISTS`` after creating the namespace (a
    concurrent creator winning the race is fine). An existing table is left alone, without a statement.
    Returns whether the table was missing."""
    if spark.catalog.tableExists(f"{settings.catalog.name}.{identifier}"):
        return False
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog.name}.{identifier.rsplit('.', 1)[0]}")
    try:
        spark.sql(ddl)
    except Exception as exc:
        if "already exists" not in str(exc).lower():
            raise
    return True


_SPARK_SQL = {
    "IntegerType": "INT",
    "LongType": "BIGINT",
    "FloatType": "FLOAT",
    "DoubleType": "DOUBLE",
    "StringType": "STRING",
    "BooleanType": "BOOLEAN",
    "DateType": "DATE",
    "TimestamptzType": "TIMESTAMP",
    "BinaryType": "BINARY",
}
"""pyiceberg primitive type -> the Spark SQL type Spark reads it as (``DataType.simpleString()``, upper case)."""


def _spark_sql(t) -> str | None:
    """The Spark SQL type (``DataType.simpleString()``, upper case) Spark reads pyiceberg type ``t`` as: the
    primitives of :data:`_SPARK_SQL`, decimals, and lists, maps and structs of them; None for another type."""
    from pyiceberg.types import DecimalType, ListType, MapType, StructType

    if isinstance(t, DecimalType):
        return f"DECIMAL({t.precision},{t.scale})"
    if isinstance(t, ListType):
        inner = _spark_sql(t.element_type)
        return None if inner is None else f"ARRAY<{inner}>"
    if isinstance(t, MapType):
        key, value = _spark_sql(t.key_type), _spark_sql(t.value_type)
        return None if key is None or value is None else f"MAP<{key},{value}>"
    if isinstance(t, StructType):
        fields = [(f.name.upper(), _spark_sql(f.field_type)) for f in t.fields]
        return None if any(v is None for _, v in fields) else "STRUCT<" + ",".join(f"{n}:{v}" for n, v in fields) + ">"
    return _SPARK_SQL.get(type(t).__name__)


def _columns_of(spark, settings: Settings, spec: TableSpec, table: Table | None) -> tuple[dict, dict]:
    """(column name -> Spark SQL type in upper case, column name -> nullable) of ``spec``'s existing table:
    from the loaded pyiceberg ``table`` when :func:`_spark_sql` knows every column's type (no Spark catalog
    lookup, about 18 ms a table on a warm session), else from Spark's catalog."""
    if table is not None:
        fields = table.schema().fields
        types = {f.name: _spark_sql(f.field_type) for f in fields}
        if None not in types.values():
            return types, {f.name: not f.required for f in fields}
    fields = spark.table(qualified(settings, spec)).schema.fields
    return {f.name: f.dataType.simpleString().upper() for f in fields}, {f.name: f.nullable for f in fields}


def ensure_table(spark, settings: Settings, spec: TableSpec, table: Table | None = None) -> None:
    """Create the namespace and table if missing; check an existing table against its declaration.
    ``table``: the table, already loaded by pyiceberg (it exists; checked from its schema where it can be).

    Raises:
        ConfigError: the existing table lacks a declared column or has another type for it
            (the Iceberg table schema is the contract; it is never changed silently).
    """
    created = table is None and create_table(spark, settings, spec.identifier, table_ddl(settings, spec))
    if created and spec.upsert:  # the key becomes the table's identifier fields
        prepare_upsert_table(spark, qualified(settings, spec), list(spec.upsert.key))
    existing, nullable = _columns_of(spark, settings, spec, table)
    for name, stype, required in spec.table_columns():
        declared = stype.replace(" ", "").upper()
        actual = existing.get(name)
        if actual is None:
            raise ConfigError(
                f"table {spec.identifier} has no column {name!r} that tables.yaml declares; evolve the table first"
            )
        if actual.replace(" ", "") != declared:
            raise ConfigError(f"table {spec.identifier} column {name!r} is {actual} but tables.yaml declares {stype}")
        if nullable[name] == required:
            raise ConfigError(
                f"table {spec.identifier} column {name!r} is {'optional' if nullable[name] else 'required'} "
                f"but tables.yaml declares it {'required' if required else 'optional'}"
            )


def dead_letter_ddl(settings: Settings, spec: TableSpec) -> str:
    """``CREATE TABLE IF NOT EXISTS`` statement for ``spec``'s dead-letter table
    (:data:`kafka_iceberg.formats.transform.DEAD_LETTER_COLUMNS`, partitioned by day of quarantine)."""

    cols = ",\n  ".join(f"`{n}` {t}{' NOT NULL' if req else ''}" for n, t, req in DEAD_LETTER_COLUMNS)
    props = ", ".join(f"'{k}'='{v}'" for k, v in {**TABLE_PROPERTIES, "lake.dead-letter-of": spec.identifier}.items())
    return (
        f"CREATE TABLE IF NOT EXISTS {settings.catalog.name}.{spec.bad_records.dead_letter_identifier} (\n  {cols}\n) "
        f"USING iceberg\nPARTITIONED BY (days(quarantined_at))\n"
        f"COMMENT 'Records of topic {spec.topic} quarantined by table {spec.identifier}'\nTBLPROPERTIES ({props})"
    )


def ensure_dead_letter_table(spark, settings: Settings, spec: TableSpec, table: Table | None = None) -> None:
    """Create ``spec``'s dead-letter table (and its namespace) if missing. ``table``: the dead-letter
    table, already loaded by pyiceberg (it exists; its owner is read from its properties).

    Raises:
        ConfigError: a table of that name exists but is not this table's dead-letter table.
    """
    ident = spec.bad_records.dead_letter_identifier
    if table is not None:
        value = table.properties.get("lake.dead-letter-of")
    else:
        create_table(spark, settings, ident, dead_letter_ddl(settings, spec))
        owner = spark.sql(f"SHOW TBLPROPERTIES {settings.catalog.name}.{ident} ('lake.dead-letter-of')").collect()
        value = owner[0]["value"] if owner else None
    if value != spec.identifier:
        raise ConfigError(
            f"table {ident} exists but is not the dead-letter table of {spec.identifier} (lake.dead-letter-of={value!r})"
        )


_TRANSIENT = re.compile(
    r"SQLITE_BUSY|SQLITE_LOCKED|database is locked|database table is locked"
    r"|Connection refused|connection to server|server closed the connection|terminating connection"
    r"|the database system is (shutting down|starting up|in recovery mode)|Connection reset"
    r"|This connection has been closed|An I/O error occurred while sending to the backend"
    r"|Cannot get a connection|Failed to connect|could not connect",
    re.IGNORECASE,
)


def is_transient_catalog_error(exc: BaseException) -> bool:
    """True when ``exc`` (from Spark's JdbcCatalog through Py4J, or from pyiceberg/SQLAlchemy)
    says the catalog database was locked or unreachable, so the operation may succeed later.

    False for the error :func:`with_catalog_retry` raises when its budget ran out: a call
    retried inside another retried call (a metadata load inside a publish check) has already
    waited, so the outer retry gives up too instead of waiting a second budget."""
    if getattr(exc, "retries_exhausted", False):
        return False
    return bool(_TRANSIENT.search(f"{type(exc).__name__}: {exc}"))


def with_catalog_retry(what: str, fn, budget_s: float, *, before_retry=None):
    """Call ``fn()``; while it fails with a transient catalog error, wait with exponential backoff
    (0.5 s doubling to 8 s) and call ``before_retry()`` then ``fn()`` again, for at most
    ``budget_s`` seconds in all (no wait that would end past the budget). Retried by tenacity.

    ``before_retry`` re-reads the table and returns a value to return *instead of* retrying
    when the failed call did take effect after all (for example, the branch already points at
    the new snapshot), or ``None`` to retry. It may raise to stop retrying.

    Raises:
        CatalogUnavailableError: the budget ran out; names ``what``, the attempts and the last error.
        Any non-transient exception of ``fn`` or ``before_retry``, unchanged.
    """
    calls = []

    def attempt():
        calls.append(1)
        # never repeat a call that may have taken effect before looking at the table again
        if before_retry is not None and len(calls) > 1:
            done = before_retry()
            if done is not None:
                return done
        return fn()

    def give_up(state: RetryCallState):
        exc = state.outcome.exception()
        err = CatalogUnavailableError(
            f"{what}: the Iceberg catalog stayed unavailable for {budget_s:.0f} s over {state.attempt_number} "
            f"attempt(s); last error: {_first_line(exc, 300)}"
        )
        err.retries_exhausted = True
        raise err from exc

    retrying = Retrying(
        retry=retry_if_exception(is_transient_catalog_error),
        wait=wait_exponential(multiplier=0.5, max=8.0),
        stop=stop_before_delay(budget_s),
        before_sleep=lambda state: log.warning(
            "%s: transient catalog error (attempt %d), retrying in %.1f s: %s",
            what,
            state.attempt_number,
            state.upcoming_sleep,
            _first_line(state.outcome.exception(), 200),
        ),
        retry_error_callback=give_up,
    )
    return retrying(attempt)


def _first_line(exc: BaseException, limit: int) -> str:
    """The first line of ``exc``'s message (at most ``limit`` characters), or its type's name."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__
