"""Which worker serves which table, and how many workers a location gets: plain functions of the declared
tables, the catalog and the cores (no connection)."""

from __future__ import annotations

from collections.abc import Sequence

from kafka_iceberg.declaration.groups import assignment_units
from kafka_iceberg.declaration.spec import TableSpec


def assign_workers(specs: Sequence[TableSpec], workers: int) -> dict[int, list[TableSpec]]:
    """Tables per worker (0 .. ``workers`` - 1): round robin over the identifiers in sorted order, so the
    workers' shares differ by one table at most. A table added or removed moves others at the next
    reload; two runs serving one table for a while is safe (conditional commits), only slower. The tables of
    one ``consistency_group`` are one unit, served by one worker."""
    groups: dict[int, list[TableSpec]] = {k: [] for k in range(max(1, workers))}
    for i, unit in enumerate(assignment_units(specs)):  # a consistency group's tables stay on one worker
        groups[i % max(1, workers)].extend(unit)
    return groups


MAX_DEFAULT_WORKERS = 4
"""The most workers a location gets without ``LAKE_WORKERS``: each is a process with its own Spark driver
JVM (about 1 GiB resident), so memory, not cores, bounds them."""


def worker_count(tables: int, sqlite_catalog: bool, cores: int | None, override: int | None = None) -> int:
    """How many workers serve ``tables`` declared tables: ``override`` (``LAKE_WORKERS``) when set; else 1 on
    a SQLite catalog (it admits one committing process, so a second worker would only wait for the pool);
    else one per core (``cores``, None: 1), never more than the tables nor :data:`MAX_DEFAULT_WORKERS`.
    Always at least 1."""
    if override:
        return override
    if sqlite_catalog:
        return 1
    return max(1, min(tables, cores or 1, MAX_DEFAULT_WORKERS))
