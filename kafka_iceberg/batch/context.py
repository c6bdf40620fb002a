"""What every phase of a micro-batch works with: the Spark session, the catalog, the cluster,
the crash hook, and the few table operations the phases share (each retried on a transient
catalog error where that is safe).

Table metadata (snapshots and refs, a :class:`~kafka_iceberg.catalog.tables.TableMetadataView`) is
loaded only through :meth:`Lake.load` (and :meth:`Lake.history`), which counts the loads in
``metadata_loads``; the phases call it at their boundaries, never per helper call. A :class:`Lake`
holds connections, never table metadata: what one phase loaded or committed reaches the next as a
value (:mod:`kafka_iceberg.batch.types`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from kafka_iceberg.batch.keys import ensure_key_column
from kafka_iceberg.catalog.registry_tables import ensure_registry_table
from kafka_iceberg.catalog.spark import java_table
from kafka_iceberg.catalog.tables import (
    TableMetadataView,
    ensure_dead_letter_table,
    ensure_table,
    load_table,
    metadata_view,
    with_catalog_retry,
)
from kafka_iceberg.config.settings import Settings
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.errors import LakeError
from kafka_iceberg.kafka.admin import KafkaMetadata

log = logging.getLogger(__name__)

CRASH_POINTS = ("after_branch", "after_read", "after_write", "after_publish")
"""Where a micro-batch calls its crash hook, in write-path order: attempt branch created; records
read from Kafka; rows written, not published (data files committed to the attempt branch, or with
the arrow writer data files no snapshot references yet); the batch published on the target ref and
the attempt branch dropped, in one commit (the dead-letter table not yet published, its branch not
dropped, consumer group not mirrored)."""

CrashHook = Callable[[str], None]


def no_crash(point: str) -> None:
    """The default crash hook: does nothing."""


class EnsuredTables:
    """The tables whose DDL ran in this process, keyed by connection and declaration: (Spark application
    id, catalog JDBC URI, identifier, ``TableSpec``). Every read and write of the keys holds one lock;
    :attr:`creating` lets one thread of the process at a time create or check tables: two creating the
    first tables of a namespace would both create it (a worker serves several tables at once)."""

    def __init__(self) -> None:
        self._keys: set[tuple] = set()
        self._lock = threading.Lock()
        self.creating = threading.Lock()

    def __contains__(self, key: tuple) -> bool:
        with self._lock:
            return key in self._keys

    def add(self, key: tuple) -> None:
        """Note that ``key``'s DDL ran."""
        with self._lock:
            self._keys.add(key)

    def forget(self, identifier: str) -> None:
        """Forget every key of table ``identifier``, on every connection (its table vanished)."""
        with self._lock:
            self._keys = {k for k in self._keys if k[2] != identifier}


_ENSURED = EnsuredTables()


@dataclass
class Lake:
    """The connections one micro-batch (or replay) uses.

    Args:
        spark: a SparkSession configured by :func:`kafka_iceberg.catalog.spark.spark_conf`.
        settings: runtime settings (catalog, timeouts, task sizing).
        kafka: cluster metadata client (watermarks, timestamp lookups, group commits).
        catalog: pyiceberg catalog on the same JDBC database as Spark's.
        crash_hook: called with each of :data:`CRASH_POINTS` as the batch passes it (tests and
            the rehearsal inject one that kills the process; default: nothing).
    """

    spark: object
    settings: Settings
    kafka: KafkaMetadata
    catalog: object
    crash_hook: CrashHook = no_crash
    metadata_loads: list[str] = field(default_factory=list)  # identifiers, one entry per load
    java_tables: dict = field(default_factory=dict)  # identifier -> Py4J handle (see java_table)

    @property
    def catalog_name(self) -> str:
        """The Spark catalog name (``lake``)."""
        return self.settings.catalog.name

    def retry(self, what: str, fn, before_retry=None):
        """:func:`~kafka_iceberg.catalog.tables.with_catalog_retry` with the settings' budget."""
        return with_catalog_retry(what, fn, self.settings.catalog_retry_s, before_retry=before_retry)

    def history(self, identifier: str) -> TableMetadataView:
        """Load the table's snapshots and refs from the catalog (retried while it is unavailable).

        Raises:
            LakeError: the table does not exist. CatalogUnavailableError: the retries ran out.
        """
        view = self.find(identifier)
        if view is None:
            raise LakeError(f"table {identifier} does not exist in catalog {self.catalog.name}")
        return view

    def find(self, identifier: str) -> TableMetadataView | None:
        """Like :meth:`history`, but None when the table does not exist."""
        table = self.load(identifier, must_exist=False)
        return None if table is None else metadata_view(table)

    def load(self, identifier: str, must_exist: bool = True):
        """The pyiceberg table, loaded from the catalog (retried while it is unavailable; counted
        in ``metadata_loads``). None for a missing table unless ``must_exist``.

        Raises:
            LakeError: ``must_exist`` and the table does not exist. CatalogUnavailableError.
        """

        def load():
            self.metadata_loads.append(identifier)
            return load_table(self.catalog, identifier)

        table = self.retry(f"load metadata of {identifier}", load)
        if table is None and must_exist:
            raise LakeError(f"table {identifier} does not exist in catalog {self.catalog.name}")
        return table

    def java_table(self, identifier: str):
        """A Py4J handle to the table's ``org.apache.iceberg.Table``, loaded through Spark's catalog
        once per identifier and kept: use it only for operations that refresh the metadata first,
        as ``manageSnapshots()`` does. Ref changes through Iceberg's Java API skip a Spark SQL
        statement's parse and plan. Not counted in ``metadata_loads``.

        Raises:
            Py4JJavaError: the table does not exist, or the catalog failed (transient: see
                :func:`~kafka_iceberg.catalog.tables.is_transient_catalog_error`).
        """
        if identifier not in self.java_tables:
            self.java_tables[identifier] = java_table(self.spark, f"{self.catalog_name}.{identifier}")
        return self.java_tables[identifier]

    def sql(self, what: str, statement: str, before_retry=None):
        """Run one Spark SQL statement, retried on a transient catalog error."""
        return self.retry(what, lambda: self.spark.sql(statement), before_retry=before_retry)

    def ensure_tables(self, spec: TableSpec, loaded: tuple = (None, None)) -> None:
        """Create the table (and, under ``bad_records.policy: quarantine``, its dead-letter table)
        from its declaration if missing, checking an existing one; once per process and table.
        ``loaded``: (the table, its dead-letter table) as pyiceberg loaded them, None where not known;
        a loaded table exists and is checked from its metadata where it can be, without Spark.

        Raises:
            ConfigError: an existing table does not match its declaration.
        """
        key = (self.spark.sparkContext.applicationId, self.settings.catalog.jdbc_uri, spec.identifier, spec)
        if key in _ENSURED:
            return
        with _ENSURED.creating:
            if key not in _ENSURED:
                self._ensure_tables(spec, *loaded)
                _ENSURED.add(key)

    def _ensure_tables(self, spec: TableSpec, table=None, dead_letter=None) -> None:
        if spec.columns_from_registry:
            self.retry(
                f"table {spec.identifier}: create the table from the registry",
                lambda: ensure_registry_table(self.spark, self.settings, spec),
            )
        else:
            self.retry(
                f"table {spec.identifier}: create or check the table",
                lambda: ensure_table(self.spark, self.settings, spec, table),
            )
        if spec.key_format is not None:
            ensure_key_column(self, spec)
        if spec.bad_records.policy == "quarantine":
            self.ensure_dead_letter_table(spec, dead_letter)

    def ensure_dead_letter_table(self, spec: TableSpec, table=None) -> None:
        """Create ``spec``'s dead-letter table if missing (see :func:`catalog.ensure_dead_letter_table`);
        ``table``: the dead-letter table as pyiceberg loaded it, if known."""
        self.retry(
            f"table {spec.identifier}: create the dead-letter table",
            lambda: ensure_dead_letter_table(self.spark, self.settings, spec, table),
        )

    def forget_tables(self, spec: TableSpec) -> None:
        """Forget that :meth:`ensure_tables` ran for ``spec`` (its table vanished)."""
        _ENSURED.forget(spec.identifier)
        self.java_tables.pop(spec.identifier, None)
