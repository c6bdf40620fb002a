"""The per-table commit of a consistency group, for catalogs that cannot swap several tables in one
transaction (REST, Glue, Hive, Nessie: :func:`kafka_iceberg.batch.group_commit.atomic_group_commit` is
False), with a marker tag on every member.

1. Before the first publish every member is loaded again: its ``main`` must still be where the commit
   expects it (a member with records: at the planned base; one without: where the write phase loaded it),
   else :class:`~kafka_iceberg.batch.commit.StaleBaseError` and nothing is published.
2. :func:`publish_one_by_one` fast-forwards each member's ``main`` to its attempt snapshot and drops the
   attempt branch, one table at a time in identifier order, each with the single-table compare-and-swap
   (:func:`kafka_iceberg.batch.commit.commit`: ``main`` still at the planned base, the branch at the
   snapshot). A member without records in the micro-batch publishes nothing.
3. Only after every member is published, the tag ``group-<group name>`` (:func:`group_tag`) of every
   member moves to its snapshot at this group commit: the newest snapshot of ``main`` whose offsets are
   the member's entry in the ``kafka.group`` record (for a member without records, its current one).

A crash between two publishes leaves some members at group commit ``seq`` and the others before it. The
tags and :func:`kafka_iceberg.catalog.group_view.read_group` (the newest ``seq`` every member reached) still
show ``seq - 1``. The group's next micro-batch calls :func:`finish_group` before recovery drops dead attempt
branches: each member short of the newest record is fast-forwarded to its attempt snapshot of that
``seq`` (roll-forward: a published member cannot be taken back), then the tags move. A crash among the tag
moves is finished the same way. A compaction of a member first rolls the group forward
(:func:`roll_forward_group`, from :func:`kafka_iceberg.ops.rota.run_job`): once its ``replace`` snapshot is
on a short member's ``main``, that ``main`` can no longer be fast-forwarded to the staged snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from kafka_iceberg.batch.commit import StaleBaseError, _move_ref, commit
from kafka_iceberg.batch.context import Lake
from kafka_iceberg.batch.group_commit import GroupMember
from kafka_iceberg.batch.recovery import parse_attempt
from kafka_iceberg.catalog.tables import TableMetadataView, metadata_view
from kafka_iceberg.errors import LakeError
from kafka_iceberg.state import ancestors, group_offsets, group_record, group_state, member_snapshot

log = logging.getLogger(__name__)

MARKER_CRASH_POINTS = ("group_between_publishes", "group_between_tags")
"""Where the per-table group commit calls its crash hook: before each member's publish after the first
(some members published), and before each tag move after the first (every member published)."""

_TRIES = 3  # commits made again on a fresh load when the table moved (another commit landed)


def group_tag(name: str) -> str:
    """The marker tag of consistency group ``name`` on each member table: ``group-<name>``."""
    return f"group-{name}"


def publish_one_by_one(
    lake: Lake, name: str, members: Sequence[GroupMember], snapshots: Mapping[str, int], record: Mapping
) -> dict[str, TableMetadataView]:
    """Publish group commit ``record`` (its ``kafka.group`` record) member by member, then move the tags
    (steps 1-3 of the module docstring). ``members``: every member (:class:`GroupMember`, a guard for one
    without records); ``snapshots``: identifier -> attempt snapshot id of each member with records.
    Returns identifier -> each member's metadata after the commit.

    Raises:
        StaleBaseError, CommitFailedException: a member moved since the plan (nothing published).
        LakeError: a member after the first could not be published (the group's next micro-batch rolls
            it forward).
        CatalogUnavailableError: the catalog stayed unavailable.
    """
    ordered = sorted(members, key=lambda m: m.identifier)
    tables = {m.identifier: _at_base(lake, m) for m in ordered}
    published: list[str] = []
    for member in ordered:
        ident = member.identifier
        if ident not in snapshots:
            continue
        if published:
            lake.crash_hook("group_between_publishes")
        try:
            tables[ident] = _commit(
                lake, ident, tables[ident], lambda _t, m=member: (m.requirements, m.updates), snapshots[ident]
            )
        except Exception as exc:
            if not published:
                raise
            raise LakeError(
                f"table {ident}: group {name!r} commit {record['seq']} was published on {published} but not on "
                f"this table ({exc}); the group's next micro-batch rolls it forward"
            ) from exc
        published.append(ident)
    return move_tags(lake, name, record, {i: metadata_view(t) for i, t in tables.items()})


def _at_base(lake: Lake, member: GroupMember):
    """``member``'s table loaded again, after checking that its ``main`` is still at the base.

    Raises:
        StaleBaseError, CommitFailedException: it moved (nothing of the group was published).
    """
    fresh = lake.load(member.identifier)
    for requirement in member.requirements:
        requirement.validate(fresh.metadata)
    base, now = metadata_view(member.table).main, metadata_view(fresh).main
    if base != now:
        raise StaleBaseError(
            f"table {member.identifier}: main moved from snapshot {base} to {now} since the group micro-batch was "
            "planned; no table of the group was published; rerun"
        )
    return fresh


def move_tags(
    lake: Lake, name: str, record: Mapping, views: Mapping[str, TableMetadataView] | None = None
) -> dict[str, TableMetadataView]:
    """Point every member's tag :func:`group_tag` at its snapshot at group commit ``record`` (a
    ``kafka.group`` record), in identifier order; a member without a snapshot yet gets none. ``views``:
    members' current metadata where known (others are loaded). Returns ``views`` and the loaded ones, as
    of after the tag moves.

    Raises:
        LakeError: a member's ``main`` has no snapshot with its offsets in ``record``.
    """
    tag, moved, out = group_tag(name), 0, dict(views or {})
    for ident in sorted(record["tables"]):
        view = out.get(ident) or lake.history(ident)
        out[ident] = view
        if view.main is None:
            continue
        target = member_snapshot(view.snapshots, view.main, group_offsets(record, ident))
        if target is None:
            raise LakeError(
                f"table {ident}: no snapshot of main has its offsets of group {name!r} commit {record['seq']}; "
                f"tag {tag} not moved"
            )
        if view.refs.get(tag) == target:
            continue
        if moved:
            lake.crash_hook("group_between_tags")
        committed = _commit(lake, ident, view.table, lambda table, target=target: _tag_update(table, tag, target))
        out[ident] = metadata_view(committed)
        moved += 1
    return out


def _tag_update(table, tag: str, snapshot_id: int) -> tuple[tuple, tuple]:
    """The requirement (the tag where ``table`` has it) and update that point ``tag`` at ``snapshot_id``."""
    from pyiceberg.table.refs import SnapshotRefType
    from pyiceberg.table.update import AssertRefSnapshotId, SetSnapshotRefUpdate

    ref = table.metadata.refs.get(tag)
    requirement = AssertRefSnapshotId(ref=tag, snapshot_id=None if ref is None else ref.snapshot_id)
    return (requirement,), (SetSnapshotRefUpdate(ref_name=tag, type=SnapshotRefType.TAG, snapshot_id=snapshot_id),)


def _commit(lake: Lake, ident: str, table, change: Callable, main_at: int | None = None):
    """Commit ``change(table)`` (requirements, updates) on ``table``; made again on a fresh load when the
    table moved meanwhile, and after a transient catalog error unless ``main`` is at ``main_at`` then (the
    commit landed). Returns the committed pyiceberg ``Table``.

    Raises:
        CommitFailedException: a requirement failed. StaleBaseError: still moving after the tries.
    """

    def landed():
        fresh = lake.load(ident)
        return fresh if main_at is not None and metadata_view(fresh).main == main_at else None

    for n in range(_TRIES):
        base = table if n == 0 else lake.load(ident)
        try:
            return lake.retry(f"table {ident}: commit", lambda base=base: commit(base, *change(base)), landed)
        except StaleBaseError:
            if n == _TRIES - 1:
                raise
    raise AssertionError("unreachable")


def finish_group(lake: Lake, name: str, identifiers: Sequence[str]) -> dict[str, TableMetadataView]:
    """Complete the newest group commit of group ``name`` (members ``identifiers``) where a crash left it
    half-published: fast-forward each member short of it to its attempt snapshot of that ``seq``
    (:func:`roll_forward_group`) and move the tags (module docstring). Call it before recovery, which drops
    dead attempt branches. Returns identifier -> each member's metadata as of after it (one load per
    member; empty when a member does not exist yet).

    Raises:
        LakeError: a member's staged snapshot of that ``seq`` is gone, or its ``main`` moved past its base.
    """
    views, record = _rolled_forward(lake, name, identifiers)
    if record is None:
        return views
    return {i: v for i, v in move_tags(lake, name, record, views).items() if i in views}


def roll_forward_group(lake: Lake, name: str, identifiers: Sequence[str]) -> list[str]:
    """The roll-forward of :func:`finish_group` without the tag moves, for a commit on a member's ``main``
    that is not the group's (a compaction: after it, ``main`` is no ancestor of the staged snapshot and the
    group could not be completed). A member short of the newest record without a staged snapshot of it (on a
    catalog that commits the group in one transaction, never half-published: none) is left to the group's
    next micro-batch, which names it. Returns the identifiers rolled forward (that micro-batch moves the tags).

    Raises:
        LakeError: a member's ``main`` is not an ancestor of its staged snapshot (as :func:`finish_group`).
        CatalogUnavailableError: the catalog stayed unavailable.
    """
    before = {i: lake.find(i) for i in identifiers}
    after, _record = _rolled_forward(lake, name, identifiers, before, staged_only=True)
    return sorted(i for i, v in after.items() if i not in before or v.main != before[i].main)


def _rolled_forward(
    lake: Lake, name: str, identifiers: Sequence[str], views: dict | None = None, staged_only: bool = False
) -> tuple[dict[str, TableMetadataView], Mapping | None]:
    """(identifier -> metadata after the roll-forward, the newest ``kafka.group`` record of group ``name``
    on any member or None); ``views``: the members' metadata if already loaded; ``staged_only``: skip a short
    member without a staged snapshot. Empty when a member does not exist yet. Raises what
    :func:`_roll_forward` raises."""
    views = dict(views) if views is not None else {i: lake.find(i) for i in identifiers}
    if any(v is None for v in views.values()):
        return {}, None
    records = [r for v in views.values() if (r := group_state(v.snapshots, v.main)) and r["name"] == name]
    record = max(records, key=lambda r: r["seq"], default=None)
    if record is None:
        return views, None
    for ident in sorted(record["tables"]):
        view = views.get(ident) or lake.history(ident)
        wanted = group_offsets(record, ident)
        if member_snapshot(view.snapshots, view.main, wanted) is None and (view.main or any(wanted.values())):
            if staged_only and not _staged(view, name, record["seq"]):
                continue
            views[ident] = _roll_forward(lake, name, ident, view, record["seq"])
    return views, record


def _roll_forward(lake: Lake, name: str, ident: str, view: TableMetadataView, seq: int) -> TableMetadataView:
    """Fast-forward ``ident``'s ``main`` to its attempt snapshot of group ``name``'s commit ``seq`` and drop
    the attempt branch; returns the table's metadata after that commit.

    Raises:
        LakeError: no attempt branch holds that snapshot, or ``main`` is not an ancestor of it.
    """
    from pyiceberg.table.update import AssertRefSnapshotId

    staged = _staged(view, name, seq)
    if not staged:
        raise LakeError(
            f"table {ident}: group {name!r} commit {seq} is published on other members, but no attempt branch of "
            "this table holds its staged snapshot; the group cannot be completed (docs/cdc.md#consistency-groups)"
        )
    branch, sid = staged[0]
    if view.main is not None and view.main not in {s.snapshot_id for s in ancestors(view.snapshots, sid)}:
        raise LakeError(
            f"table {ident}: main moved to snapshot {view.main}, which is not an ancestor of the staged snapshot "
            f"{sid} of group {name!r} commit {seq}; the group cannot be completed (docs/cdc.md#consistency-groups)"
        )

    def change(table):
        requirements = (
            AssertRefSnapshotId(ref="main", snapshot_id=view.main),
            AssertRefSnapshotId(ref=branch, snapshot_id=sid),
        )
        return requirements, _move_ref(table.metadata, "main", sid, drop=branch)

    committed = _commit(lake, ident, view.table, change, sid)
    log.warning("table %s: group %r commit %s rolled forward to snapshot %s (branch %s)", ident, name, seq, sid, branch)
    return metadata_view(committed)


def _staged(view: TableMetadataView, name: str, seq: int) -> list[tuple[str, int]]:
    """(attempt branch, snapshot id) of every attempt branch of ``view`` holding group ``name``'s commit ``seq``."""
    return [
        (branch, sid)
        for branch, sid in sorted(view.refs.items())
        if parse_attempt(branch) is not None
        and (r := group_record(view.snapshots[sid])) is not None
        and (r["name"], r["seq"]) == (name, seq)
    ]


__all__ = ["MARKER_CRASH_POINTS", "finish_group", "group_tag", "move_tags", "publish_one_by_one", "roll_forward_group"]
