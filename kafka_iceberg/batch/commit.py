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
Other catalogs (REST, Glue, Hive) apply a commit on their side; there :func:`commit` is ``Catalog.commit_table``.

Written for pyiceberg :data:`WRITTEN_FOR` (it wraps private pyiceberg code):
tests/test_commit_differential.py pins that version and compares these commits with pyiceberg's own.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Transaction

from kafka_iceberg.catalog.metadata_cache import remember
from kafka_iceberg.errors import CommitConflictError

log = logging.getLogger(__name__)

WRITTEN_FOR = "0.12.0"
"""The pyiceberg version this module was written and checked for."""

_VERSION = re.compile(r"^(\d+)-.*\.metadata\.json$")
_MERGE_ENABLED = "commit.manifest-merge.enabled"


class StagingTransaction(Transaction):
    """A pyiceberg ``Transaction`` whose ``table_metadata`` is built once per set of staged updates: pyiceberg's
    applies every staged update to the base again and deep-copies the result on each access, and an append
    reads it about 14 times (two thirds of a small commit's 45 ms). The metadata models are frozen, so one
    copy is shared. Relies on the private ``_updates`` being replaced, never mutated, by each staged change
    (as :func:`staged_updates` does); tests/test_arrow_writer.py pins it."""

    _built: tuple | None = None

    @property
    def table_metadata(self):
        """The base with the staged updates applied (pyiceberg ``TableMetadata``); the base itself while
        nothing is staged (an append stages its updates only when it commits)."""
        if not self._updates:  # no copy: the models are frozen
            return self._table.metadata
        if self._built is None or self._built[0] is not self._updates:
            self._built = (self._updates, super().table_metadata)
        return self._built[1]


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
    from sqlalchemy.orm import Session

    catalog = table.catalog
    if not _swappable(catalog):
        response = catalog.commit_table(table, tuple(requirements), tuple(updates))
        delete_removed_metadata(table.io, table.metadata, response.metadata)
        return Table(table.name(), response.metadata, response.metadata_location, table.io, catalog)
    for requirement in requirements:
        requirement.validate(table.metadata)
    metadata = apply_updates(table.metadata, tuple(updates), table.metadata_location)
    if metadata is table.metadata:
        return table
    location, io = _write(catalog, metadata, table.metadata_location)
    try:
        with Session(catalog.engine) as session:
            swap_row(session, catalog, table.name(), table.metadata_location, location)
            session.commit()
    except StaleBaseError:
        _delete_quietly(io, location)
        raise
    delete_removed_metadata(io, table.metadata, metadata)
    return remember(Table(table.name(), metadata, location, io, catalog))  # the next load reads only the pointer


def delete_removed_metadata(io, base, committed) -> list[str]:
    """After a commit from ``base`` to ``committed`` (pyiceberg ``TableMetadata``): delete the
    metadata.json files that fell off the metadata log (it keeps ``write.metadata.previous-versions-max``
    entries), when ``write.metadata.delete-after-commit.enabled`` is true, as pyiceberg's
    ``Table._do_commit`` and Java's ``deleteRemovedMetadataFiles`` do. Best effort (a file left
    is an orphan for orphan removal); returns the locations deleted."""
    from pyiceberg.table import TableProperties
    from pyiceberg.utils.properties import property_as_bool

    enabled = property_as_bool(
        committed.properties,
        TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED,
        TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED_DEFAULT,
    )
    if not enabled:
        return []
    kept = {entry.metadata_file for entry in committed.metadata_log}
    removed = sorted({entry.metadata_file for entry in base.metadata_log} - kept)
    return [location for location in removed if _delete_quietly(io, location)]


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


def swap_row(session, catalog, identifier, base_location: str, location: str | None, why: str = "") -> None:
    """In the database transaction ``session`` (a SQLAlchemy ``Session`` on ``catalog.engine``), point the
    table's catalog row at ``location`` if it still points at ``base_location``; ``location`` None only
    requires that it does (a guard: the row is rewritten unchanged). The caller commits.

    Raises:
        StaleBaseError: it points elsewhere (or the table is gone); ``why`` ends its message.
    """
    from pyiceberg.catalog import Catalog
    from pyiceberg.catalog.sql import IcebergTables
    from sqlalchemy import update

    namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
    name = Catalog.table_name_from(identifier)
    values = {"metadata_location": base_location}
    if location is not None:
        values = {"metadata_location": location, "previous_metadata_location": base_location}
    rows = IcebergTables.__table__.c  # Core, on the session's connection: half the CPU of the ORM's bulk update
    result = session.connection().execute(
        update(IcebergTables.__table__)
        .where(
            rows.catalog_name == catalog.name,
            rows.table_namespace == namespace,
            rows.table_name == name,
            rows.metadata_location == base_location,
        )
        .values(**values)
    )
    if result.rowcount < 1:
        raise StaleBaseError(f"table {namespace}.{name} moved since its metadata {base_location} was loaded{why}")


def _delete_quietly(io, location: str) -> bool:
    try:
        io.delete(location)
        return True
    except Exception as exc:  # noqa: BLE001 - an unreferenced metadata file is harmless; orphan removal takes it
        log.warning("metadata file %s no commit references was not deleted (%s)", location, exc)
        return False


def commit_branch(base, branch: str, at_snapshot: int):
    """Create ``branch`` at ``at_snapshot`` on ``base`` (a pyiceberg ``Table`` holding that snapshot):
    one commit requiring that the branch does not exist. Returns the committed ``Table``.

    Raises:
        CommitFailedException: the branch exists. StaleBaseError: the table moved since ``base``.
    """
    from pyiceberg.table.refs import SnapshotRefType
    from pyiceberg.table.update import AssertRefSnapshotId, SetSnapshotRefUpdate

    requirements = (AssertRefSnapshotId(ref=branch, snapshot_id=None),)  # None: the branch must not exist
    updates = (SetSnapshotRefUpdate(ref_name=branch, type=SnapshotRefType.BRANCH, snapshot_id=at_snapshot),)
    return commit(base, requirements, updates)


@dataclass(frozen=True)
class StagedPublish:
    """A commit :func:`stage_publish` prepared and :meth:`commit` sends: ``snapshot_id`` is known before
    it lands; ``written``: the manifests and manifest list it wrote (deleted by :meth:`discard`)."""

    snapshot_id: int
    table: object  # the pyiceberg Table, with its whole history, the commit applies to (its base)
    requirements: tuple
    updates: tuple
    written: tuple = ()

    def commit(self):
        """Commit on the base (:func:`commit`); returns the table as committed (a pyiceberg ``Table``).

        Raises:
            CommitFailedException: a requirement failed (the ref or the branch moved, the branch is
                gone, the default spec changed); StaleBaseError (a subclass): the table moved since the base.
            ValueError: the updates do not apply to the base (e.g. a newer sequence number).
            Whatever the catalog raises when it is unavailable.
        """
        return commit(self.table, self.requirements, self.updates)

    def discard(self) -> None:
        """Delete the manifests and manifest list of this commit (only once it is known not to have landed)."""
        for location in self.written:
            _delete_quietly(self.table.io, location)


def stage_publish(
    table,
    files: Sequence,
    summary: Mapping[str, str],
    *,
    branch: str,
    branch_base: int,
    ref: str,
    ref_base: int | None,
    layout: tuple[int, int] | None = None,
    rebased: bool = False,
) -> StagedPublish:
    """Prepare one catalog commit that appends ``files`` (pyiceberg ``DataFile`` s) as one snapshot
    carrying ``summary`` whose parent is ``branch_base`` (the attempt ``branch``'s head), points
    ``ref`` at it (keeping its retention settings) and removes ``branch``; the catalog refuses it unless
    ``branch`` is still at ``branch_base``, ``ref`` at ``ref_base`` (None: ``ref`` must not exist) and the
    default partition spec is the one the files were written with. With ``rebased`` the snapshot's
    parent is ``ref``'s head ``ref_base`` instead (main moved by a compaction since the attempt branched,
    :class:`~kafka_iceberg.batch.publish` checks that it carries no ingest). Writes the manifests and the
    manifest list; commits nothing. ``table``: the commit's base (:func:`commit`). ``layout``: the
    (default spec id, format version) the files were written for (default: ``table``'s).

    Manifests are merged as Iceberg's Java ``MergeAppend`` (Spark's writer) does:
    ``commit.manifest-merge.enabled`` defaults to true there (pyiceberg's default is false). The
    snapshot is produced on a copy of the metadata without the table's history (:func:`_without_history`):
    pyiceberg deep-copies the whole metadata at every step of a transaction (about 0.6 s per commit at
    1,000 snapshots). pyiceberg's own commit retries are not used: a retry on a moved ``ref`` would
    append the batch twice.

    Raises:
        CommitConflictError: ``table``'s default spec or format version is not ``layout``'s (a
            concurrent change; the files would be labelled wrongly). Nothing is written.
    """
    from pyiceberg.table.update import AddSnapshotUpdate, AssertDefaultSpecId, AssertRefSnapshotId, AssertTableUUID

    md = table.metadata
    spec_id = _layout_unchanged(table, layout)
    tx = StagingTransaction(_without_history(table, branch, ref))
    parent = ref if rebased else branch
    with tx.update_snapshot(snapshot_properties=dict(summary), branch=parent).merge_append() as append:
        for f in files:
            append.append_data_file(f)
    staged = staged_updates(tx)
    snapshot_id = next(u.snapshot.snapshot_id for u in staged if isinstance(u, AddSnapshotUpdate))
    updates = (*staged, *_move_ref(md, ref, snapshot_id, drop=branch))
    requirements = (
        AssertTableUUID(uuid=md.table_uuid),
        AssertDefaultSpecId(default_spec_id=spec_id),
        AssertRefSnapshotId(ref=branch, snapshot_id=branch_base),
        AssertRefSnapshotId(ref=ref, snapshot_id=ref_base),
    )
    return StagedPublish(snapshot_id, table, requirements, updates, staged_files(tx))


def _move_ref(md, ref: str, snapshot_id: int, drop: str) -> tuple:
    """The updates that point branch ``ref`` at ``snapshot_id`` (keeping its retention settings, as
    Java's fast-forward does) and remove the ref ``drop``."""
    from pyiceberg.table.refs import SnapshotRefType
    from pyiceberg.table.update import RemoveSnapshotRefUpdate, SetSnapshotRefUpdate

    kept = md.refs.get(ref)
    retention = {k: getattr(kept, k, None) for k in ("max_ref_age_ms", "max_snapshot_age_ms", "min_snapshots_to_keep")}
    return (
        SetSnapshotRefUpdate(ref_name=ref, type=SnapshotRefType.BRANCH, snapshot_id=snapshot_id, **retention),
        RemoveSnapshotRefUpdate(ref_name=drop),
    )


def _layout_unchanged(table, layout: tuple[int, int] | None) -> int:
    """``table``'s default partition spec id, after checking that it and the format version are
    ``layout``'s (default spec id, format version); None: ``table``'s own.

    Raises:
        CommitConflictError: they changed since the data files were written for ``layout``.
    """
    md = table.metadata
    spec_id, format_version = layout or (md.default_spec_id, md.format_version)
    if (md.default_spec_id, md.format_version) != (spec_id, format_version):
        raise CommitConflictError(
            f"table {'.'.join(table.name())}: its default partition spec or format version changed (to spec "
            f"{md.default_spec_id}, v{md.format_version}) while this micro-batch wrote its data files for spec "
            f"{spec_id}, v{format_version}; nothing was published; rerun to write them again"
        )
    return spec_id


def staged_updates(tx) -> tuple:
    """The table updates a pyiceberg ``Transaction`` staged and has not committed. Wraps its private
    ``_updates`` once (pyiceberg keeps only the first ``AssertRefSnapshotId`` of a transaction, so a
    commit that requires two refs builds its own requirements); tests/test_arrow_writer.py pins it."""
    return tuple(tx._updates)


def staged_files(tx) -> tuple[str, ...]:
    """The manifests and manifest lists a pyiceberg ``Transaction``'s snapshot producers wrote. Wraps
    their private ``_written_manifests`` and ``_written_manifest_lists`` once; tests/test_publish_hardening.py
    pins it (a refused publish leaves no file of them)."""
    out: list[str] = []
    for producer in tx._snapshot_producers:
        out += [*producer._written_manifests, *producer._written_manifest_lists]
    return tuple(out)


def _without_history(table, branch: str, ref: str = "main"):
    """``table`` with metadata that keeps only the snapshots at ``branch`` and ``main`` (and refs
    to them); everything an append reads (schema, specs, properties, sequence number, the parent's
    manifest list and summary) is kept. Without a ``commit.manifest-merge.enabled`` property the
    copy says true (Java's default, see :func:`stage_publish`)."""
    from pyiceberg.table import Table

    md = table.metadata
    refs = {name: r for name, r in md.refs.items() if name in (branch, ref, "main")}
    heads = {ref.snapshot_id for ref in refs.values()}
    properties = {_MERGE_ENABLED: "true", **md.properties}  # Java's default; only this commit reads it
    slim = md.model_copy(
        update={
            "snapshots": [s for s in md.snapshots if s.snapshot_id in heads],
            "refs": refs,
            "properties": properties,
            "snapshot_log": [],
            "metadata_log": [],
            "statistics": [],
            "partition_statistics": [],
        }
    )
    return Table(table.name(), slim, table.metadata_location, table.io, table.catalog)


__all__ = [
    "WRITTEN_FOR",
    "StagedPublish",
    "StagingTransaction",
    "StaleBaseError",
    "apply_updates",
    "commit",
    "commit_branch",
    "delete_removed_metadata",
    "stage_publish",
    "staged_updates",
    "swap_row",
]
