"""The plan phase: from a table's history and the topic's watermarks to a :class:`WritePlan`.

Ingestion, accept-gap and replay differ only here; every plan goes through the one offset
planner :func:`kafka_iceberg.batch.planning.plan_batch` (accept-gap reads nothing) and then through
the same read, write and publish phases.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from kafka_iceberg.batch.context import Lake
from kafka_iceberg.batch.planning import BatchPlan, Watermarks, plan_batch
from kafka_iceberg.batch.types import Target, WritePlan
from kafka_iceberg.catalog.tables import TableMetadataView
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.errors import LakeError
from kafka_iceberg.state import IngestState, state_at


def ingest_target(spec: TableSpec) -> Target:
    """``main`` of the declared table, mirrored to its consumer group, bad records to its dead-letter table."""
    dlq = spec.bad_records.dead_letter_identifier if spec.bad_records.policy == "quarantine" else None
    return Target(spec.identifier, "main", spec.consumer_group, dlq)


def checked_state(spec: TableSpec, history: TableMetadataView, ref: str = "main") -> IngestState:
    """The ingest state at ``ref``'s head, checked against the declaration.

    Raises:
        LakeError: the table holds data but no ingest state (expired?), or was ingested from
            another topic than ``spec.topic``.
    """
    head = history.refs.get(ref)
    state = state_at(history.snapshots, head)
    if state.snapshot_id is None and head is not None:
        total = int(history.snapshots[head].summary.get("total-records", "0"))
        if total > 0:  # never restart from the starting position over existing data
            raise LakeError(
                f"table {spec.identifier} holds {total} records but no snapshot in {ref}'s ancestry carries "
                "kafka.offsets (were they expired?); refusing to re-ingest from the starting position, "
                "which would duplicate rows. See docs/state-contract.md."
            )
    if state.topic is not None and state.topic != spec.topic:
        raise LakeError(
            f"table {spec.identifier} was ingested from topic {state.topic!r} but tables.yaml declares "
            f"{spec.topic!r}; declare a new table instead of re-pointing this one"
        )
    return state


def plan_ingest(lake: Lake, spec: TableSpec, history: TableMetadataView) -> WritePlan:
    """Plan the next ingest micro-batch from the history's committed offsets and the topic's
    watermarks (read once here; the plan carries them).

    Raises:
        TopicNotFoundError, BrokerUnavailableError: from the cluster.
        DataLossError: a committed offset fell below the log start offset.
        OffsetsAheadError: a committed offset is above the high watermark.
        LakeError: see :func:`checked_state`.
    """
    state = checked_state(spec, history)
    partitions = lake.kafka.partitions(spec.topic)
    watermarks = lake.kafka.watermarks(spec.topic, partitions)
    offsets = plan_batch(
        table=spec.identifier,
        topic=spec.topic,
        base_snapshot_id=history.main,
        committed=state.offsets,
        watermarks=watermarks,
        initial_offsets=_initial_offsets(lake, spec, watermarks, bool(state.offsets)),
        bound=spec.max_records_per_partition,
    )
    return WritePlan(ingest_target(spec), offsets, state, table=history.table)


def _initial_offsets(lake: Lake, spec: TableSpec, watermarks: Mapping[int, Watermarks], has_state: bool):
    start = spec.starting_position
    if has_state or start.kind == "earliest":
        # a partition added to the topic after the table started is read from its beginning
        return {p: wm.low for p, wm in watermarks.items()}
    if start.kind == "latest":
        return {p: wm.high for p, wm in watermarks.items()}
    return lake.kafka.offsets_for_timestamp(spec.topic, sorted(watermarks), start.timestamp_ms)


def plan_accept_gap(lake: Lake, spec: TableSpec, history: TableMetadataView, commit_id: str, reason: str) -> WritePlan:
    """Plan a commit that reads nothing and moves every partition whose committed offset is below
    its log start offset up to it, recording each gap (``kafka.accepted-gaps``).

    Raises:
        LakeError: ``reason`` is empty, or there is no gap.
    """
    if not reason.strip():
        raise LakeError("accepting a gap needs a reason; it is kept in the snapshot summary")
    state = checked_state(spec, history)
    watermarks = lake.kafka.watermarks(spec.topic)
    now_ms = int(time.time() * 1000)
    gaps = tuple(
        {
            "partition": p,
            "start": state.offsets[p],
            "end": wm.low,
            "reason": reason.strip(),
            "accepted_ms": now_ms,
            "commit_id": commit_id,
        }
        for p, wm in sorted(watermarks.items())
        if p in state.offsets and state.offsets[p] < wm.low
    )
    if not gaps:
        raise LakeError(f"table {spec.identifier}: no committed offset is below its log start offset; no gap to accept")
    moved = {**state.offsets, **{g["partition"]: g["end"] for g in gaps}}
    offsets = BatchPlan(
        table=spec.identifier,
        topic=spec.topic,
        base_snapshot_id=history.main,
        start_offsets=moved,
        end_offsets=dict(moved),
        watermarks=watermarks,
        has_state=False,
    )
    return WritePlan(ingest_target(spec), offsets, state, new_gaps=gaps, table=history.table)


def plan_range(
    lake: Lake,
    target: Target,
    topic: str,
    history: TableMetadataView,
    *,
    start: Mapping[int, int],
    end: Mapping[int, int],
    bound: int,
    extra_summary: Mapping[str, str],
) -> WritePlan:
    """Plan the next batch of a bounded range (a replay): per partition of ``start``, read from the
    target ref's committed offset (``start`` where it has none) up to ``end``, at most ``bound``
    offsets.

    Raises:
        LakeError: a committed offset lies outside ``[start, end]``.
        DataLossError: a partition still to read starts below its log start offset.
    """
    head = history.refs.get(target.ref)
    state = state_at(history.snapshots, head)
    for p in start:
        s = state.offsets.get(p, start[p])
        if not start[p] <= s <= end[p]:
            raise LakeError(
                f"replay target {target.identifier}: committed offset {s} of partition {p} lies outside "
                f"the replay range [{start[p]}, {end[p]})"
            )
    watermarks = lake.kafka.watermarks(topic, sorted(start))
    committed = {p: o for p, o in state.offsets.items() if p in start}
    offsets = plan_batch(
        table=target.identifier,
        topic=topic,
        base_snapshot_id=head,
        committed=committed,
        watermarks=watermarks,
        initial_offsets=start,
        bound=bound,
        stop_at=end,
    )
    return WritePlan(target, offsets, state, extra_summary=dict(extra_summary), table=history.table)
