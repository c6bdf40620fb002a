"""The atomic commit of a consistency group: every member table's catalog row swapped in one
database transaction, or none.

On a SQL catalog (the JDBC catalog Spark shares, SQLite or PostgreSQL) a table's row in
``iceberg_tables`` points at its current metadata.json, and :func:`kafka_iceberg.batch.commit.commit`
moves it with a compare-and-swap. :func:`commit_group` does the same for several tables at once:

1. each member's requirements are validated against its base and its new metadata.json is written
   (nothing is visible yet: a crash here leaves files no row names, which recovery's orphan deletion
   removes, and the members' attempt branches, which recovery drops);
2. one database transaction moves every member's row, each only while it still names its base; a
   member without updates is a guard (its row must still name its base, so two group commits on one
   base serialise). A row that moved rolls the transaction back: :class:`StaleBaseError`, nothing is
   committed and the written metadata files are deleted. A crash inside the transaction rolls it back
   (SQLite's journal, PostgreSQL's aborted session).

Readers of the catalog therefore see every member at its new snapshot, or none of them. Other
catalogs (:func:`atomic_group_commit` False) take the per-table path of
:mod:`kafka_iceberg.batch.group_marker`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kafka_iceberg.batch.commit import (
    StagedPublish,
    StaleBaseError,
    _delete_quietly,
    _swappable,
    _write,
    apply_updates,
    delete_removed_metadata,
    swap_row,
)
from kafka_iceberg.errors import LakeError

log = logging.getLogger(__name__)

GROUP_CRASH_POINTS = ("group_after_table_write", "group_in_transaction")
"""Where :func:`commit_group` calls its crash hook: after each member's metadata.json is written (no
row swapped), and inside the database transaction after the first member's row was updated."""


class GroupCommitUnsupportedError(LakeError):
    """The members are not all on one SQL catalog whose database reports updated rows; a group
    commit cannot be atomic there."""


@dataclass(frozen=True)
class GroupMember:
    """One table of a group commit: ``table`` (a pyiceberg ``Table``, the commit's base),
    ``requirements`` checked against it and ``updates`` applied to it. No updates: a guard that only
    requires the table's row to still name the base."""

    table: object
    requirements: tuple = ()
    updates: tuple = ()

    @classmethod
    def of(cls, staged: StagedPublish) -> GroupMember:
        """The member that commits a staged publish (:func:`~kafka_iceberg.batch.commit.stage_publish`)."""
        return cls(staged.table, tuple(staged.requirements), tuple(staged.updates))

    @property
    def identifier(self) -> str:
        """The table's ``namespace.name``."""
        return ".".join(self.table.name())


@dataclass(frozen=True)
class _Prepared:
    member: GroupMember
    metadata: object  # the new TableMetadata; the base's own for a guard
    location: str | None  # the new metadata.json; None for a guard
    io: object


def commit_group(members: Sequence[GroupMember], crash_hook: Callable[[str], None] = lambda point: None) -> list:
    """Commit every member in one catalog transaction; returns the committed pyiceberg ``Table`` s,
    in ``members``' order. ``crash_hook`` is called at each of :data:`GROUP_CRASH_POINTS`.

    Raises:
        GroupCommitUnsupportedError: the members are not on one swappable SQL catalog.
        CommitFailedException: a requirement failed on a base (nothing written).
        StaleBaseError: a member's row no longer names its base (nothing committed; files deleted).
        The SQL driver's error when the database fails: then the outcome is unknown (reload a member:
            either every member shows its new metadata or none does); the files are left to recovery.
    """
    catalog = _one_catalog(members)
    for member in members:
        for requirement in member.requirements:
            requirement.validate(member.table.metadata)
    prepared: list[_Prepared] = []
    try:
        for member in members:
            base = member.table
            metadata = apply_updates(base.metadata, member.updates, base.metadata_location)
            if metadata is base.metadata:
                prepared.append(_Prepared(member, metadata, None, base.io))
                continue
            location, io = _write(catalog, metadata, base.metadata_location)
            prepared.append(_Prepared(member, metadata, location, io))
            crash_hook("group_after_table_write")
        _swap_all(catalog, prepared, crash_hook)
    except (StaleBaseError, ValueError):
        for p in prepared:
            if p.location is not None:
                _delete_quietly(p.io, p.location)
        raise
    return [_committed(p) for p in prepared]


def _committed(p: _Prepared):
    from pyiceberg.table import Table

    base = p.member.table
    if p.location is None:
        return base
    delete_removed_metadata(p.io, base.metadata, p.metadata)
    return Table(base.name(), p.metadata, p.location, p.io, base.catalog)


def atomic_group_commit(catalog) -> bool:
    """Whether ``catalog`` (a pyiceberg catalog) commits a consistency group's members in one transaction
    (:func:`commit_group`): a SQL catalog whose database reports updated rows (the JDBC catalog, SQLite or
    PostgreSQL). Elsewhere (REST, Glue, Hive, Nessie) a group commits member by member with a marker tag
    (:mod:`kafka_iceberg.batch.group_marker`)."""
    return _swappable(catalog)


def check_group_catalog(catalog) -> None:
    """Refuse the one-transaction group commit on ``catalog`` (a pyiceberg catalog) before anything of it
    is written.

    Raises:
        GroupCommitUnsupportedError: ``catalog`` is not a SQL catalog with row counts (a REST, Hive or
            Glue catalog): its tables can only commit one by one.
    """
    if not atomic_group_commit(catalog):
        raise GroupCommitUnsupportedError(
            f"catalog {getattr(catalog, 'name', catalog)!r} is not a SQL catalog with row counts: it cannot "
            "commit a consistency group's tables in one transaction; commit them one by one with a marker tag"
        )


def _one_catalog(members: Sequence[GroupMember]):
    """The one swappable SQL catalog all members are on.

    Raises:
        GroupCommitUnsupportedError: no members, several catalogs, or a catalog without row counts.
    """
    if not members:
        raise GroupCommitUnsupportedError("a group commit needs at least one table")
    catalogs = {id(m.table.catalog): m.table.catalog for m in members}
    catalog = members[0].table.catalog
    if len(catalogs) > 1 and len({(c.name, str(c.engine.url)) for c in catalogs.values() if _swappable(c)}) != 1:
        raise GroupCommitUnsupportedError("the tables of a group commit must be on one catalog")
    if not all(_swappable(c) for c in catalogs.values()):
        raise GroupCommitUnsupportedError(
            f"catalog {catalog.name!r} is not a SQL catalog with row counts; its tables commit one by one"
        )
    return catalog


def _swap_all(catalog, prepared: list[_Prepared], crash_hook: Callable[[str], None]) -> None:
    """In one database transaction, point each member's row at its new metadata.json (a guard: at its
    base) while it still names its base; rows are updated in identifier order (two concurrent group
    commits lock them in the same order).

    Raises:
        StaleBaseError: a row no longer names its base (the transaction is rolled back).
    """
    from sqlalchemy.orm import Session

    with Session(catalog.engine) as session:  # closing it without a commit rolls the transaction back
        for n, p in enumerate(sorted(prepared, key=lambda p: p.member.identifier)):
            table = p.member.table
            why = "; no table of the group was committed"
            swap_row(session, catalog, table.name(), table.metadata_location, p.location, why)
            if n == 0:
                crash_hook("group_in_transaction")
        session.commit()


__all__ = [
    "GROUP_CRASH_POINTS",
    "GroupCommitUnsupportedError",
    "GroupMember",
    "atomic_group_commit",
    "check_group_catalog",
    "commit_group",
]
