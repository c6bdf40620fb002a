"""A consistency group read at one consistent position: every member at the snapshot of one group
commit (:func:`kafka_iceberg.state.group_position`), whatever order the tables are loaded in and on
every catalog type (one transaction on a JDBC catalog, member by member with a marker tag elsewhere:
:mod:`kafka_iceberg.batch.group_marker`)."""

from __future__ import annotations

from collections.abc import Sequence

from kafka_iceberg.catalog.tables import load_table, metadata_view
from kafka_iceberg.errors import ConfigError, LakeError
from kafka_iceberg.state import group_position, group_state


def read_group(catalog, identifiers: Sequence[str], attempts: int = 5) -> dict[str, tuple[object, int]]:
    """identifier -> (pyiceberg ``Table``, snapshot id) of every member of a group at its newest group
    commit. A member loaded before that commit landed is loaded again (up to ``attempts`` rounds); when
    the newest commit is still not on every member after that (a group commit published member by member
    and interrupted, which the group's next micro-batch completes), the newest commit every member has
    reached is read.

    Raises:
        ConfigError: a table does not exist, or no member was committed in a group.
        LakeError: no group commit is reached by every member.
    """
    tables: dict = {}
    older = None
    for _ in range(max(1, attempts)):
        for ident in identifiers:
            tables[ident] = load_table(catalog, ident)
            if tables[ident] is None:
                raise ConfigError(f"table {ident} does not exist")
        views = {i: metadata_view(t) for i, t in tables.items()}
        if not any(v.main for v in views.values()):
            raise ConfigError(f"no table of {list(identifiers)} has a snapshot yet")
        heads = {i: (v.snapshots, v.main) for i, v in views.items()}
        position = group_position(heads, fallback=False)
        if position is not None:
            return {i: (tables[i], position[i]) for i in identifiers}
        if all(_never_grouped(v) for v in views.values()):
            raise ConfigError(f"tables {list(identifiers)} were never committed as a consistency group")
        older = (dict(tables), group_position(heads))
    if older is not None and older[1] is not None:
        return {i: (older[0][i], older[1][i]) for i in identifiers}
    raise LakeError(f"tables {list(identifiers)}: no group commit is on every member after {attempts} loads")


def _never_grouped(view) -> bool:
    return group_state(view.snapshots, view.main) is None


__all__ = ["read_group"]
