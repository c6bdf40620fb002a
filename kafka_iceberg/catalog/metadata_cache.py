"""Table loads that skip re-reading a metadata.json this process already holds.

A metadata.json file never changes once written: a commit writes a new file and moves the
catalog's pointer to it. So on a SQL catalog (the JDBC catalog Spark shares, SQLite or PostgreSQL)
a load only needs the table's row in ``iceberg_tables``: when it names the file this process
loaded or committed last, the parsed ``TableMetadata`` it kept is that file's content. The load
then costs one ``SELECT`` instead of the ``SELECT``, the file read and its JSON parse (about 4 ms
a load for a table of 60 snapshots, two loads per micro-batch). A load is as fresh as pyiceberg's
own: the pointer is read at every load.

Other catalogs (REST, Glue, Hive) always load through ``Catalog.load_table``.
"""

from __future__ import annotations

import threading

MAX_SNAPSHOTS = 20_000
"""Snapshots the kept metadata may hold in all (parsed, a snapshot with its summary takes 2-6 KB: at most
about 120 MB): 100 tables of 200 snapshots, or 20 of 1,000. A table that does not fit is loaded in full."""


class MetadataCache:
    """Per table (catalog name, catalog uri, identifier): the location of the metadata.json last loaded or
    committed by this process and its parsed pyiceberg ``TableMetadata``. Thread-safe; the entries hold at
    most ``max_snapshots`` snapshots: a table's entry that would pass it is not kept (no eviction, so tables
    loaded in turn never push each other out)."""

    def __init__(self, max_snapshots: int = MAX_SNAPSHOTS):
        self._entries: dict[tuple, tuple[str, object, int]] = {}
        self._lock = threading.Lock()
        self._max, self._held = max_snapshots, 0

    def get(self, key: tuple, location: str):
        """The metadata kept for ``key`` if it was read from ``location``, else None."""
        with self._lock:
            entry = self._entries.get(key)
            return entry[1] if entry is not None and entry[0] == location else None

    def put(self, key: tuple, location: str, metadata) -> bool:
        """Keep ``metadata`` (pyiceberg ``TableMetadata``) as ``key``'s content at ``location``, replacing an
        older entry; returns False when it would pass ``max_snapshots`` (then ``key`` has no entry)."""
        size = len(metadata.snapshots) + 1
        with self._lock:
            old = self._entries.pop(key, None)
            self._held -= old[2] if old is not None else 0
            if self._held + size > self._max:
                return False
            self._entries[key], self._held = (location, metadata, size), self._held + size
            return True

    def clear(self) -> None:
        """Forget every table."""
        with self._lock:
            self._entries.clear()
            self._held = 0


CACHE = MetadataCache()
"""The process's cache, filled by :func:`load` and :func:`remember`."""


def _sql_catalog(catalog):
    from pyiceberg.catalog.sql import SqlCatalog

    return catalog if isinstance(catalog, SqlCatalog) else None


def _key(catalog, identifier) -> tuple:
    name = identifier if isinstance(identifier, str) else ".".join(identifier)
    return (catalog.name, catalog.properties.get("uri"), name)


def remember(table):
    """Keep a pyiceberg ``Table`` this process loaded or committed (its metadata at its location; a no-op
    outside SQL catalogs); returns ``table``."""
    if _sql_catalog(table.catalog) is not None:
        CACHE.put(_key(table.catalog, table.name()), table.metadata_location, table.metadata)
    return table


def _location(catalog, identifier: str) -> str | None:
    """The metadata.json location the catalog's row for ``identifier`` names (one ``SELECT``), or None
    when there is no row."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.catalog.sql import IcebergTables
    from sqlalchemy import select

    namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
    rows = IcebergTables.__table__.c  # Core, not an ORM session: half the CPU per micro-batch's load
    with catalog.engine.connect() as connection:
        return connection.scalar(
            select(rows.metadata_location).where(
                rows.catalog_name == catalog.name,
                rows.table_namespace == namespace,
                rows.table_name == Catalog.table_name_from(identifier),
            )
        )


def load(catalog, identifier: str):
    """The table as the catalog names it now (a pyiceberg ``Table``): from the cache when its row names the
    metadata.json kept for it, else through ``catalog.load_table`` (then kept).

    Raises:
        NoSuchTableError: the table does not exist. The catalog's error when it cannot be queried.
    """
    sql = _sql_catalog(catalog)
    if sql is not None:
        location = _location(sql, identifier)
        metadata = CACHE.get(_key(sql, identifier), location) if location is not None else None
        if metadata is not None:
            from pyiceberg.catalog import Catalog
            from pyiceberg.io import load_file_io
            from pyiceberg.table import Table

            io = load_file_io({**sql.properties, **metadata.properties}, location)
            return Table(Catalog.identifier_to_tuple(identifier), metadata, location, io, sql)
    table = catalog.load_table(identifier)
    remember(table)
    return table
