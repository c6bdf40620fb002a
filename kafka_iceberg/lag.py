"""Consumer lag of a table, and its status over a window of observations (Burrow's rules).

Plain Python. A *sample* is one observation of a table: per partition, its committed offset
(from the table's snapshot summary) and the topic's high watermark, plus when the table
last committed. The lag sensor keeps the last few samples in its cursor and evaluates them.

Offset lag, per partition: ``high watermark - committed offset`` (records by offset).

Time lag, per partition: how long ago the oldest record not yet in the table arrived. It is
estimated the way kafka-lag-exporter does, by interpolating over the window's
``(high watermark, observed at)`` points: the committed offset became the high watermark at
some time between two observations. When the committed offset is older than the whole
window, the estimate is a lower bound (the oldest observation's age). Reading the record's
own timestamp would give its event time, which for replayed or late data says nothing
about the table's delay.

Status, per partition, over the window (Burrow's consumer-lag evaluation rules):

* ``OK``: some sample in the window had zero lag, or lag is shrinking.
* ``STOP``: the table's last commit is older than the window is long, and there is lag.
* ``STALL``: the committed offset did not move across the window while lag stayed above 0.
* ``WARN``: the committed offset moved, but lag grew or held in every interval.

The table's status is its worst partition's (STOP > STALL > WARN > OK).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Mapping

STATUSES = ("OK", "WARN", "STALL", "STOP")
_RANK = {s: i for i, s in enumerate(STATUSES)}


@dataclass(frozen=True)
class LagSample:
    """One observation: ``observed_ms`` and ``last_commit_ms`` in ms since epoch; per partition
    the table's committed offset and the topic's high watermark."""

    observed_ms: int
    committed: dict[int, int]
    high: dict[int, int]
    last_commit_ms: int | None

    def offset_lag(self) -> dict[int, int]:
        """Per-partition offset lag (records by offset, never negative)."""
        return {p: max(0, h - self.committed.get(p, 0)) for p, h in sorted(self.high.items())}


@dataclass
class LagWindow:
    """The most recent samples, oldest first, bounded to ``size`` (serializable as a sensor cursor)."""

    size: int
    samples: list[LagSample] = field(default_factory=list)

    def add(self, sample: LagSample) -> "LagWindow":
        """Append ``sample`` and drop the oldest beyond ``size``. Returns self."""
        self.samples.append(sample)
        del self.samples[: max(0, len(self.samples) - self.size)]
        return self

    def to_json(self) -> str:
        """The cursor string."""
        return json.dumps({"size": self.size, "samples": [asdict(s) for s in self.samples]}, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | None, size: int) -> "LagWindow":
        """Restore a window from a cursor (``None`` or garbage gives an empty window of ``size``)."""
        if not raw:
            return cls(size)
        try:
            doc = json.loads(raw)
            samples = [
                LagSample(
                    int(s["observed_ms"]),
                    {int(k): int(v) for k, v in s["committed"].items()},
                    {int(k): int(v) for k, v in s["high"].items()},
                    None if s.get("last_commit_ms") is None else int(s["last_commit_ms"]),
                )
                for s in doc.get("samples", [])
            ]
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls(size)
        return cls(size).extend(samples)

    def extend(self, samples: list[LagSample]) -> "LagWindow":
        """Append several samples (oldest first). Returns self."""
        for s in samples:
            self.add(s)
        return self


def time_lag_s(samples: list[LagSample], partition: int) -> float:
    """Estimated seconds since the oldest unread record of ``partition`` arrived (0.0 when caught up).

    Interpolates the time at which the high watermark passed the latest committed offset over
    the window's (high watermark, observed time) points; see the module docstring.
    """
    if not samples:
        return 0.0
    now = samples[-1]
    committed = now.committed.get(partition, 0)
    if now.high.get(partition, 0) <= committed:
        return 0.0
    points = [(s.high.get(partition, 0), s.observed_ms) for s in samples]
    # the first observation at which the high watermark already exceeded the committed offset
    arrived_ms = points[0][1]
    for (h0, t0), (h1, t1) in zip(points, points[1:]):
        if h0 <= committed < h1:
            arrived_ms = t0 + (t1 - t0) * (committed - h0) / (h1 - h0)
            break
    return max(0.0, (now.observed_ms - arrived_ms) / 1000)


def partition_status(samples: list[LagSample], partition: int) -> str:
    """Burrow status of one partition over the window (see the module docstring)."""
    if not samples:
        return "OK"
    lags = [s.offset_lag().get(partition, 0) for s in samples]
    committed = [s.committed.get(partition, 0) for s in samples]
    if lags[-1] == 0 or 0 in lags:
        return "OK"
    now = samples[-1]
    span_ms = now.observed_ms - samples[0].observed_ms
    if len(samples) >= 2 and now.last_commit_ms is not None and now.observed_ms - now.last_commit_ms > span_ms > 0:
        return "STOP"
    if len(samples) < 2:
        return "OK"
    if committed[0] == committed[-1]:
        return "STALL"
    if all(b >= a for a, b in zip(lags, lags[1:])):
        return "WARN"
    return "OK"


@dataclass(frozen=True)
class LagEvaluation:
    """The latest sample's lag figures and the window's status, per partition and for the table."""

    status: str
    partition_status: dict[int, str]
    offset_lag: dict[int, int]
    time_lag_s: dict[int, float]
    samples: int

    @property
    def total_offset_lag(self) -> int:
        """Sum of per-partition offset lag (records by offset)."""
        return sum(self.offset_lag.values())

    @property
    def max_time_lag_s(self) -> float:
        """Largest per-partition time lag (seconds)."""
        return max(self.time_lag_s.values(), default=0.0)


def evaluate(window: LagWindow) -> LagEvaluation:
    """Evaluate a window. Raises ``ValueError`` for an empty one."""
    if not window.samples:
        raise ValueError("cannot evaluate an empty lag window")
    latest = window.samples[-1]
    parts = sorted(latest.high)
    statuses = {p: partition_status(window.samples, p) for p in parts}
    worst = max(statuses.values(), key=_RANK.__getitem__, default="OK")
    return LagEvaluation(
        status=worst,
        partition_status=statuses,
        offset_lag=latest.offset_lag(),
        time_lag_s={p: round(time_lag_s(window.samples, p), 1) for p in parts},
        samples=len(window.samples),
    )


def sample_from(
    observed_ms: int, committed: Mapping[int, int], high: Mapping[int, int], last_commit_ms: int | None
) -> LagSample:
    """Build a sample; partitions the table has not committed count from offset 0."""
    return LagSample(observed_ms, {p: int(committed.get(p, 0)) for p in high}, {p: int(h) for p, h in high.items()},
                     last_commit_ms)
