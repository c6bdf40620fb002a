"""One micro-batch of a consistency group: every member planned, cut at one source transaction
boundary, written to its own attempt branch, and published together in one catalog transaction (JDBC
catalog) or member by member with a marker tag (other catalogs: :mod:`kafka_iceberg.batch.group_marker`,
which first completes a group commit a crash left half-published).

recover and plan each member (as :func:`kafka_iceberg.batch.pipeline.run_micro_batch` does) -> read
the planned ranges' transaction ids and the transaction topic's END events after the group's position
(driver-side) -> :func:`kafka_iceberg.cdc.transactions.plan_group_cut` -> each member's plan ends at
the cut and carries the ``kafka.group`` entry -> branch, read, write per member -> one
:func:`kafka_iceberg.batch.group_commit.commit_group` (each member's ``main`` fast-forwarded to its
attempt snapshot and its branch dropped; members without records are guards), or
:func:`~kafka_iceberg.batch.group_marker.publish_one_by_one` -> dead-letter
publishes and consumer-group mirrors (noted in a run's :class:`~kafka_iceberg.batch.mirror.GroupMirror`
for its next flush when one is given, as for one table).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence

from kafka_iceberg.batch.commit import _move_ref
from kafka_iceberg.batch.context import CrashHook, Lake, no_crash
from kafka_iceberg.batch.group_commit import GroupMember, atomic_group_commit, check_group_catalog, commit_group
from kafka_iceberg.batch.group_marker import finish_group, publish_one_by_one
from kafka_iceberg.batch.mirror import GroupMirror
from kafka_iceberg.batch.pipeline import connect, prepare
from kafka_iceberg.batch.plan import plan_ingest
from kafka_iceberg.batch.publish import drop_branch, mirror_group, publish_dead_letter
from kafka_iceberg.batch.read import read_batch
from kafka_iceberg.batch.recovery import Attempt, attempt_branch
from kafka_iceberg.batch.types import BatchResult, WritePlan
from kafka_iceberg.batch.write import create_branch, max_timestamps, write_attempt
from kafka_iceberg.catalog.tables import metadata_view
from kafka_iceberg.cdc.transactions import GroupCut, change_transaction, parse_end, plan_group_cut
from kafka_iceberg.declaration.groups import group_of, source_prefix, transaction_topic
from kafka_iceberg.errors import ConfigError
from kafka_iceberg.kafka.admin import KafkaConfig
from kafka_iceberg.state import KEY_GROUP, group_state, group_summary, valid_through


@dataclasses.dataclass(frozen=True)
class GroupBatchResult:
    """What one group micro-batch committed: the group commit number ``seq`` (None: nothing to commit),
    ``snapshots``: identifier -> snapshot id committed (members with records), ``cut``: where it ended,
    ``results``: identifier -> every member's :class:`BatchResult` (``committed`` False and ``offsets``
    its committed offsets for a member that got no snapshot)."""

    seq: int | None
    snapshots: dict
    cut: GroupCut | None
    results: dict = dataclasses.field(default_factory=dict)


def run_group_batch(
    lake: Lake,
    specs: Sequence,
    commit_id: str,
    is_alive: Callable[[Attempt], bool] | None = None,
    mirror: GroupMirror | None = None,
    per_table: bool | None = None,
) -> GroupBatchResult:
    """Run one micro-batch of the consistency group ``specs`` (one group, one Debezium source).
    ``mirror``: each member's committed offsets go to its next flush instead of the consumer group now.
    ``per_table``: commit the members one by one with a marker tag
    (:mod:`~kafka_iceberg.batch.group_marker`; first completing a group commit a crash left half-published)
    instead of in one catalog transaction; None: where the catalog has no such transaction
    (:func:`~kafka_iceberg.batch.group_commit.atomic_group_commit`). Tests force it on the JDBC catalog.

    Raises:
        ConfigError: ``specs`` are not the members of one consistency group.
        GroupCommitUnsupportedError: ``per_table`` is False on a catalog without one transaction for the
            members; raised before anything is written.
        StaleBaseError: a member moved since the plan (nothing of the group published; rerun).
        LakeError: the per-table path could not complete a half-published group commit.
        What :func:`kafka_iceberg.batch.pipeline.run_batch` raises for one table's phases.
    """
    names = {group_of(s) for s in specs}
    if len(names) != 1 or None in names:
        raise ConfigError(
            f"a group micro-batch needs the tables of one consistency group, got {sorted(map(str, names))}"
        )
    per_table = not atomic_group_commit(lake.catalog) if per_table is None else per_table
    if not per_table:
        check_group_catalog(lake.catalog)
    name, prefix = names.pop(), source_prefix(specs[0].topic)
    views = _finish(lake, specs, name) if per_table else {}
    prepared = {s.identifier: prepare(lake, s, is_alive, views.get(s.identifier)) for s in specs}
    plans = {s.identifier: plan_ingest(lake, s, prepared[s.identifier][1]) for s in specs}
    records = [_group_record(p) for p in plans.values()]
    last = max((r for r in records if r), key=lambda r: r["seq"], default=None)
    tx_topic = transaction_topic(prefix)
    start = {int(p): int(o) for p, o in ((last or {}).get("position", {}).get("offsets") or {}).items()}
    cut = _cut(lake, prefix, tx_topic, plans, start)
    plans = {i: _shrunk(p, cut) for i, p in plans.items()}
    if not any(p.offsets.needs_commit for p in plans.values()) and cut.position == start:
        return GroupBatchResult(None, {}, cut, _results(prepared, plans, commit_id, {}))
    seq = (last["seq"] if last else 0) + 1
    position = {"topic": tx_topic, "offsets": {str(p): o for p, o in sorted(cut.position.items())}}
    if cut.transactions:
        position["last_transaction"] = cut.transactions[-1]
    tables = {i: (p.offsets.topic, p.offsets.end_offsets) for i, p in plans.items()}
    extra = group_summary(name, seq, position, tables)
    plans = {i: dataclasses.replace(p, extra_summary={**p.extra_summary, **extra}) for i, p in plans.items()}
    marker = (name, json.loads(extra[KEY_GROUP])) if per_table else None
    written = _write_and_commit(lake, specs, plans, commit_id, mirror, marker)
    snapshots = {i: r.snapshot_id for i, r in written.items()}
    return GroupBatchResult(seq, snapshots, cut, _results(prepared, plans, commit_id, written))


def _finish(lake: Lake, specs: Sequence, name: str) -> dict:
    """The per-table path's first step: ensure the members exist, then complete a group commit a crash left
    on some members only (:func:`~kafka_iceberg.batch.group_marker.finish_group`), before recovery drops
    the dead attempt branches holding its staged snapshots. Returns identifier -> metadata to recover on."""
    for spec in specs:
        lake.ensure_tables(spec)
    return finish_group(lake, name, [s.identifier for s in specs])


def _results(prepared: dict, plans: dict[str, WritePlan], commit_id: str, written: dict) -> dict:
    """identifier -> each member's :class:`BatchResult`: ``written``'s (its commit), else one without a
    snapshot at its committed offsets; with the recovery report and snapshot count of its planning."""
    out = {}
    for identifier, (recovery, history) in prepared.items():
        plan = plans[identifier]
        result = written.get(identifier) or BatchResult(
            identifier, commit_id, False, offsets=dict(plan.offsets.start_offsets), lag_after=plan.offsets.lag_after
        )
        out[identifier] = dataclasses.replace(result, recovery=recovery, snapshots=len(history.snapshots))
    return out


def run_group_micro_batch(
    spark,
    settings,
    specs: Sequence,
    *,
    commit_id: str,
    kafka=None,
    catalog=None,
    is_alive: Callable[[Attempt], bool] | None = None,
    crash_hook: CrashHook = no_crash,
    mirror: GroupMirror | None = None,
) -> dict:
    """:func:`run_group_batch` on a :class:`Lake` made from ``settings`` where the clients are not given
    (:func:`kafka_iceberg.batch.pipeline.connect`), as :func:`kafka_iceberg.batch.pipeline.run_micro_batch`
    does for one table: a worker's ``run_group`` port. Returns identifier -> each member's ``BatchResult``.
    Raises what :func:`run_group_batch` raises."""
    lake = connect(spark, settings, kafka, catalog, crash_hook)
    return run_group_batch(lake, specs, commit_id, is_alive, mirror).results


def _group_record(plan: WritePlan) -> dict | None:
    """The ``kafka.group`` record at the planned base (None: none, or an empty table)."""
    if plan.table is None or plan.base_snapshot_id is None:
        return None
    return group_state(metadata_view(plan.table).snapshots, plan.base_snapshot_id)


def _write_and_commit(
    lake: Lake,
    specs: Sequence,
    plans: dict[str, WritePlan],
    commit_id: str,
    mirror: GroupMirror | None,
    marker: tuple[str, dict] | None = None,
) -> dict:
    """Branch, read and write every member that has something to commit, then commit the group (the
    others guard it): in one catalog transaction, or with ``marker`` (group name, ``kafka.group`` record)
    member by member, then the tags; then publish dead letters and mirror the offsets (now, or noted in
    ``mirror``). Returns identifier -> the :class:`BatchResult` of each member written."""
    import time

    branch = attempt_branch(commit_id, int(time.time() * 1000))
    members, written = [], {}
    for spec in specs:
        plan = plans[spec.identifier]
        if not plan.offsets.needs_commit:
            members.append(GroupMember(lake.load(spec.identifier)))
            continue
        created = create_branch(lake, spec.identifier, branch, plan.base_snapshot_id, plan.table)
        batch = read_batch(lake, spec, plan, commit_id, created.table)
        try:
            attempt = write_attempt(lake, spec, plan, batch, created, commit_id)
        finally:
            batch.classified.unpersist()
        written[spec.identifier] = (attempt, batch)
        members.append(_fast_forward(lake.load(spec.identifier), plan, branch, attempt.snapshot_id))
    lake.crash_hook("after_write")
    if marker is None:
        commit_group(members, lake.crash_hook)
    else:
        snapshots = {i: attempt.snapshot_id for i, (attempt, _batch) in written.items()}
        publish_one_by_one(lake, marker[0], members, snapshots, marker[1])
    lake.crash_hook("after_publish")
    results = {}
    for spec in specs:
        if spec.identifier not in written:
            continue
        (attempt, batch), plan = written[spec.identifier], plans[spec.identifier]
        if attempt.dead_letter_snapshot_id is not None:
            publish_dead_letter(lake, plan.target.dead_letter_table, branch, attempt.dead_letter_snapshot_id)
            drop_branch(lake, plan.target.dead_letter_table, branch)
        if mirror is None:
            error = mirror_group(lake, plan, plan.offsets.end_offsets)
        else:
            error = mirror.note(
                spec.identifier, plan.target.consumer_group, plan.offsets.topic, plan.offsets.end_offsets
            )
        results[spec.identifier] = _member_result(spec, plan, commit_id, batch, attempt, error)
    return results


def _member_result(spec, plan: WritePlan, commit_id: str, batch, attempt, mirror_error: str | None) -> BatchResult:
    """The :class:`BatchResult` of one member published by the group commit (its attempt snapshot)."""
    summary = attempt.history.snapshots[attempt.snapshot_id].summary
    return BatchResult(
        table=spec.identifier,
        commit_id=commit_id,
        committed=True,
        records=batch.records,
        kafka_bytes=batch.kafka_bytes,
        ranges={r.partition: (r.start, r.end) for r in plan.offsets.ranges},
        offsets=dict(plan.offsets.end_offsets),
        lag_after=plan.offsets.lag_after,
        snapshot_id=attempt.snapshot_id,
        data_files_added=int(summary.get("added-data-files", 0)),
        data_bytes_added=int(summary.get("added-files-size", 0)),
        valid_through_ms=valid_through(max_timestamps(plan.base.max_timestamps, batch.stats)),
        group_commit_error=mirror_error,
        records_read=batch.records_read,
        quarantined=batch.quarantined,
        quarantined_by_partition={s.partition: s.quarantined for s in batch.stats if s.quarantined},
        quarantine_kinds=dict(batch.quarantine_kinds),
        schema_changes=list(batch.schema_changes),
        dead_letter_snapshot_id=attempt.dead_letter_snapshot_id,
        total_records=int(summary["total-records"]) if "total-records" in summary else None,
    )


def _fast_forward(table, plan: WritePlan, branch: str, snapshot_id: int) -> GroupMember:
    """The member that moves ``main`` to the attempt snapshot and drops the branch, requiring ``main`` at
    the planned base and the branch at that snapshot."""
    from pyiceberg.table.update import AssertRefSnapshotId

    requirements = (
        AssertRefSnapshotId(ref=plan.target.ref, snapshot_id=plan.base_snapshot_id),
        AssertRefSnapshotId(ref=branch, snapshot_id=snapshot_id),
    )
    return GroupMember(table, requirements, _move_ref(table.metadata, plan.target.ref, snapshot_id, drop=branch))


def _shrunk(plan: WritePlan, cut: GroupCut) -> WritePlan:
    """``plan`` with every partition's end offset at the cut."""
    topic = plan.offsets.topic
    ends = {p: min(e, cut.ends.get((topic, p), e)) for p, e in plan.offsets.end_offsets.items()}
    return dataclasses.replace(plan, offsets=dataclasses.replace(plan.offsets, end_offsets=ends))


def _cut(lake: Lake, prefix: str, tx_topic: str, plans: dict[str, WritePlan], start: dict[int, int]) -> GroupCut:
    """Read the planned ranges' transaction ids and the transaction topic's END events from ``start``
    (its low watermark where none) to its high watermark, and cut there (:func:`plan_group_cut`)."""
    conf = KafkaConfig.from_settings(lake.settings)
    marks = lake.kafka.watermarks(tx_topic)
    tx_ranges = {p: (start.get(p, w.low), w.high) for p, w in marks.items()}
    ends = [e for p, o, v in _read(conf, tx_topic, tx_ranges) if (e := parse_end(v, p, o)) is not None]
    changes, scanned = {}, {}
    for plan in plans.values():
        topic = plan.offsets.topic
        ranges = {r.partition: (r.start, r.end) for r in plan.ranges}
        for p, s in plan.offsets.start_offsets.items():
            scanned[(topic, p)] = ranges.get(p, (s, s))
            changes[(topic, p)] = []
        for p, o, v in _read(conf, topic, ranges):
            changes[(topic, p)].append((o, change_transaction(v)))
    full = {p: tx_ranges[p][0] for p in tx_ranges}
    return plan_group_cut(prefix, ends, changes, scanned, full)


def _read(conf: KafkaConfig, topic: str, ranges: dict[int, tuple[int, int]]) -> list[tuple[int, int, object]]:
    """(partition, offset, JSON value or None) of the records of ``ranges`` (partition -> [start, end))."""
    from confluent_kafka import Consumer, TopicPartition

    wanted = {p: r for p, r in ranges.items() if r[1] > r[0]}
    if not wanted:
        return []
    consumer = Consumer(conf.client_conf(**{"group.id": "lake-group-cut", "enable.auto.commit": False}))
    out, left = [], dict(wanted)
    try:
        consumer.assign([TopicPartition(topic, p, s) for p, (s, _e) in wanted.items()])
        while left:
            msg = consumer.poll(conf.timeout_s)
            if msg is None:
                raise ConfigError(f"topic {topic}: no record within {conf.timeout_s} s while reading {left}")
            if msg.error() is not None or msg.partition() not in left:
                continue
            p, o = msg.partition(), msg.offset()
            if o < left[p][1]:
                out.append((p, o, json.loads(msg.value()) if msg.value() else None))
            if o + 1 >= left[p][1]:
                left.pop(p)
                consumer.pause([TopicPartition(topic, p)])
    finally:
        consumer.close()
    return out


__all__ = ["GroupBatchResult", "run_group_batch", "run_group_micro_batch"]
