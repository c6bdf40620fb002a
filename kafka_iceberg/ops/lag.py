"""Consumer lag of a table and its status, judged over the table's commits and cadence. Plain Python.

The lag sensor observes a table every ``lag.interval``: per partition the table's committed
offset (its snapshot summary) and the topic's high watermark, when the table last committed,
and how many runs of the table failed since that commit. :class:`LagHistory` (the sensor
cursor) keeps what the rules need, bounded whatever the uptime:

* the high-watermark history ``(observed at, high per partition)``, minus the points the
  table has already read past (the newest of those stays as an anchor), thinned to at most
  :data:`MAX_POINTS` points by dropping every other middle point;
* the offset lag seen at the first observation after each of the last ``lag.window`` commits.

Offset lag, per partition: ``high watermark - committed offset`` (records by offset).

Time lag, per partition: how long the oldest record not yet in the table has waited, i.e.
now minus the time the high watermark passed the committed offset, interpolated between the
two history points around it (as kafka-lag-exporter does). The history is not a fixed window,
so the time lag is not capped by one. Record timestamps are not used: for replayed data they
say nothing about the table's delay.

Status of the table (Burrow's ideas, judged over commits, not over a few samples):

* ``OK``: no lag, or lag that the table keeps up with at its cadence.
* ``STALL``: lag > 0 and at least :data:`STALL_ATTEMPTS` runs of the table failed since its
  last commit: the sink runs, but its commits do not advance.
* ``STOP``: lag > 0 and nothing committed for longer than ``lag.max_interval + lag.grace``:
  the time counted is the smaller of the time since the last commit and the time lag (a
  record that arrives after a quiet day starts the clock, not the quiet day).
* ``WARN``: the table commits, but the lag seen after each of the last ``lag.window`` commits
  grew every time and now exceeds ``lag.max_offset_lag``: the sink cannot keep up.

Alerts follow the *level* (``OK``, ``WARN``, ``ERROR`` = STALL or STOP): only a change of level
alerts (:attr:`LagEvaluation.level_changed`), including the recovery back to ``OK``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

STATUSES = ("OK", "WARN", "STALL", "STOP")
LEVELS = {"OK": "OK", "WARN": "WARN", "STALL": "ERROR", "STOP": "ERROR"}
MAX_POINTS = 64
"""Most high-watermark history points kept in the cursor."""
STALL_ATTEMPTS = 2
"""Failed runs since the last commit (with lag left) that make a table STALL."""


@dataclass(frozen=True)
class LagRules:
    """Thresholds of the rules: seconds, records by offset, a number of commits. Built by :meth:`of`
    from the table's lag policy (the defaults are the ``lag:`` model's)."""

    max_interval_s: float
    grace_s: float
    window: int
    max_offset_lag: int

    @classmethod
    def of(cls, policy) -> LagRules:
        """The rules of a table's ``lag:`` declaration (:class:`kafka_iceberg.declaration.spec.LagPolicy`)."""
        return cls(policy.max_interval_s, policy.grace_s, policy.window, policy.max_offset_lag)


@dataclass(frozen=True)
class Observation:
    """One look at a table: ``observed_ms`` and ``last_commit_ms`` (ms since epoch, the newest
    ingest snapshot's time or ``None``), per partition its committed offset and the topic's high
    watermark, and ``failed_attempts``: runs of the table that failed since that commit."""

    observed_ms: int
    committed: dict[int, int]
    high: dict[int, int]
    last_commit_ms: int | None
    failed_attempts: int = 0

    def offset_lag(self) -> dict[int, int]:
        """Per-partition offset lag (records by offset, never negative)."""
        return {p: max(0, h - self.committed.get(p, 0)) for p, h in sorted(self.high.items())}


@dataclass(frozen=True)
class LagEvaluation:
    """The latest figures and the table's status, with the status before this observation."""

    status: str
    previous: str
    reason: str
    offset_lag: dict[int, int]
    time_lag_s: dict[int, float]
    since_commit_s: float | None

    @property
    def total_offset_lag(self) -> int:
        """Sum of per-partition offset lag (records by offset)."""
        return sum(self.offset_lag.values())

    @property
    def max_time_lag_s(self) -> float:
        """Largest per-partition time lag (seconds)."""
        return max(self.time_lag_s.values(), default=0.0)

    @property
    def level(self) -> str:
        """``OK``, ``WARN`` or ``ERROR`` (STALL and STOP)."""
        return LEVELS[self.status]

    @property
    def level_changed(self) -> bool:
        """Whether this observation changed the alert level (what an alert is sent for)."""
        return LEVELS[self.status] != LEVELS[self.previous]


def time_lag_s(points: list[tuple[int, dict[int, int]]], partition: int, committed: int, now_ms: int) -> float:
    """Seconds the record at ``committed`` of ``partition`` has waited (0.0 when caught up).

    ``points``: ``(observed ms, {partition: high watermark})``, oldest first. The record
    arrived when the high watermark passed ``committed``: interpolated between the last point
    at or below it and the first point above it; before the first point, that point's time
    (a lower bound: nothing older was observed).
    """
    highs = [(t, h.get(partition, 0)) for t, h in points]
    if not highs or highs[-1][1] <= committed:
        return 0.0
    arrived_ms = highs[0][0]
    for (t0, h0), (t1, h1) in zip(highs, highs[1:]):
        if h0 <= committed < h1:
            arrived_ms = t0 + (t1 - t0) * (committed - h0) / (h1 - h0)
            break
    return max(0.0, (now_ms - arrived_ms) / 1000)


def judge(rules: LagRules, lag: int, waited_s: float, failed_attempts: int, commit_lags: list[int]) -> tuple[str, str]:
    """The table's status and why (see the module docstring).

    ``lag``: total offset lag now (records); ``waited_s``: seconds without a commit while lag
    was above 0; ``commit_lags``: total lag seen after each recent commit, oldest first.
    """
    if lag <= 0:
        return "OK", "no lag"
    if failed_attempts >= STALL_ATTEMPTS:
        return "STALL", f"{failed_attempts} runs failed since the last commit; lag {lag} records"
    limit = rules.max_interval_s + rules.grace_s
    if waited_s > limit:
        return "STOP", f"no commit for {waited_s:.0f} s > max_interval + grace = {limit:.0f} s; lag {lag} records"
    recent = commit_lags[-rules.window :]
    growing = len(recent) >= rules.window and all(b > a for a, b in zip(recent, recent[1:]))
    if growing and recent[-1] > rules.max_offset_lag:
        return "WARN", f"lag grew across the last {rules.window} commits: {recent}"
    return "OK", "keeping up"


@dataclass
class LagHistory:
    """What the rules remember between observations (the lag sensor's cursor; JSON-serializable)."""

    points: list[tuple[int, dict[int, int]]] = field(default_factory=list)
    commit_lags: list[int] = field(default_factory=list)
    last_commit_ms: int | None = None
    status: str = "OK"

    def observe(self, obs: Observation, rules: LagRules) -> LagEvaluation:
        """Add ``obs``, judge the table, remember the status. Returns the evaluation."""
        self.points.append((obs.observed_ms, dict(obs.high)))
        lag = obs.offset_lag()
        if obs.last_commit_ms is not None and obs.last_commit_ms != self.last_commit_ms:
            self.commit_lags = (self.commit_lags + [sum(lag.values())])[-max(rules.window, 1) :]
            self.last_commit_ms = obs.last_commit_ms
        times = {p: round(time_lag_s(self.points, p, obs.committed.get(p, 0), obs.observed_ms), 1) for p in obs.high}
        self._prune(obs.committed)
        since = None if obs.last_commit_ms is None else max(0.0, (obs.observed_ms - obs.last_commit_ms) / 1000)
        waited = max(times.values(), default=0.0)
        if since is not None:
            waited = min(waited, since)
        status, reason = judge(rules, sum(lag.values()), waited, obs.failed_attempts, self.commit_lags)
        previous, self.status = self.status, status
        return LagEvaluation(status, previous, reason, lag, times, since)

    def _prune(self, committed: Mapping[int, int]) -> None:
        """Drop points the table has read past (keeping the newest as an anchor), then thin."""
        read = [i for i, (_, h) in enumerate(self.points) if all(v <= committed.get(p, 0) for p, v in h.items())]
        if read:
            del self.points[: read[-1]]
        while len(self.points) > MAX_POINTS:
            self.points = [self.points[0], *self.points[1:-1][1::2], self.points[-1]]

    def to_json(self) -> str:
        """The cursor string."""
        return json.dumps(
            {
                "points": [[t, {str(p): h for p, h in hs.items()}] for t, hs in self.points],
                "commit_lags": self.commit_lags,
                "last_commit_ms": self.last_commit_ms,
                "status": self.status,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: str | None) -> LagHistory:
        """Restore a history from a cursor; ``None`` or an unreadable cursor gives an empty one."""
        if not raw:
            return cls()
        try:
            doc = json.loads(raw)
            points = [(int(t), {int(p): int(h) for p, h in hs.items()}) for t, hs in doc["points"]]
            status = doc.get("status", "OK")
            return cls(
                points,
                [int(x) for x in doc.get("commit_lags", [])],
                None if doc.get("last_commit_ms") is None else int(doc["last_commit_ms"]),
                status if status in STATUSES else "OK",
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls()


def observation(
    observed_ms: int,
    committed: Mapping[int, int],
    high: Mapping[int, int],
    last_commit_ms: int | None,
    failed_attempts: int = 0,
) -> Observation:
    """Build an observation; partitions the table has not committed count from offset 0."""
    return Observation(
        observed_ms,
        {p: int(committed.get(p, 0)) for p in high},
        {p: int(h) for p, h in high.items()},
        last_commit_ms,
        failed_attempts,
    )
