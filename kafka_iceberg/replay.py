"""Replay a table's Kafka offset range into a new table or an Iceberg branch, and validate it.

Plain Python (no Dagster); the CLI (``python -m kafka_iceberg.cli replay``) and the Dagster
job ``replay`` (``lake_assets/replay.py``) both call :func:`run_replay`.

A replay reads, per partition, the half-open offset range ``[start, end)`` of the original
table's topic again and writes it, in bounded micro-batches, to one of two targets:

* **a new table** (``into``): same schema and partitioning as the original, its own
  identifier, a consumer group that is never committed. Each micro-batch goes through
  :meth:`kafka_iceberg.pipeline.TableWriter.execute` with an explicit :class:`BatchPlan`,
  so the replay is exactly-once and crash-recoverable like ingestion: the target's
  committed offsets live in its own snapshot summaries, and a rerun of the same replay
  continues from them.
* **a branch of the original** (``branch``): the branch ``replay_<name>`` is created at an
  existing snapshot S of ``main``'s ancestry (``from_snapshot``); S's committed offsets are the
  start, and the range is appended on the branch, so the branch is the table rebuilt from S.
  Each micro-batch uses the write path's attempt protocol (an ``ingest_<ms>_<commit id>``
  attempt branch, then ``fast_forward`` of the replay branch), so ingestion's recovery treats
  a crashed replay attempt like any other dead attempt, and never touches ``replay_*`` branches.

Every replay snapshot carries ``kafka.replay-of`` (:data:`KEY_REPLAY_OF`) in its summary:
JSON ``{"original", "topic", "from_snapshot", "start", "end"}`` (offsets per partition). A
target that holds another replay, or data that is not a replay, is refused; a target that
holds the same replay is resumed.

:func:`validate_replay` compares the original with the replay over the same
``(partition, offset)`` range with Spark (counts per partition, ``EXCEPT ALL`` both ways).

Units: offsets are Kafka offsets (the half-open ``[start, end)`` convention of
``kafka.batch``), record counts are records, timestamps are ms since epoch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable, Collection, Mapping, Sequence

from pyspark.sql import functions as F

from kafka_iceberg.catalog import load_table, metadata_view
from kafka_iceberg.errors import DataLossError, LakeError
from kafka_iceberg.kafka_client import KafkaMetadata
from kafka_iceberg.pipeline import TableWriter
from kafka_iceberg.planning import BatchPlan, Watermarks
from kafka_iceberg.recovery import Attempt
from kafka_iceberg.settings import Settings
from kafka_iceberg.spec import IDENTIFIER, TableSpec
from kafka_iceberg.state import SnapshotInfo, ancestors, state_at

log = logging.getLogger(__name__)

KEY_REPLAY_OF = "kafka.replay-of"
"""Snapshot summary key of every replay snapshot: JSON ``{"original": "<ns>.<table>", "topic",
"from_snapshot": <id or null>, "start": {"<partition>": offset}, "end": {"<partition>": offset}}``."""

REPLAY_BRANCH_PREFIX = "replay_"
"""Prefix of replay branches. Recovery only ever drops ``ingest_<ms>_<token>`` attempt branches."""

_BRANCH_NAME = re.compile(r"^[A-Za-z0-9_]+$")
_PAIR = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")


# -- errors ---------------------------------------------------------------------------------
class ReplayError(LakeError):
    """A replay request is invalid (malformed offsets or time, a range outside the log or
    outside the original, an unknown snapshot) or its target conflicts (it holds another
    replay, or data that is not a replay). Raised before anything is written to the target."""


class ReplayDataLossError(DataLossError):
    """The replay range starts below a partition's log start offset: those records were
    deleted from Kafka (retention or ``delete_records``) and cannot be read again.

    Attributes as :class:`DataLossError`: ``committed`` is the first offset the replay needs,
    ``log_start`` the partition's log start offset.
    """

    def __init__(self, table: str, topic: str, partition: int, start: int, log_start: int):
        super().__init__(table, topic, partition, start, log_start)
        self.args = (
            f"cannot replay table {table}: topic {topic} partition {partition} starts at log start offset "
            f"{log_start}, so the {log_start - start} records at offsets [{start}, {log_start}) are gone "
            "(retention.ms or delete_records deleted them) and cannot be read again; start the replay at or "
            f"after offset {log_start}",
        )


class ReplayMismatchError(LakeError):
    """Validation found rows that differ between the original and the replay; ``report`` is the
    :class:`ValidationReport`."""

    def __init__(self, report: "ValidationReport"):
        self.report = report
        super().__init__(report.summary())


# -- parsing --------------------------------------------------------------------------------
def parse_offsets(text: str) -> dict[int, int]:
    """Parse ``"0:100,1:250"`` (comma-separated ``partition:offset`` pairs) into ``{0: 100, 1: 250}``.

    Raises:
        ReplayError: not such pairs, a negative number, or a partition given twice.
    """
    out: dict[int, int] = {}
    for part in str(text).split(","):
        if not part.strip():
            continue
        m = _PAIR.match(part)
        if not m:
            raise ReplayError(f"offsets {text!r}: expected partition:offset pairs like 0:100,1:250")
        p, o = int(m.group(1)), int(m.group(2))
        if p in out:
            raise ReplayError(f"offsets {text!r}: partition {p} is given twice")
        out[p] = o
    if not out:
        raise ReplayError(f"offsets {text!r}: expected partition:offset pairs like 0:100,1:250")
    return out


def parse_time_ms(text: str | int) -> int:
    """A point in time as ms since epoch, from digits (already ms since epoch) or ISO-8601
    (``2013-01-01T05:00:00Z``, ``2013-01-01 05:00:00+01:00``; no zone means UTC).

    Raises:
        ReplayError: neither form.
    """
    s = str(text).strip()
    if re.fullmatch(r"\d+", s):
        return int(s)
    try:
        ts = datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ReplayError(f"time {text!r}: expected ms since epoch or ISO-8601 like 2013-01-01T05:00:00Z") from None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=timezone.utc)
    return (ts - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(milliseconds=1)


def replay_branch_name(name: str) -> str:
    """The branch a replay writes: ``name`` prefixed with ``replay_`` unless it already is.

    Raises:
        ReplayError: ``name`` is empty or has characters other than letters, digits and ``_``.
    """
    if not name or not _BRANCH_NAME.match(name):
        raise ReplayError(f"branch name {name!r}: use letters, digits and _ only")
    return name if name.startswith(REPLAY_BRANCH_PREFIX) else REPLAY_BRANCH_PREFIX + name


# -- the request ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplayRequest:
    """What to replay and where to.

    Start, exactly one of:
        ``start_offsets`` ``{partition: offset}`` (only these partitions are replayed);
        ``start_earliest`` (every partition's log start offset);
        ``start_ms`` (ms since epoch: per partition, the first offset whose record timestamp is
        >= it; every partition);
        ``from_snapshot`` (an Iceberg snapshot id of the original's ``main`` ancestry: its
        committed offsets ``kafka.offsets``; required for, and only meaningful with, ``branch``
        or a new table that continues from that point).
    End, at most one of:
        ``end_offsets`` ``{partition: offset}``, exclusive (partitions not named default as below);
        ``end_ms`` (ms since epoch, exclusive: the first offset whose timestamp is >= it);
        default: the original's committed offsets, so the replay covers what the original
        holds (when resuming, the end the target recorded).
    Target, at most one of:
        ``into`` ``"<namespace>.<table>"`` (a new table); ``branch`` (a branch of the original,
        named ``replay_<branch>``; needs ``from_snapshot``); neither: a new table named
        ``<namespace>.<table>_replay_<8 hex digits of this request>``.
    ``validate``: compare the replay with the original afterwards (then the end must not
    exceed the original's committed offsets). ``max_records_per_partition``: offsets per
    partition per micro-batch (default: the table's). ``max_batches``: stop after this many
    micro-batches (None: until the range is done); a later run resumes.

    Raises:
        ReplayError: from ``__post_init__`` for a contradictory request.
    """

    start_offsets: Mapping[int, int] | None = None
    start_earliest: bool = False
    start_ms: int | None = None
    from_snapshot: int | None = None
    end_offsets: Mapping[int, int] | None = None
    end_ms: int | None = None
    into: str | None = None
    branch: str | None = None
    validate: bool = False
    max_records_per_partition: int | None = None
    max_batches: int | None = None

    def __post_init__(self):
        starts = [self.start_offsets is not None, self.start_earliest, self.start_ms is not None,
                  self.from_snapshot is not None]
        if sum(starts) != 1:
            raise ReplayError("give exactly one start: offsets (--from P:O,...), earliest, a time (--from-time) "
                              "or a snapshot (--from-snapshot)")
        if self.end_offsets is not None and self.end_ms is not None:
            raise ReplayError("give at most one end: offsets (--to) or a time (--to-time)")
        if self.into and self.branch:
            raise ReplayError("give one target: a new table (--into) or a branch (--branch), not both")
        if self.branch is not None:
            replay_branch_name(self.branch)
            if self.from_snapshot is None:
                raise ReplayError("a branch rebuild starts at a snapshot of main: give --from-snapshot ID")
        if self.into is not None:
            parts = self.into.split(".")
            if len(parts) < 2 or not all(IDENTIFIER.match(p) for p in parts):
                raise ReplayError(f"target table {self.into!r} must be namespace.table in lower_snake_case")
        for name in ("max_records_per_partition", "max_batches"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ReplayError(f"{name} must be positive, got {value}")

    @classmethod
    def from_strings(
        cls,
        *,
        from_offsets: str | None = None,
        from_time: str | None = None,
        from_snapshot: str | int | None = None,
        to_offsets: str | None = None,
        to_time: str | None = None,
        into: str | None = None,
        branch: str | None = None,
        validate: bool = False,
        max_records_per_partition: int | None = None,
        max_batches: int | None = None,
    ) -> "ReplayRequest":
        """Build a request from the CLI's and the Dagster config's strings.

        ``from_offsets``: ``"0:100,1:250"`` or ``"earliest"``; ``from_time``/``to_time``: ISO-8601
        or ms since epoch; ``from_snapshot``: a snapshot id; ``to_offsets``: ``"0:500,1:900"``.
        Empty strings count as not given.

        Raises:
            ReplayError: a malformed value or a contradictory combination.
        """
        def given(v):
            return v is not None and str(v).strip() != ""

        snapshot = None
        if given(from_snapshot):
            try:
                snapshot = int(str(from_snapshot).strip())
            except ValueError:
                raise ReplayError(f"snapshot id {from_snapshot!r} is not a whole number") from None
        earliest = given(from_offsets) and str(from_offsets).strip().lower() == "earliest"
        return cls(
            start_offsets=parse_offsets(from_offsets) if given(from_offsets) and not earliest else None,
            start_earliest=earliest,
            start_ms=parse_time_ms(from_time) if given(from_time) else None,
            from_snapshot=snapshot,
            end_offsets=parse_offsets(to_offsets) if given(to_offsets) else None,
            end_ms=parse_time_ms(to_time) if given(to_time) else None,
            into=into.strip() if given(into) else None,
            branch=branch.strip() if given(branch) else None,
            validate=validate,
            max_records_per_partition=max_records_per_partition,
            max_batches=max_batches,
        )

    def digest(self) -> str:
        """8 hex digits identifying the requested range (not the target), for default target names."""
        doc = {
            "start_offsets": {str(k): v for k, v in sorted((self.start_offsets or {}).items())},
            "start_earliest": self.start_earliest, "start_ms": self.start_ms, "from_snapshot": self.from_snapshot,
            "end_offsets": {str(k): v for k, v in sorted((self.end_offsets or {}).items())}, "end_ms": self.end_ms,
        }
        return hashlib.sha1(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:8]


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
    """The replay's identity as recorded in :data:`KEY_REPLAY_OF` (JSON-ready, string partition keys)."""
    return {
        "original": original,
        "topic": rng.topic,
        "from_snapshot": from_snapshot,
        "start": {str(p): o for p, o in sorted(rng.start.items())},
        "end": {str(p): o for p, o in sorted(rng.end.items())},
    }


def recorded_replay(snapshots: Mapping[int, SnapshotInfo], head: int | None) -> dict | None:
    """The :data:`KEY_REPLAY_OF` record of the newest snapshot in ``head``'s ancestry that has
    one, or None."""
    for snap in ancestors(snapshots, head):
        raw = snap.summary.get(KEY_REPLAY_OF)
        if raw:
            return json.loads(raw)
    return None


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
        recorded: the target's :data:`KEY_REPLAY_OF` record when resuming; a start of
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
    topic = spec.topic
    partitions = kafka.partitions(topic)
    wm = kafka.watermarks(topic, partitions)
    original_offsets = state_at(original_snapshots, original_main).offsets
    where = f"replay of table {spec.identifier}"

    if request.start_offsets is not None:
        unknown = sorted(set(request.start_offsets) - set(partitions))
        if unknown:
            raise ReplayError(f"{where}: topic {topic} has no partitions {unknown} (it has {partitions})")
        start = dict(request.start_offsets)
    elif request.start_earliest:
        start = _int_keys(recorded["start"]) if recorded else {p: w.low for p, w in wm.items()}
    elif request.start_ms is not None:
        start = kafka.offsets_for_timestamp(topic, partitions, request.start_ms)
    else:
        chain = {s.snapshot_id for s in ancestors(original_snapshots, original_main)}
        if request.from_snapshot not in chain:
            raise ReplayError(
                f"{where}: snapshot {request.from_snapshot} is not in main's ancestry (expired, or on another "
                "branch); pick one from the table's history (SELECT * FROM <table>.history)"
            )
        state = state_at(original_snapshots, request.from_snapshot)
        if not state.offsets:
            raise ReplayError(f"{where}: snapshot {request.from_snapshot} has no committed offsets (kafka.offsets) "
                              "in its ancestry; nothing was ingested before it")
        # a partition added to the topic after the snapshot starts where ingestion starts it: the log start
        start = {p: state.offsets.get(p, wm[p].low) for p in partitions}

    end_defaulted: set[int] = set()
    if request.end_offsets is not None:
        unknown = sorted(set(request.end_offsets) - set(start))
        if unknown:
            raise ReplayError(f"{where}: end offsets name partitions {unknown} that the start does not "
                              f"(start partitions: {sorted(start)})")
    if request.end_ms is not None:
        end = kafka.offsets_for_timestamp(topic, sorted(start), request.end_ms)
    else:
        end = dict(request.end_offsets or {})
        if recorded and request.end_offsets is None:
            end = {p: o for p, o in _int_keys(recorded["end"]).items() if p in start}
        for p in start:
            if p not in end:
                end_defaulted.add(p)
                if not original_offsets:
                    raise ReplayError(f"{where}: the original has no committed offsets, so there is no default end; "
                                      "give one (--to or --to-time)")
                # the original holds nothing of a partition it has no offset for
                end[p] = original_offsets.get(p, start[p])

    for p in sorted(start):
        s, e, w = start[p], end[p], wm[p]
        if s > e:
            why = " (the original's committed offset: it holds nothing from the start on)" if p in end_defaulted else ""
            raise ReplayError(f"{where}: partition {p} starts at offset {s}, after its end {e}{why}")
        if e > w.high:
            raise ReplayError(f"{where}: partition {p} ends at offset {e}, beyond its high watermark {w.high}")
        if request.validate:
            held = original_offsets.get(p)
            if e > s and (held is None or e > held):
                raise ReplayError(
                    f"{where}: partition {p} ends at offset {e} but the original holds offsets only below "
                    f"{held if held is not None else 'none'}; validation compares the same offsets, so end the "
                    "replay there, or replay without validation"
                )
    return ReplayRange(topic, {p: start[p] for p in sorted(start)}, {p: end[p] for p in sorted(start)})


def _check_readable(table: str, topic: str, progress: Mapping[int, int], end: Mapping[int, int],
                    wm: Mapping[int, Watermarks]) -> None:
    for p in sorted(progress):
        if progress[p] < end[p] and progress[p] < wm[p].low:
            raise ReplayDataLossError(table, topic, p, progress[p], wm[p].low)


def _next_plan(table: str, rng: ReplayRange, committed: Mapping[int, int], base_snapshot_id: int | None,
               wm: Mapping[int, Watermarks], bound: int, has_state: bool) -> BatchPlan:
    """The next micro-batch of a replay: per partition ``[progress, min(end, progress + bound))``."""
    start = {p: committed.get(p, rng.start[p]) for p in rng.start}
    for p, s in start.items():
        if not rng.start[p] <= s <= rng.end[p]:
            raise ReplayError(f"replay target {table}: committed offset {s} of partition {p} lies outside the "
                              f"replay range [{rng.start[p]}, {rng.end[p]})")
    _check_readable(table, rng.topic, start, rng.end, wm)
    end = {p: min(rng.end[p], s + bound) for p, s in start.items()}
    return BatchPlan(table=table, topic=rng.topic, base_snapshot_id=base_snapshot_id, start_offsets=start,
                     end_offsets=end, watermarks=dict(wm), has_state=has_state)


# -- targets --------------------------------------------------------------------------------
def replay_table_spec(spec: TableSpec, identifier: str) -> TableSpec:
    """The declaration of a new replay table: ``spec`` with another identifier and name, a
    consumer group ``lake-replay.<identifier>`` that the replay never commits, and its own
    dead-letter table ``<identifier>_dead_letter``. Same topic, schema, Kafka columns,
    partitioning and bad-record policy."""
    return dataclasses.replace(spec, name=identifier.rsplit(".", 1)[-1], identifier=identifier,
                               consumer_group=f"lake-replay.{identifier}",
                               description=f"Replay of {spec.identifier} from Kafka topic {spec.topic}.",
                               bad_records=dataclasses.replace(spec.bad_records,
                                                               dead_letter_identifier=f"{identifier}_dead_letter"))


class _NoGroupCommits:
    """A :class:`KafkaMetadata` that never reads or commits consumer groups: a replay table
    mirrors no group, so lag tools never see it. Everything else is delegated."""

    def __init__(self, inner: KafkaMetadata):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def group_offsets(self, group: str, topic: str) -> dict[int, int]:
        return {}

    def commit_group_offsets(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        return None


def _commit_on_branch(spark, settings: Settings, spec: TableSpec, kafka: KafkaMetadata, catalog, *, ref: str,
                      plan: BatchPlan, commit_id: str, extra_summary: Mapping[str, str]) -> tuple[int, int, int]:
    """Write one replay micro-batch of the original table to branch ``ref``, exactly once.

    The write path itself (:meth:`TableWriter.execute`) aimed at ``ref`` instead of ``main``: an
    attempt branch ``ingest_<ms>_<commit id>`` at the planned ``ref`` head, the good records and a
    snapshot carrying the branch's full ingest state, then ``fast_forward`` of ``ref`` (refused
    unless ``ref`` is still an ancestor). A crashed attempt is a dead ``ingest_`` branch that the
    table's next micro-batch recovers. Bad records fail the batch under ``bad_records.policy:
    fail``; under ``quarantine`` they are left out and counted in the summary (``kafka.read``,
    ``kafka.quarantined``), but not written to the dead-letter table, which already holds what the
    original ingestion quarantined over the same offsets.

    Returns:
        (rows written, records left out as bad, the new head snapshot id of ``ref``).

    Raises:
        CommitConflictError: ``ref`` moved since the plan (another run replays into it).
        MalformedRecordError, DataLossError, ReadTimeoutError, CatalogUnavailableError, LakeError:
        as :meth:`TableWriter.execute`.
    """
    writer = TableWriter(spark, settings, spec, kafka, catalog, ref=ref, dead_letters=False)
    result = writer.execute(plan, commit_id, extra_summary=dict(extra_summary))
    return result.records, result.quarantined, result.snapshot_id


# -- validation -----------------------------------------------------------------------------
@dataclass(frozen=True)
class TableVersion:
    """One version of an Iceberg table to compare: ``identifier`` (``<ns>.<table>``) at snapshot
    ``snapshot_id`` (None: the table has no snapshot, i.e. is empty). ``label`` names the ref in
    reports (``main`` or the branch)."""

    identifier: str
    snapshot_id: int | None
    label: str = "main"

    def describe(self) -> str:
        """``<identifier>@<label>:<snapshot id>``."""
        return f"{self.identifier}@{self.label}:{self.snapshot_id}"


@dataclass
class PartitionComparison:
    """Validation figures of one partition, in records, over offsets ``[start, end)``.

    ``missing``: offsets the original holds that the replay does not hold at all; ``extra``:
    offsets the replay holds that the original does not; ``differing``: offsets both hold
    whose rows are not identical (a value, a Kafka column, or the number of copies differs).
    """

    partition: int
    start: int
    end: int
    original_records: int = 0
    replay_records: int = 0
    missing: int = 0
    extra: int = 0
    differing: int = 0


@dataclass
class ValidationReport:
    """The comparison of an original and a replay over the same ``(partition, offset)`` range.

    ``columns``: the columns compared (value columns and kept Kafka columns both tables have).
    ``columns_only_in_original`` / ``columns_only_in_replay``: columns one side lacks (schema
    evolution saw a field on one side only); ``rows_with_uncompared_values``: rows in the range
    with a non-null value in such a column, which the other side therefore lacks.
    ``mismatched_rows``: rows of either side without an identical row on the other
    (``EXCEPT ALL`` both ways). ``outside_range``: rows of the replay target outside the
    replayed range (checked for a new table only; it must hold nothing else).
    ``excluded``: offset ranges left out of the comparison (the original's accepted gaps).
    ``examples``: up to ``sample`` mismatches ``{"partition", "offset", "kind"}``.
    """

    original: str
    replay: str
    columns: list[str]
    partitions: list[PartitionComparison]
    mismatched_rows: int = 0
    outside_range: int = 0
    columns_only_in_original: list[str] = field(default_factory=list)
    columns_only_in_replay: list[str] = field(default_factory=list)
    rows_with_uncompared_values: int = 0
    excluded: list[dict] = field(default_factory=list)
    examples: list[dict] = field(default_factory=list)

    @property
    def records_compared(self) -> int:
        """Records of the original inside the range."""
        return sum(p.original_records for p in self.partitions)

    @property
    def replay_records(self) -> int:
        """Records of the replay inside the range."""
        return sum(p.replay_records for p in self.partitions)

    @property
    def missing(self) -> int:
        """Offsets the original holds and the replay lacks (records)."""
        return sum(p.missing for p in self.partitions)

    @property
    def extra(self) -> int:
        """Offsets the replay holds and the original lacks (records)."""
        return sum(p.extra for p in self.partitions)

    @property
    def differing(self) -> int:
        """Offsets both hold with different rows."""
        return sum(p.differing for p in self.partitions)

    @property
    def valid(self) -> bool:
        """True when both sides hold the same multiset of rows over the range and the target holds
        nothing outside it."""
        return (self.mismatched_rows == 0 and self.outside_range == 0 and self.rows_with_uncompared_values == 0
                and self.missing == self.extra == self.differing == 0)

    def summary(self) -> str:
        """One line for logs and run failures."""
        verdict = "MATCH" if self.valid else "MISMATCH"
        text = (f"{verdict}: {self.replay} vs {self.original}: {self.records_compared} original records compared, "
                f"{self.replay_records} replayed; missing {self.missing}, extra {self.extra}, differing {self.differing}")
        if self.outside_range:
            text += f", {self.outside_range} replay rows outside the range"
        if self.rows_with_uncompared_values:
            text += (f", {self.rows_with_uncompared_values} rows with values in columns only one side has "
                     f"({self.columns_only_in_original + self.columns_only_in_replay})")
        return text

    def to_dict(self) -> dict:
        """JSON-ready form (CLI output, Dagster metadata)."""
        return {
            "valid": self.valid,
            "original": self.original,
            "replay": self.replay,
            "records_compared": self.records_compared,
            "replay_records": self.replay_records,
            "missing": self.missing,
            "extra": self.extra,
            "differing": self.differing,
            "mismatched_rows": self.mismatched_rows,
            "outside_range": self.outside_range,
            "columns": self.columns,
            "columns_only_in_original": self.columns_only_in_original,
            "columns_only_in_replay": self.columns_only_in_replay,
            "rows_with_uncompared_values": self.rows_with_uncompared_values,
            "excluded": self.excluded,
            "partitions": [dataclasses.asdict(p) for p in self.partitions],
            "examples": self.examples,
        }


def _range_predicate(p: str, o: str, ranges: Mapping[int, tuple[int, int]]) -> str:
    parts = [f"(`{p}` = {int(part)} AND `{o}` >= {int(s)} AND `{o}` < {int(e)})" for part, (s, e) in sorted(ranges.items())
             if e > s]
    return "(" + " OR ".join(parts) + ")" if parts else "FALSE"


def _read_version(spark, catalog_name: str, version: TableVersion):
    table = f"{catalog_name}.{version.identifier}"
    if version.snapshot_id is None:
        return spark.table(table).limit(0)
    return spark.read.option("snapshot-id", str(version.snapshot_id)).table(table)


def validate_replay(
    spark,
    settings: Settings,
    spec: TableSpec,
    *,
    original: TableVersion,
    replay: TableVersion,
    ranges: Mapping[int, tuple[int, int]],
    excluded: Sequence[Mapping] = (),
    check_outside_range: bool = False,
    sample: int = 10,
    raise_on_mismatch: bool = False,
) -> ValidationReport:
    """Compare ``original`` and ``replay`` over the same ``(partition, offset)`` range, with Spark.

    Both sides are restricted to ``ranges`` (``{partition: (start, end)}``, half-open offsets)
    minus ``excluded`` (``[{"partition", "start", "end"}]``, e.g. the original's accepted gaps,
    which no replay can read). Over the columns both tables have (value columns plus
    ``_kafka_partition``, ``_kafka_offset`` and whichever of key, timestamp, topic, headers the
    table keeps), it counts records per partition on each side and computes
    ``original EXCEPT ALL replay`` and ``replay EXCEPT ALL original``; every unmatched row is
    classified by its ``(partition, offset)`` as missing, extra or differing. With
    ``check_outside_range``, rows of ``replay`` outside the range count as mismatches (a new
    replay table must hold nothing else). A column only one side has (schema evolution) must be
    null on every row of the range, or those rows count against the verdict.

    Records neither side holds (transaction markers, compacted offsets, records a dead-letter
    table quarantined on both sides) are simply absent from both and compare equal.

    Returns:
        A :class:`ValidationReport`; ``report.valid`` is the verdict.

    Raises:
        ReplayMismatchError: with ``raise_on_mismatch``, when the report is not valid.
    """
    cat = settings.catalog.name
    P, O = spec.kafka_column("partition"), spec.kafka_column("offset")
    where = _range_predicate(P, O, ranges)
    excluded = [dict(g) for g in excluded]
    gap_pred = " OR ".join(f"(`{P}` = {int(g['partition'])} AND `{O}` >= {int(g['start'])} AND `{O}` < {int(g['end'])})"
                           for g in excluded)
    scope = f"{where} AND NOT ({gap_pred})" if gap_pred else where
    orig_all = _read_version(spark, cat, original)
    rep_all = _read_version(spark, cat, replay)
    rep_cols = set(rep_all.columns)
    columns = [c for c in orig_all.columns if c in rep_cols]
    only_o = [c for c in orig_all.columns if c not in rep_cols]
    only_r = [c for c in rep_all.columns if c not in set(orig_all.columns)]
    uncompared = sum(
        df.where(scope).where(" OR ".join(f"`{c}` IS NOT NULL" for c in cols)).count()
        for df, cols in ((orig_all, only_o), (rep_all, only_r)) if cols
    )
    o = orig_all.where(scope).select(*columns)
    r = rep_all.where(scope).select(*columns)

    def per_partition(df) -> dict[int, int]:
        return {row[P]: row["n"] for row in df.groupBy(P).agg(F.count(F.lit(1)).alias("n")).collect()}

    comps = {p: PartitionComparison(p, s, e) for p, (s, e) in sorted(ranges.items())}
    for p, n in per_partition(o).items():
        comps[p].original_records = n
    for p, n in per_partition(r).items():
        comps[p].replay_records = n

    mo = o.exceptAll(r).cache()
    mr = r.exceptAll(o).cache()
    examples: list[dict] = []
    try:
        mismatched = mo.count() + mr.count()
        if mismatched:
            keys_o = o.select(P, O).distinct()
            keys_r = r.select(P, O).distinct()
            kinds = {
                "missing": mo.select(P, O).distinct().join(keys_r, [P, O], "left_anti"),
                "extra": mr.select(P, O).distinct().join(keys_o, [P, O], "left_anti"),
                "differing": mo.select(P, O).union(mr.select(P, O)).distinct()
                .join(keys_o, [P, O], "left_semi").join(keys_r, [P, O], "left_semi"),
            }
            for kind, df in kinds.items():
                df = df.cache()
                try:
                    for p, n in per_partition(df).items():
                        setattr(comps[p], kind, n)
                    examples += [{"partition": row[P], "offset": row[O], "kind": kind}
                                 for row in df.orderBy(P, O).limit(sample).collect()]
                finally:
                    df.unpersist()
    finally:
        mo.unpersist()
        mr.unpersist()
    outside = rep_all.where(f"NOT {where}").count() if check_outside_range else 0
    report = ValidationReport(
        original=original.describe(),
        replay=replay.describe(),
        columns=columns,
        partitions=list(comps.values()),
        mismatched_rows=int(mismatched),
        outside_range=int(outside),
        columns_only_in_original=only_o,
        columns_only_in_replay=only_r,
        rows_with_uncompared_values=int(uncompared),
        excluded=excluded,
        examples=sorted(examples, key=lambda e: (e["partition"], e["offset"]))[:sample],
    )
    if raise_on_mismatch and not report.valid:
        raise ReplayMismatchError(report)
    return report


# -- running a replay -----------------------------------------------------------------------
@dataclass
class ReplayResult:
    """Outcome of :func:`run_replay`.

    ``target``: the table written (the original itself for a branch rebuild); ``branch``: the
    replay branch, or None for a new table. ``offsets``: the target's committed offsets after
    the run (per partition of the replay). ``batches``, ``records``, ``quarantined``:
    micro-batches committed, rows written and bad records left out by this run (a resumed replay
    counts only its own; a new table's bad records go to its own dead-letter table, a branch's
    are only counted). ``resumed``: the
    target already held part of this replay. ``complete``: every partition reached its end.
    ``snapshot_id``: head of the target ref. ``validation``: the report, when validation ran
    (it runs only on a complete replay). ``seconds``: wall time of the run.
    """

    original: str
    target: str
    branch: str | None
    from_snapshot: int | None
    range: ReplayRange
    offsets: dict[int, int]
    batches: int = 0
    records: int = 0
    quarantined: int = 0
    resumed: bool = False
    complete: bool = False
    snapshot_id: int | None = None
    validation: ValidationReport | None = None
    seconds: float = 0.0

    @property
    def remaining(self) -> dict[int, int]:
        """Offsets still to replay per partition (0 everywhere when complete)."""
        return {p: max(0, e - self.offsets.get(p, s)) for p, (s, e) in self.range.ranges.items()}

    def publish_sql(self, catalog_name: str) -> list[str]:
        """For a branch rebuild: the Spark SQL that makes the branch the table (keeping the old
        ``main`` as a tag), and the one that drops the branch instead. Empty for a new table."""
        if self.branch is None:
            return []
        tag = f"before_{self.branch}"
        t = f"{catalog_name}.{self.target}"
        return [
            f"ALTER TABLE {t} CREATE TAG `{tag}`",
            f"CALL {catalog_name}.system.set_current_snapshot(table => '{self.target}', ref => '{self.branch}')",
            f"ALTER TABLE {t} DROP BRANCH `{self.branch}`",
        ]

    def to_dict(self, catalog_name: str = "lake") -> dict:
        """JSON-ready form (CLI output, Dagster metadata); partitions as string keys."""
        out = {
            "original": self.original,
            "target": self.target,
            "branch": self.branch,
            "from_snapshot": self.from_snapshot,
            "topic": self.range.topic,
            "range": {str(p): [s, e] for p, (s, e) in self.range.ranges.items()},
            "committed_offsets": {str(p): o for p, o in sorted(self.offsets.items())},
            "remaining": {str(p): n for p, n in self.remaining.items()},
            "batches": self.batches,
            "records": self.records,
            "quarantined": self.quarantined,
            "resumed": self.resumed,
            "complete": self.complete,
            "snapshot_id": self.snapshot_id,
            "seconds": self.seconds,
            "validation": self.validation.to_dict() if self.validation else None,
        }
        if self.branch:
            out["publish"] = self.publish_sql(catalog_name)
            out["drop"] = f"ALTER TABLE {catalog_name}.{self.target} DROP BRANCH `{self.branch}`"
        return out


def default_target(spec: TableSpec, request: ReplayRequest) -> str:
    """``<namespace>.<table>_replay_<request digest>``: the same request names the same table, so
    rerunning it resumes."""
    return f"{spec.identifier}_replay_{request.digest()}"


def run_replay(
    spark,
    settings: Settings,
    spec: TableSpec,
    request: ReplayRequest,
    *,
    kafka: KafkaMetadata,
    catalog,
    commit_id: str,
    is_alive: Callable[[Attempt], bool] | None = None,
    declared: Collection[str] = (),
    progress: Callable[[str], None] | None = None,
) -> ReplayResult:
    """Replay ``request``'s range of table ``spec`` into its target, then validate if asked.

    Args:
        spark, settings, kafka, catalog: as for :class:`~kafka_iceberg.pipeline.TableWriter`.
        commit_id: recorded as ``kafka.commit-id`` of every snapshot this run commits and used
            in its attempt branches; in Dagster the run id, so ingestion's liveness check sees
            the replay's attempts as alive while its run is.
        is_alive: which leftover attempts on a new target table are dead (default: older than
            ``LAKE_ATTEMPT_TIMEOUT_S``); they are recovered before the replay continues.
        declared: identifiers of declared tables, which a new replay table may not take.
        progress: called with one line per committed micro-batch (default: the module logger).

    Returns:
        A :class:`ReplayResult`; ``validation`` is set when ``request.validate`` and the replay
        is complete. A mismatch is reported there, not raised.

    Raises:
        ReplayError: invalid request, or a target holding something else (nothing written).
        ReplayDataLossError: the range starts below a partition's log start offset.
        LakeError: the original table does not exist; and the write path's errors
            (MalformedRecordError, CommitConflictError, BrokerUnavailableError, ...).
    """
    t0 = time.perf_counter()
    say = progress or log.info
    original = TableWriter(spark, settings, spec, kafka, catalog)
    oview = original.view()
    ostate = state_at(oview.snapshots, oview.main)
    if ostate.topic is not None and ostate.topic != spec.topic:
        raise ReplayError(f"table {spec.identifier} was ingested from topic {ostate.topic!r}, not {spec.topic!r}")
    if request.branch is not None:
        result = _replay_to_branch(spark, settings, spec, request, kafka, catalog, commit_id, say)
        target_version = TableVersion(spec.identifier, result.snapshot_id, result.branch)
        check_outside = False
    else:
        result = _replay_to_table(spark, settings, spec, request, kafka, catalog, commit_id, is_alive, declared, say,
                                  oview)
        target_version = TableVersion(result.target, result.snapshot_id)
        check_outside = True
    if request.validate and result.complete:
        oview = original.view()
        result.validation = validate_replay(
            spark, settings, spec,
            original=TableVersion(spec.identifier, oview.main),
            replay=target_version,
            ranges=result.range.ranges,
            excluded=state_at(oview.snapshots, oview.main).accepted_gaps,
            check_outside_range=check_outside,
        )
        say(result.validation.summary())
    result.seconds = round(time.perf_counter() - t0, 3)
    return result


def _replay_to_table(spark, settings, spec, request, kafka, catalog, commit_id, is_alive, declared, say,
                     oview) -> ReplayResult:
    target = request.into or default_target(spec, request)
    if target == spec.identifier or target in set(declared):
        raise ReplayError(f"replay target {target} is a declared table; replay into a new table")
    existing = load_table(catalog, target)
    recorded = None
    tstate_offsets: dict[int, int] = {}
    if existing is not None:
        tview = metadata_view(existing)
        recorded = recorded_replay(tview.snapshots, tview.main)
        if recorded is None and tview.main is not None:
            raise ReplayError(f"replay target {target} already exists and holds data that is not a replay; "
                              "choose another target (--into)")
        tstate_offsets = state_at(tview.snapshots, tview.main).offsets
    rng = resolve_range(kafka, spec, request, original_snapshots=oview.snapshots, original_main=oview.main,
                        recorded=recorded)
    params = replay_params(spec.identifier, rng, request.from_snapshot)
    if recorded is not None and recorded != params:
        raise ReplayError(f"replay target {target} holds another replay ({json.dumps(recorded)}); this one is "
                          f"{json.dumps(params)}. Choose another target, or drop that table first")
    wm = kafka.watermarks(rng.topic, sorted(rng.start))
    _check_readable(spec.identifier, rng.topic, {p: tstate_offsets.get(p, s) for p, s in rng.start.items()},
                    rng.end, wm)

    tspec = replay_table_spec(spec, target)
    writer = TableWriter(spark, settings, tspec, _NoGroupCommits(kafka), catalog)
    writer.ensure_table()
    writer.recover(is_alive)
    bound = request.max_records_per_partition or spec.max_records_per_partition
    extra = {KEY_REPLAY_OF: json.dumps(params, separators=(",", ":"))}
    result = ReplayResult(spec.identifier, target, None, request.from_snapshot, rng, dict(tstate_offsets),
                          resumed=recorded is not None)
    while True:
        view = writer.view()
        state = state_at(view.snapshots, view.main)
        plan = _next_plan(target, rng, state.offsets, view.main, kafka.watermarks(rng.topic, sorted(rng.start)),
                          bound, has_state=bool(state.offsets))
        result.offsets, result.snapshot_id = dict(state.offsets), view.main
        if not plan.needs_commit or (request.max_batches is not None and result.batches >= request.max_batches):
            break
        batch = writer.execute(plan, commit_id, extra_summary=extra)
        result.batches += 1
        result.records += batch.records
        result.quarantined += batch.quarantined
        say(f"replay {spec.identifier} -> {target}: batch {result.batches}, {batch.records} records, "
            f"ranges {batch.ranges}, snapshot {batch.snapshot_id}")
    result.complete = result.offsets == rng.end
    return result


def _replay_to_branch(spark, settings, spec, request, kafka, catalog, commit_id, say) -> ReplayResult:
    ref = replay_branch_name(request.branch)
    s_id = request.from_snapshot
    writer = TableWriter(spark, settings, spec, kafka, catalog)
    view = writer.view()
    recorded = None
    if ref in view.refs:
        head = view.refs[ref]
        chain = [s.snapshot_id for s in ancestors(view.snapshots, head)]
        if s_id not in chain:
            raise ReplayError(f"branch {ref} of {spec.identifier} exists and does not descend from snapshot {s_id}; "
                              "choose another branch name, or drop it first")
        recorded = recorded_replay(view.snapshots, head)
        if recorded is None and head != s_id:
            raise ReplayError(f"branch {ref} of {spec.identifier} exists and holds commits that are not a replay")
    rng = resolve_range(kafka, spec, request, original_snapshots=view.snapshots, original_main=view.main,
                        recorded=recorded)
    params = replay_params(spec.identifier, rng, s_id)
    if recorded is not None and recorded != params:
        raise ReplayError(f"branch {ref} of {spec.identifier} holds another replay ({json.dumps(recorded)}); this one "
                          f"is {json.dumps(params)}. Choose another branch name, or drop it first")
    head = view.refs.get(ref, s_id)
    progress_offsets = state_at(view.snapshots, head).offsets
    _check_readable(spec.identifier, rng.topic, {p: progress_offsets.get(p, s) for p, s in rng.start.items()},
                    rng.end, kafka.watermarks(rng.topic, sorted(rng.start)))
    if ref not in view.refs:
        spark.sql(f"ALTER TABLE {writer.qualified} CREATE BRANCH `{ref}` AS OF VERSION {s_id}")
    bound = request.max_records_per_partition or spec.max_records_per_partition
    extra = {KEY_REPLAY_OF: json.dumps(params, separators=(",", ":"))}
    result = ReplayResult(spec.identifier, spec.identifier, ref, s_id, rng, {}, resumed=recorded is not None)
    while True:
        view = writer.view()
        head = view.refs[ref]
        state = state_at(view.snapshots, head)
        plan = _next_plan(spec.identifier, rng, state.offsets, head, kafka.watermarks(rng.topic, sorted(rng.start)),
                          bound, has_state=True)
        result.offsets = {p: state.offsets.get(p, s) for p, s in rng.start.items()}
        result.snapshot_id = head
        if plan.is_empty or (request.max_batches is not None and result.batches >= request.max_batches):
            break
        records, bad, new_head = _commit_on_branch(spark, settings, spec, kafka, catalog, ref=ref, plan=plan,
                                                   commit_id=commit_id, extra_summary=extra)
        result.batches += 1
        result.records += records
        result.quarantined += bad
        say(f"replay {spec.identifier} -> branch {ref}: batch {result.batches}, {records} records, "
            f"ranges { {r.partition: (r.start, r.end) for r in plan.ranges} }, snapshot {new_head}")
    result.complete = result.offsets == rng.end
    return result


__all__ = [
    "KEY_REPLAY_OF",
    "REPLAY_BRANCH_PREFIX",
    "PartitionComparison",
    "ReplayDataLossError",
    "ReplayError",
    "ReplayMismatchError",
    "ReplayRange",
    "ReplayRequest",
    "ReplayResult",
    "TableVersion",
    "ValidationReport",
    "default_target",
    "parse_offsets",
    "parse_time_ms",
    "recorded_replay",
    "replay_branch_name",
    "replay_params",
    "replay_table_spec",
    "resolve_range",
    "run_replay",
    "validate_replay",
]
