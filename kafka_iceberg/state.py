"""The state contract: which Kafka offsets an Iceberg snapshot covers.

Every snapshot this project commits carries, in its snapshot summary, the complete ingest
state of the table *after* that snapshot. Reading the state therefore needs one snapshot:
the nearest ancestor of ``main`` that has the keys (maintenance snapshots such as
``rewrite_data_files`` or ``expire_snapshots`` do not carry them and are skipped).

Snapshot summary keys (all values are strings, as Iceberg requires):

=========================  ==================================================================
``kafka.topic``            source topic
``kafka.offsets``          JSON ``{"<partition>": next_offset}`` for every partition: the
                           committed offsets (Kafka semantics: the offset of the next record
                           to read). Records ``< next_offset`` are in the table.
``kafka.batch``            JSON ``{"<partition>": [start, end]}``: the half-open offset ranges
                           this snapshot added. ``{}`` for a snapshot that only records state.
``kafka.max-timestamps``   JSON ``{"<partition>": ms}``: the largest record timestamp seen per
                           partition, carried forward across snapshots (ms since epoch)
``kafka.valid-through-ms`` min over partitions of ``kafka.max-timestamps`` (ms since epoch);
                           absent while no partition has had a record
``kafka.commit-id``        the run that committed it (the Dagster run id)
``kafka.records``          records this snapshot added (records)
``kafka.read``             JSON ``{"<partition>": records}``: records this snapshot's batch read
                           from Kafka, per partition (absent on snapshots older than it)
``kafka.quarantined``      JSON ``{"<partition>": records}``: of those, records written to the
                           dead-letter table instead; ``read = added + quarantined`` per
                           partition, where added is ``kafka.records`` summed
``kafka.quarantine-kinds`` JSON ``{"<kind>": records}`` (``malformed``, ``schema``, ...)
``kafka.dead-letter``      JSON ``{"table", "snapshot-id", "branch"}``: the dead-letter snapshot
                           holding this batch's quarantined records (absent when none). It
                           is published right after this snapshot; recovery rolls it forward
                           if a crash came between the two
``kafka.schema-changes``   JSON list of ``{"column", "type"}``:
                           optional columns schema evolution added before this batch;
                           for registry formats also ``"change"`` (``evolvable``,
                           ``promotion``, or ``blocked`` with ``schema_id`` and ``reason``)
``kafka.schema-ids``       JSON ``{"<schema id>": records}``: the registry schema ids this
                           batch's values carried (Schema Registry formats only)
``kafka.accepted-gaps``    JSON list of offset ranges an operator accepted as lost, each
                           ``{"partition", "start", "end", "reason", "accepted_ms",
                           "commit_id"}``; carried forward by every later snapshot so the
                           gap stays visible (absent while there is none)
``kafka.replay-of``        JSON ``{"original", "topic", "from_snapshot", "start", "end"}`` on
                           every snapshot a replay commits (offsets per partition)
``kafka.group``            JSON ``{"name", "seq", "position", "tables"}`` on every snapshot of a
                           consistency group's commit: ``seq`` counts the group's commits,
                           ``position`` is the source position it reached (the transaction
                           topic's next offsets, the last transaction id), ``tables`` maps
                           each member to ``{"topic", "offsets"}`` as of this commit
=========================  ==================================================================

A dead-letter table's snapshots carry ``kafka.commit-id`` and ``kafka.dead-letter-of`` (the
identifier of the table whose records they quarantine).

This module is the whole contract: every key is a named constant below, :func:`ingest_summary`
and :func:`dead_letter_summary` write summaries, and :func:`state_at`, :func:`batch_ranges`,
:func:`int_map`, :func:`dead_letter_ref`, :func:`recorded_replay`, :func:`group_state`, :func:`group_position` and :func:`member_snapshot` read them;
:func:`group_summary` writes a consistency group's entry. Other modules
and docs refer here instead of spelling keys out.

The functions here are pure: they take :class:`SnapshotInfo` values, which the catalog
layer builds from pyiceberg snapshots.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

KEY_TOPIC = "kafka.topic"
KEY_OFFSETS = "kafka.offsets"
KEY_BATCH = "kafka.batch"
KEY_MAX_TIMESTAMPS = "kafka.max-timestamps"
KEY_VALID_THROUGH = "kafka.valid-through-ms"
KEY_COMMIT_ID = "kafka.commit-id"
KEY_RECORDS = "kafka.records"
KEY_GAPS = "kafka.accepted-gaps"
KEY_READ = "kafka.read"
KEY_QUARANTINED = "kafka.quarantined"
KEY_QUARANTINE_KINDS = "kafka.quarantine-kinds"
KEY_DEAD_LETTER = "kafka.dead-letter"
KEY_SCHEMA_CHANGES = "kafka.schema-changes"
KEY_SCHEMA_IDS = "kafka.schema-ids"
KEY_REPLAY_OF = "kafka.replay-of"
KEY_DEAD_LETTER_OF = "kafka.dead-letter-of"
KEY_GROUP = "kafka.group"


@dataclass(frozen=True)
class SnapshotInfo:
    """The parts of an Iceberg snapshot the state contract reads."""

    snapshot_id: int
    parent_id: int | None
    timestamp_ms: int  # commit time, ms since epoch
    summary: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_ingest(self) -> bool:
        """True when this snapshot was committed by the ingest write path (it carries offsets)."""
        return KEY_OFFSETS in self.summary


@dataclass(frozen=True)
class IngestState:
    """Ingest state of a table as of one snapshot.

    ``offsets``: partition -> next offset to read. ``max_timestamps``: partition -> ms.
    ``snapshot_id`` is the snapshot the state was read from (``None`` for a table that has
    never committed an ingest snapshot).
    """

    topic: str | None
    offsets: dict[int, int]
    max_timestamps: dict[int, int]
    snapshot_id: int | None
    snapshot_timestamp_ms: int | None = None
    valid_through_ms: int | None = None
    accepted_gaps: tuple = ()

    @classmethod
    def empty(cls) -> IngestState:
        """State of a table that has ingested nothing."""
        return cls(None, {}, {}, None)


def _int_map(raw: str | None) -> dict[int, int]:
    return {int(k): int(v) for k, v in json.loads(raw).items()} if raw else {}


def encode_int_map(values: Mapping[int, int]) -> str:
    """JSON-encode a partition -> int map with sorted string keys (stable across runs)."""
    return json.dumps({str(k): int(v) for k, v in sorted(values.items())}, separators=(",", ":"))


def batch_ranges(snapshot: SnapshotInfo) -> dict[int, tuple[int, int]]:
    """The half-open offset ranges ``{partition: (start, end)}`` a snapshot added."""
    raw = snapshot.summary.get(KEY_BATCH)
    return {int(k): (int(v[0]), int(v[1])) for k, v in json.loads(raw).items()} if raw else {}


def ancestors(snapshots: Mapping[int, SnapshotInfo], head: int | None) -> list[SnapshotInfo]:
    """``head`` and its ancestors, newest first. Stops at an expired (missing) parent."""
    out: list[SnapshotInfo] = []
    seen: set[int] = set()
    current = head
    while current is not None and current in snapshots and current not in seen:
        seen.add(current)
        snap = snapshots[current]
        out.append(snap)
        current = snap.parent_id
    return out


def state_at(snapshots: Mapping[int, SnapshotInfo], head: int | None) -> IngestState:
    """Ingest state as of snapshot ``head``: read from its nearest ancestor that carries offsets."""
    for snap in ancestors(snapshots, head):
        if snap.is_ingest:
            vt = snap.summary.get(KEY_VALID_THROUGH)
            return IngestState(
                topic=snap.summary.get(KEY_TOPIC),
                offsets=_int_map(snap.summary.get(KEY_OFFSETS)),
                max_timestamps=_int_map(snap.summary.get(KEY_MAX_TIMESTAMPS)),
                snapshot_id=snap.snapshot_id,
                snapshot_timestamp_ms=snap.timestamp_ms,
                valid_through_ms=int(vt) if vt else None,
                accepted_gaps=tuple(json.loads(snap.summary.get(KEY_GAPS) or "[]")),
            )
    return IngestState.empty()


def valid_through(max_timestamps: Mapping[int, int]) -> int | None:
    """Min over partitions of each partition's max record timestamp (ms), or None if none yet."""
    return min(max_timestamps.values()) if max_timestamps else None


def ingest_summary(
    *,
    topic: str,
    offsets: Mapping[int, int],
    batch: Mapping[int, tuple[int, int]],
    max_timestamps: Mapping[int, int],
    commit_id: str,
    records: int,
    accepted_gaps: tuple | list = (),
    read: Mapping[int, int] | None = None,
    quarantined: Mapping[int, int] | None = None,
    quarantine_kinds: Mapping[str, int] | None = None,
    schema_changes: list | None = None,
    schema_ids: Mapping[int, int] | None = None,
) -> dict[str, str]:
    """The snapshot summary properties for one ingest commit (see the module docstring).

    ``read`` and ``quarantined`` are records per partition; ``kafka.dead-letter`` is added by the
    write path once the dead-letter snapshot exists."""
    props = {
        KEY_TOPIC: topic,
        KEY_OFFSETS: encode_int_map(offsets),
        KEY_BATCH: json.dumps({str(p): [s, e] for p, (s, e) in sorted(batch.items())}, separators=(",", ":")),
        KEY_MAX_TIMESTAMPS: encode_int_map(max_timestamps),
        KEY_COMMIT_ID: commit_id,
        KEY_RECORDS: str(int(records)),
    }
    vt = valid_through(max_timestamps)
    if vt is not None:
        props[KEY_VALID_THROUGH] = str(vt)
    if accepted_gaps:
        props[KEY_GAPS] = json.dumps(list(accepted_gaps), separators=(",", ":"))
    if read is not None:
        props[KEY_READ] = encode_int_map(read)
        props[KEY_QUARANTINED] = encode_int_map(quarantined or {})
    if quarantine_kinds:
        props[KEY_QUARANTINE_KINDS] = json.dumps(dict(sorted(quarantine_kinds.items())), separators=(",", ":"))
    if schema_changes:
        props[KEY_SCHEMA_CHANGES] = json.dumps(list(schema_changes), separators=(",", ":"))
    if schema_ids:
        props[KEY_SCHEMA_IDS] = encode_int_map(schema_ids)
    return props


def int_map(snapshot: SnapshotInfo, key: str) -> dict[int, int]:
    """A partition -> int map stored under ``key`` in the snapshot summary ({} when absent)."""
    return _int_map(snapshot.summary.get(key))


def dead_letter_ref(snapshot: SnapshotInfo) -> dict | None:
    """The ``kafka.dead-letter`` pointer of a snapshot: ``{"table", "snapshot-id", "branch"}`` or None."""
    raw = snapshot.summary.get(KEY_DEAD_LETTER)
    return json.loads(raw) if raw else None


def dead_letter_pointer(table: str, snapshot_id: int, branch: str) -> str:
    """The ``kafka.dead-letter`` value: which dead-letter snapshot (on which branch) holds a batch's
    quarantined records."""
    return _compact({"table": table, "snapshot-id": snapshot_id, "branch": branch})


def dead_letter_summary(commit_id: str, of_table: str) -> dict[str, str]:
    """The snapshot summary of a dead-letter table's snapshot: the run and the table it quarantines for."""
    return {KEY_COMMIT_ID: commit_id, KEY_DEAD_LETTER_OF: of_table}


def replay_summary(replay_of: Mapping) -> dict[str, str]:
    """The ``kafka.replay-of`` summary entry of a replay snapshot (``replay_of`` is JSON-ready)."""
    return {KEY_REPLAY_OF: _compact(dict(replay_of))}


def recorded_replay(snapshots: Mapping[int, SnapshotInfo], head: int | None) -> dict | None:
    """The ``kafka.replay-of`` record of the newest snapshot in ``head``'s ancestry that has one, or None."""
    for snap in ancestors(snapshots, head):
        raw = snap.summary.get(KEY_REPLAY_OF)
        if raw:
            return json.loads(raw)
    return None


def group_summary(name: str, seq: int, position: Mapping, tables: Mapping[str, tuple[str, Mapping[int, int]]]) -> dict:
    """The ``kafka.group`` summary entry of one consistency-group commit: group ``name``, its commit
    number ``seq`` (1 for the first), the source ``position`` (JSON-ready) and ``tables``: identifier ->
    (topic, committed offsets per partition) of every member as of this commit."""
    members = {
        ident: {"topic": topic, "offsets": {str(p): int(o) for p, o in sorted(offsets.items())}}
        for ident, (topic, offsets) in sorted(tables.items())
    }
    return {KEY_GROUP: _compact({"name": name, "seq": int(seq), "position": dict(position), "tables": members})}


def group_record(snapshot: SnapshotInfo) -> dict | None:
    """A snapshot's ``kafka.group`` record ``{"name", "seq", "position", "tables"}``, or None."""
    raw = snapshot.summary.get(KEY_GROUP)
    return json.loads(raw) if raw else None


def group_state(snapshots: Mapping[int, SnapshotInfo], head: int | None) -> dict | None:
    """The ``kafka.group`` record of the newest snapshot in ``head``'s ancestry that has one, or None
    (the table never committed in a group)."""
    for snap in ancestors(snapshots, head):
        record = group_record(snap)
        if record is not None:
            return record
    return None


def group_position(
    views: Mapping[str, tuple[Mapping[int, SnapshotInfo], int | None]], fallback: bool = True
) -> dict[str, int] | None:
    """One consistent position of a consistency group: identifier -> snapshot id of every member, at the
    newest group commit every member has reached. ``views``: identifier -> (its snapshots by id, ``main``'s
    head).

    A ``kafka.group`` record lists every member's offsets as of its commit (``seq``); a member is read at
    the newest snapshot of ``main``'s ancestry whose ingest state has exactly those offsets
    (:func:`member_snapshot`; a later compaction counts). The newest record any member shows is tried
    first; a member without such a snapshot was loaded before that commit landed (load it again) or, on
    a catalog that commits members one by one, is not published yet: then, with ``fallback``, the next
    older record is tried (a half-published group commit is never read). None when no record is reached
    by every member (without ``fallback``: the newest) or no member was ever committed in a group.
    """
    records: dict[int, dict] = {}
    for snaps, head in views.values():
        for snap in ancestors(snaps, head):
            record = group_record(snap)
            if record is not None:
                records.setdefault(int(record["seq"]), record)
                if not fallback:
                    break
    for seq in sorted(records, reverse=True)[: None if fallback else 1]:
        out = {}
        for ident, (snaps, head) in views.items():
            found = member_snapshot(snaps, head, group_offsets(records[seq], ident))
            if found is None:
                break
            out[ident] = found
        else:
            return out
    return None


def group_offsets(record: Mapping, identifier: str) -> dict[int, int]:
    """The committed offsets (partition -> next offset) of member ``identifier`` in a ``kafka.group`` record."""
    entry = record["tables"].get(identifier) or {}
    return {int(p): int(o) for p, o in entry.get("offsets", {}).items()}


def member_snapshot(snapshots: Mapping[int, SnapshotInfo], head: int | None, offsets: Mapping[int, int]) -> int | None:
    """The newest snapshot of ``head``'s ancestry whose ingest state has exactly ``offsets``, or None."""
    for snap in ancestors(snapshots, head):
        if state_at(snapshots, snap.snapshot_id).offsets == dict(offsets):
            return snap.snapshot_id
    return None


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True)
class Overlap:
    """Two snapshots whose batch ranges overlap on one partition."""

    partition: int
    first: tuple[int, tuple[int, int]]  # (snapshot id, (start, end))
    second: tuple[int, tuple[int, int]]


def overlapping_batches(snapshots: Iterable[SnapshotInfo]) -> list[Overlap]:
    """Every pair of ingest snapshots whose offset ranges overlap on the same partition.

    Pass the ancestry of ``main``; an exactly-once table has none.
    """
    by_partition: dict[int, list[tuple[int, int, int]]] = {}
    for snap in snapshots:
        for p, (start, end) in batch_ranges(snap).items():
            if end > start:
                by_partition.setdefault(p, []).append((start, end, snap.snapshot_id))
    out = []
    for p, ranges in sorted(by_partition.items()):
        ranges.sort()
        reach = ranges[0]  # the range seen so far that reaches furthest
        for s2, e2, id2 in ranges[1:]:
            s1, e1, id1 = reach
            if s2 < e1:
                out.append(Overlap(p, (id1, (s1, e1)), (id2, (s2, e2))))
            if e2 > e1:
                reach = (s2, e2, id2)
    return out
