"""What a worker serves as one: a unit is a consistency group's member tables together
(docs/cdc.md#consistency-groups: one micro-batch over all of them, committed in one catalog
transaction) or one ungrouped table alone. Pure functions of the run's table states; no Spark,
no Dagster (:mod:`kafka_iceberg.batch.worker` runs them on its main thread)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kafka_iceberg.declaration.groups import group_of
from kafka_iceberg.declaration.spec import TableSpec

Unit = tuple[TableSpec, ...]
"""The tables of one unit, in declaration order: a consistency group's members, or one table."""


def units_of(specs: Sequence[TableSpec]) -> list[Unit]:
    """``specs`` as units in declaration order (a group at the place of its first member): each
    consistency group's members together, every other table alone."""
    units: dict[str, list[TableSpec]] = {}
    for spec in specs:
        group = group_of(spec)
        units.setdefault(f"group:{group}" if group else f"table:{spec.identifier}", []).append(spec)
    return [tuple(members) for members in units.values()]


def is_group(unit: Unit) -> bool:
    """Whether ``unit`` is a consistency group (served by one group micro-batch), not a table alone."""
    return group_of(unit[0]) is not None


def identifiers(units: Iterable[Unit]) -> frozenset[str]:
    """The table identifiers of every member of ``units``."""
    return frozenset(spec.identifier for unit in units for spec in unit)


def next_units(states: Mapping[str, Any], units: Sequence[Unit], paused: frozenset[str] = frozenset()) -> list[Unit]:
    """The units to serve next, in order, from the tables' states (identifier -> a
    :class:`~kafka_iceberg.batch.worker.TableState`): those with no member set aside (``error``) and
    with records waiting in any member, longest waiting first (the earliest ``waiting_since`` of its
    members; ties, such as the units one poll found, by the earliest ``last_commit_s``, never served first,
    then in ``units``' order), less those with a member ``paused``. A unit waits as one: its members are
    served by one micro-batch."""
    due = []
    for index, unit in enumerate(units):
        members = [states[spec.identifier] for spec in unit]
        since = [s.waiting_since for s in members if s.waiting_since is not None]
        if since and all(s.error is None for s in members):
            served = min(-math.inf if s.last_commit_s is None else s.last_commit_s for s in members)
            due.append((min(since), served, index, unit))
    due.sort(key=lambda item: item[:3])
    return [item[3] for item in due if not any(spec.identifier in paused for spec in item[3])]


__all__ = ["Unit", "identifiers", "is_group", "next_units", "units_of"]
