"""Replay requests: what to replay and where to, parsed from the CLI's and Dagster's strings."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from kafka_iceberg.declaration.models import IDENTIFIER
from kafka_iceberg.errors import DataLossError, LakeError

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
        starts = [
            self.start_offsets is not None,
            self.start_earliest,
            self.start_ms is not None,
            self.from_snapshot is not None,
        ]
        if sum(starts) != 1:
            raise ReplayError(
                "give exactly one start: offsets (--from P:O,...), earliest, a time (--from-time) "
                "or a snapshot (--from-snapshot)"
            )
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
    ) -> ReplayRequest:
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
            "start_earliest": self.start_earliest,
            "start_ms": self.start_ms,
            "from_snapshot": self.from_snapshot,
            "end_offsets": {str(k): v for k, v in sorted((self.end_offsets or {}).items())},
            "end_ms": self.end_ms,
        }
        return hashlib.sha1(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:8]
