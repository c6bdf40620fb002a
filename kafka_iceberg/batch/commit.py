"""Catalog commits on table metadata this process already holds: the write path's commits
(create the attempt branch; publish) without re-reading the table's history.

pyiceberg 0.12's ``SqlCatalog.commit_table`` loads the table's metadata.json again, applies the
updates, deep-copies the whole result and compares it with what it loaded. At 1,000 snapshots
(a 1 MB metadata.json) that is 40-50 ms per commit, the part of a micro-batch that grows with
the table's history (docs/benchmark.md, goal 4a). On a SQL catalog (the JDBC catalog Spark
shares, SQLite or PostgreSQL) the table's row in ``iceberg_tables`` is the pointer to its current
metadata.json, and a commit whose base is metadata this process loaded or committed needs none
of that: :func:`commit` validates the requirements against the base, applies the updates to it,
writes the new metadata.json, and moves the pointer only while it still names the base's file
(``UPDATE ... WHERE metadata_location = <base>``), the same compare-and-swap pyiceberg's and
Java's JDBC catalogs make. A stale base fails that swap (:class:`StaleBaseError`); the caller
loads the table and commits again, so a commit never lands on metadata it did not validate.

Other catalogs (REST, Glue, Hive) apply a commit on their side; there :func:`commit` is
``Catalog.commit_table``.
"""

from __future__ import annotations

import logging
import re
import time

from pyiceberg.exceptions import CommitFailedException

log = logging.getLogger(__name__)

_VERSION = re.compile(r"^(\d+)-.*\.metadata\.json$")


class StaleBaseError(CommitFailedException):
    """The catalog's pointer no longer names the base's metadata.json: another commit landed
    since the base was loaded. Nothing was committed; reload and commit again."""


def commit(table, requirements: tuple = (), updates: tuple = ()):
    """Commit ``updates`` on ``table``'s metadata (a pyiceberg ``Table``: the base) under
    ``requirements``, checked against that base; returns the committed pyiceberg ``Table``
    (``table`` itself when the updates change nothing).

    Raises:
        CommitFailedException: a requirement failed on the base (nothing was written).
        StaleBaseError: the table moved since the base (the new metadata.json is deleted again).
        The SQL driver's error when the catalog database is unavailable or locked (transient:
        :func:`kafka_iceberg.catalog.tables.is_transient_catalog_error`), as pyiceberg's commit raises it.
    """
    from pyiceberg.table import Table

    catalog = table.catalog
    if not _swappable(catalog):
        response = catalog.commit_table(table, tuple(requirements), tuple(updates))
        return Table(table.name(), response.metadata, response.metadata_location, table.io, catalog)
    for requirement in requirements:
        requirement.validate(table.metadata)
    metadata = apply_updates(table.metadata, tuple(updates), table.metadata_location)
    if metadata is table.metadata:
        return table
    location, io = _write(catalog, metadata, table.metadata_location)
    try:
        _swap(catalog, table.name(), table.metadata_location, location)
    except StaleBaseError:
        _delete_quietly(io, location)
        raise
    return Table(table.name(), metadata, location, io, catalog)


def apply_updates(base, updates: tuple, base_location: str | None):
    """``base`` (pyiceberg ``TableMetadata``) with ``updates`` applied and ``base_location``
    appended to its metadata log (unless None); ``base`` itself when nothing changes.

    This is pyiceberg 0.12's ``update_table_metadata`` without its last step, a deep copy of the
    whole result: the metadata models are frozen and every update builds new objects, so the
    copy only costs time (about 20 ms at 1,000 snapshots). It wraps pyiceberg's private
    ``_apply_table_update``, ``_TableMetadataUpdateContext`` and ``_update_table_metadata_log``,
    once; tests/test_commit.py pins it to equal ``update_table_metadata``'s result.
    """
    from pyiceberg.table.update import _apply_table_update, _TableMetadataUpdateContext, _update_table_metadata_log

    context = _TableMetadataUpdateContext()
    metadata = base
    for update in updates:
        metadata = _apply_table_update(update, metadata, context)
    if not context.has_changes():
        return base
    if base_location:
        metadata = _update_table_metadata_log(metadata, base_location, base.last_updated_ms)
    if metadata.last_updated_ms == base.last_updated_ms:
        metadata = metadata.model_copy(update={"last_updated_ms": int(time.time() * 1000)})
    metadata.spec().check_compatible(metadata.schema())
    metadata.sort_order().check_compatible(metadata.schema())
    return metadata


def _swappable(catalog) -> bool:
    """Whether ``catalog`` is a pyiceberg ``SqlCatalog`` whose database reports updated row counts
    (SQLite and PostgreSQL do), so the compare-and-swap can be checked."""
    from pyiceberg.catalog.sql import SqlCatalog

    return isinstance(catalog, SqlCatalog) and catalog.engine.dialect.supports_sane_rowcount


def _write(catalog, metadata, base_location: str):
    """Write ``metadata`` as the table's next metadata.json (version after ``base_location``'s, at
    the location provider's path, as the catalog would name it); returns (location, FileIO)."""
    from pyiceberg.io import load_file_io
    from pyiceberg.serializers import ToOutputFile
    from pyiceberg.table.locations import load_location_provider

    match = _VERSION.match(base_location.rsplit("/", 1)[-1])
    version = int(match.group(1)) + 1 if match else 0
    location = load_location_provider(metadata.location, metadata.properties).new_table_metadata_file_location(version)
    io = load_file_io({**catalog.properties, **metadata.properties}, location)
    ToOutputFile.table_metadata(metadata, io.new_output(location))
    return location, io


def _swap(catalog, identifier, base_location: str, location: str) -> None:
    """Point the table's catalog row at ``location`` if it still points at ``base_location``.

    Raises:
        StaleBaseError: it points elsewhere (or the table is gone).
    """
    from pyiceberg.catalog import Catalog
    from pyiceberg.catalog.sql import IcebergTables
    from sqlalchemy import update
    from sqlalchemy.orm import Session

    namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
    name = Catalog.table_name_from(identifier)
    with Session(catalog.engine) as session:
        result = session.execute(
            update(IcebergTables)
            .where(
                IcebergTables.catalog_name == catalog.name,
                IcebergTables.table_namespace == namespace,
                IcebergTables.table_name == name,
                IcebergTables.metadata_location == base_location,
            )
            .values(metadata_location=location, previous_metadata_location=base_location)
        )
        if result.rowcount < 1:
            raise StaleBaseError(f"table {namespace}.{name} moved since its metadata {base_location} was loaded")
        session.commit()


def _delete_quietly(io, location: str) -> None:
    try:
        io.delete(location)
    except Exception as exc:  # noqa: BLE001 - an unreferenced metadata.json is harmless; orphan removal takes it
        log.warning("metadata file %s of a refused commit was not deleted (%s)", location, exc)


__all__ = ["StaleBaseError", "apply_updates", "commit"]
