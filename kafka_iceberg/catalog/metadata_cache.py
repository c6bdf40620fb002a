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
from collections import OrderedDict

MAX_TABLES = 1024
"""Tables whose last metadata a process keeps (least recently used dropped first): one entry per table."""


class MetadataCache:
    """Per table (catalog name, catalog uri, identifier): the location of the metadata.json last loaded or
    committed by this process and its parsed pyiceberg ``TableMetadata``. Thread-safe; at most
    ``max_tables`` entries."""

    def __init__(self, max_tables: int = MAX_TABLES):
        self._entries: OrderedDict[tuple, tuple[str, object]] = OrderedDict()
        self._lock = threading.Lock()
        self._max = max_tables

    def get(self, key: tuple, location: str):
        """The metadata kept for ``key`` if it was read from ``location``, else None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] != location:
                return None
            self._entries.move_to_end(key)
            return entry[1]

    def put(self, key: tuple, location: str, metadata) -> None:
        """Keep ``metadata`` as ``key``'s content at ``location`` (replacing an older entry)."""
        with self._lock:
            self._entries[key] = (location, metadata)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget every table."""
        with self._lock:
            self._entries.clear()


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
    from sqlalchemy.orm import Session

    namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
    with Session(catalog.engine) as session:
        return session.scalar(
            select(IcebergTables.metadata_location).where(
                IcebergTables.catalog_name == catalog.name,
                IcebergTables.table_namespace == namespace,
                IcebergTables.table_name == Catalog.table_name_from(identifier),
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
