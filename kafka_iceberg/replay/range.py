"""The offsets a replay covers, resolved from a request against the topic and the original table."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from kafka_iceberg.batch.planning import Watermarks
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.kafka.admin import KafkaMetadata
from kafka_iceberg.replay.request import ReplayDataLossError, ReplayError, ReplayRequest
from kafka_iceberg.state import SnapshotInfo, ancestors, state_at


# -- the range ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplayRange:
    """The offsets a replay covers: per partition, the half-open range ``[start[p], end[p])``
    of ``topic``. ``start`` and ``end`` have the same partitions."""

    topic: str
    start: dict[int, int]
    end: dict[int, int]

    @property
    def ranges(self) -> dict[int, tuple[int, int]]:
        """``{partition: (start, end)}``, every partition of the replay (empty ones included)."""
        return {p: (self.start[p], self.end[p]) for p in sorted(self.start)}

    @property
    def width(self) -> int:
        """Offsets covered, summed over partitions (an upper bound on the records)."""
        return sum(e - s for s, e in self.ranges.values())


def replay_params(original: str, rng: ReplayRange, from_snapshot: int | None) -> dict:
    """The replay's identity as recorded in ``kafka.replay-of`` (JSON-ready, string partition keys)."""
    return {
        "original": original,
        "topic": rng.topic,
        "from_snapshot": from_snapshot,
        "start": {str(p): o for p, o in sorted(rng.start.items())},
        "end": {str(p): o for p, o in sorted(rng.end.items())},
    }


def _int_keys(m: Mapping[str, int]) -> dict[int, int]:
    return {int(k): int(v) for k, v in m.items()}


def resolve_range(
    kafka: KafkaMetadata,
    spec: TableSpec,
    request: ReplayRequest,
    *,
    original_snapshots: Mapping[int, SnapshotInfo],
    original_main: int | None,
    recorded: Mapping | None = None,
) -> ReplayRange:
    """Turn a request into per-partition offsets and check them against the topic and the original.

    Args:
        original_snapshots, original_main: the original table's snapshots and ``main`` head.
        recorded: the target's ``kafka.replay-of`` record when resuming; a start of
            ``earliest`` and a defaulted end then take the recorded offsets, so a resumed
            replay keeps its range even after retention or ingestion moved on.

    Returns:
        A :class:`ReplayRange` with ``start[p] <= end[p] <= high watermark`` for every partition.

    Raises:
        ReplayError: unknown partitions, a snapshot not in ``main``'s ancestry or without
            ingest state, start after end, an end beyond the high watermark, no end known
            (the original has no committed offsets), or, with ``request.validate``, an end
            beyond the original's committed offsets.
        TopicNotFoundError, BrokerUnavailableError: from the cluster.
    """
    partitions = kafka.partitions(spec.topic)
    wm = kafka.watermarks(spec.topic, partitions)
    original_offsets = state_at(original_snapshots, original_main).offsets
    where = f"replay of table {spec.identifier}"
    start = _start(kafka, spec, request, partitions, wm, original_snapshots, original_main, recorded, where)
    end, defaulted = _end(kafka, spec, request, start, original_offsets, recorded, where)
    for p in sorted(start):
        _check_partition(request, where, p, start[p], end[p], wm[p], original_offsets.get(p), p in defaulted)
    return ReplayRange(spec.topic, {p: start[p] for p in sorted(start)}, {p: end[p] for p in sorted(start)})


def _start(kafka, spec, request, partitions, wm, original_snapshots, original_main, recorded, where) -> dict[int, int]:
    topic = spec.topic
    if request.start_offsets is not None:
        unknown = sorted(set(request.start_offsets) - set(partitions))
        if unknown:
            raise ReplayError(f"{where}: topic {topic} has no partitions {unknown} (it has {partitions})")
        return dict(request.start_offsets)
    if request.start_earliest:
        return _int_keys(recorded["start"]) if recorded else {p: w.low for p, w in wm.items()}
    if request.start_ms is not None:
        return kafka.offsets_for_timestamp(topic, partitions, request.start_ms)
    chain = {s.snapshot_id for s in ancestors(original_snapshots, original_main)}
    if request.from_snapshot not in chain:
        raise ReplayError(
            f"{where}: snapshot {request.from_snapshot} is not in main's ancestry (expired, or on another "
            "branch); pick one from the table's history (SELECT * FROM <table>.history)"
        )
    state = state_at(original_snapshots, request.from_snapshot)
    if not state.offsets:
        raise ReplayError(
            f"{where}: snapshot {request.from_snapshot} has no committed offsets (kafka.offsets) "
            "in its ancestry; nothing was ingested before it"
        )
    # a partition added to the topic after the snapshot starts where ingestion starts it: the log start
    return {p: state.offsets.get(p, wm[p].low) for p in partitions}


def _end(kafka, spec, request, start, original_offsets, recorded, where) -> tuple[dict[int, int], set[int]]:
    if request.end_offsets is not None:
        unknown = sorted(set(request.end_offsets) - set(start))
        if unknown:
            raise ReplayError(
                f"{where}: end offsets name partitions {unknown} that the start does not "
                f"(start partitions: {sorted(start)})"
            )
    if request.end_ms is not None:
        return kafka.offsets_for_timestamp(spec.topic, sorted(start), request.end_ms), set()
    end = dict(request.end_offsets or {})
    if recorded and request.end_offsets is None:
        end = {p: o for p, o in _int_keys(recorded["end"]).items() if p in start}
    defaulted = set()
    for p in start:
        if p not in end:
            defaulted.add(p)
            if not original_offsets:
                raise ReplayError(
                    f"{where}: the original has no committed offsets, so there is no default end; "
                    "give one (--to or --to-time)"
                )
            # the original holds nothing of a partition it has no offset for
            end[p] = original_offsets.get(p, start[p])
    return end, defaulted


def _check_partition(
    request, where: str, p: int, s: int, e: int, w: Watermarks, held: int | None, defaulted: bool
) -> None:
    if s > e:
        why = " (the original's committed offset: it holds nothing from the start on)" if defaulted else ""
        raise ReplayError(f"{where}: partition {p} starts at offset {s}, after its end {e}{why}")
    if e > w.high:
        raise ReplayError(f"{where}: partition {p} ends at offset {e}, beyond its high watermark {w.high}")
    if request.validate and e > s and (held is None or e > held):
        raise ReplayError(
            f"{where}: partition {p} ends at offset {e} but the original holds offsets only below "
            f"{held if held is not None else 'none'}; validation compares the same offsets, so end the "
            "replay there, or replay without validation"
        )


def check_readable(
    table: str, topic: str, progress: Mapping[int, int], end: Mapping[int, int], wm: Mapping[int, Watermarks]
) -> None:
    """Every partition still to replay (``progress < end``) starts at or above its log start offset.

    Raises:
        ReplayDataLossError: one does not.
    """
    for p in sorted(progress):
        if progress[p] < end[p] and progress[p] < wm[p].low:
            raise ReplayDataLossError(table, topic, p, progress[p], wm[p].low)


def check_progress(table: str, rng: ReplayRange, committed: Mapping[int, int]) -> None:
    """The target's committed offsets lie inside the replay range.

    Raises:
        ReplayError: one lies outside ``[start, end]``.
    """
    for p in rng.start:
        s = committed.get(p, rng.start[p])
        if not rng.start[p] <= s <= rng.end[p]:
            raise ReplayError(
                f"replay target {table}: committed offset {s} of partition {p} lies outside the "
                f"replay range [{rng.start[p]}, {rng.end[p]})"
            )


# -- targets --------------------------------------------------------------------------------
def replay_table_spec(spec: TableSpec, identifier: str) -> TableSpec:
    """The declaration of a new replay table: ``spec`` with another identifier and name, a
    consumer group ``lake-replay.<identifier>`` that the replay never commits, and its own
    dead-letter table ``<identifier>_dead_letter``. Same topic, schema, Kafka columns,
    partitioning and bad-record policy."""
    return dataclasses.replace(
        spec,
        name=identifier.rsplit(".", 1)[-1],
        identifier=identifier,
        consumer_group=f"lake-replay.{identifier}",
        description=f"Replay of {spec.identifier} from Kafka topic {spec.topic}.",
        bad_records=dataclasses.replace(spec.bad_records, dead_letter_identifier=f"{identifier}_dead_letter"),
    )
