"""Streaming runs: one Dagster run that keeps its process and Spark session and commits
micro-batch after micro-batch while lag remains, up to a time budget.

Why: a new process plus a new Spark session per micro-batch costs about 20 s before the first
record is read (launch, Python start-up, Spark start, DDL), so sensor-driven freshness cannot get
below that. A run launched by the lag sensor therefore keeps going: after each commit it looks at
the topic's high watermarks and, while records are waiting, runs the next micro-batch on the
same session. Each commit is its own ``AssetMaterialization`` of the run's micro-batch slot; the
last one is the step's ``MaterializeResult``. See docs/benchmark.md, "Streaming runs".

What stays the same:

- exactly-once: every micro-batch is the whole write path (recover, plan from the committed
  offsets, conditional commit); the commit id is the run id, so the liveness test of recovery
  still recognises this run's attempts;
- the pool rules: the run holds its pool slot throughout, so no other run of the table (or, on
  SQLite, of any table) commits meanwhile; to share the slot, the loop ends after the current
  commit as soon as any other run is waiting in the run queue;
- the backfill semantics: a run of a backfill (tag ``dagster/backfill``), or one launched by hand
  or by a job, commits exactly one micro-batch, as before. Only runs launched by a sensor
  (tag ``dagster/sensor_name``) stream.

- the checks at the end of a streaming run run at a lower CPU priority (:func:`lower_cpu_priority`),
  so they do not slow the next run's first micro-batches on the same host.

``Settings.stream`` (:class:`~kafka_iceberg.config.models.StreamSettings`) holds the two bounds:
``budget_s`` (``LAKE_STREAM_BUDGET_S``, seconds, default 300; 0 turns streaming off) bounds a run's
loop: no micro-batch starts after it. ``idle_s`` (``LAKE_STREAM_IDLE_S``, seconds, default 2) is how
long a run with no lag left waits for new records before it ends.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from dagster import (
    AssetExecutionContext,
    AssetMaterialization,
    DagsterRunStatus,
    MaterializeResult,
    MetadataValue,
    RunsFilter,
)

from kafka_iceberg.config.models import StreamSettings
from kafka_iceberg.kafka.admin import KafkaMetadata

POLL_S = 0.25  # watermark polling interval while waiting for records (seconds)


def _descendants(root: int, proc: Path) -> list[int]:
    """``root`` and the pids of every process below it, from ``proc``'s ``<pid>/stat`` files (Linux)."""
    children: dict[int, list[int]] = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # the name may hold spaces and ")"
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def lower_cpu_priority(niceness: int, proc: Path = Path("/proc")) -> int:
    """Raise the nice value of every thread of this process and of its descendants (the Spark JVM, its Python
    workers) to ``niceness`` at least (``LAKE_CHECK_NICENESS``, before a streaming run's last checks, so a
    successor serving on the same host gets the cores first); Linux keeps it per thread, and threads
    started later inherit it.
    Returns the number of threads changed (0 without ``/proc``, or with ``niceness`` 0). Never raises: a
    thread that ended or that is not this user's is skipped."""
    changed = 0
    for pid in _descendants(os.getpid(), proc) if proc.is_dir() and niceness > 0 else []:
        for task in (proc / str(pid) / "task").glob("[0-9]*"):
            try:
                tid = int(task.name)
                if os.getpriority(os.PRIO_PROCESS, tid) < niceness:
                    os.setpriority(os.PRIO_PROCESS, tid, niceness)
                    changed += 1
            except OSError:
                continue
    return changed


def stream_budget_s(tags: dict[str, str], budget_s: float) -> float:
    """Seconds a run with these tags may keep committing: 0 for a backfill run or a run not
    launched by a sensor, else ``budget_s`` (``Settings.stream.budget_s``)."""
    if "dagster/backfill" in tags or "dagster/sensor_name" not in tags:
        return 0.0
    return budget_s


def others_waiting(context, pool: str | None = None) -> bool:
    """Whether another run needs what this run holds: any other run queued on this Dagster instance,
    or (``pool`` given) another run's step waiting inside its run for a slot of ``pool`` (with
    op-granularity pools a run starts, then waits in its step)."""
    queued = context.instance.get_run_ids(filters=RunsFilter(statuses=[DagsterRunStatus.QUEUED]), limit=2)
    if any(run_id != context.run_id for run_id in queued):
        return True
    return pool is not None and pool_waiting(context, pool)


def pool_waiting(context, pool: str) -> bool:
    """Whether another run's step waits inside its run for a slot of ``pool`` (Dagster's pool
    concurrency info; False on a storage without pools)."""
    storage = context.instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return False
    return bool(storage.get_concurrency_info(pool).pending_run_ids - {context.run_id})


POOL_CHECK_S = 1.0
"""Seconds between two looks at the pool's waiting runs (a query of the Dagster instance)."""


def at_most_every(seconds: float, predicate: Callable[[], bool], clock: Callable[[], float] = time.monotonic):
    """``predicate`` evaluated at most once per ``seconds``; in between, its last answer."""
    last: list = [None, False]  # (clock when evaluated, answer)

    def throttled() -> bool:
        now = clock()
        if last[0] is None or now - last[0] >= seconds:
            last[:] = [now, predicate()]
        return last[1]

    return throttled


def committed_offsets(result: MaterializeResult) -> dict[int, int]:
    """The committed offsets recorded in a micro-batch's metadata (partition -> next offset)."""
    raw = result.metadata["committed_offsets"]
    return {int(p): int(o) for p, o in getattr(raw, "value", raw).items()}


def wait_for_lag(kafka: KafkaMetadata, topic: str, committed: dict[int, int], timeout_s: float) -> int:
    """Poll the topic's high watermarks every :data:`POLL_S` until records wait beyond
    ``committed`` or ``timeout_s`` passes. Returns the offset lag seen last (records)."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    while True:
        lag = sum(max(0, w.high - committed.get(p, w.low)) for p, w in kafka.watermarks(topic).items())
        if lag > 0 or time.monotonic() >= deadline:
            return lag
        time.sleep(POLL_S)


def materialize_stream(
    context: AssetExecutionContext,
    kafka: KafkaMetadata,
    topic: str,
    one_batch: Callable[[], MaterializeResult],
    stream: StreamSettings,
    pool: str | None = None,
) -> MaterializeResult:
    """Run ``one_batch`` (one whole micro-batch, returning its ``MaterializeResult``) once, and
    again while records wait and the budget lasts (:func:`stream_budget_s` of ``stream.budget_s``;
    ``stream.idle_s`` seconds of waiting for new records at most), ending early when another run
    waits for the run's ``pool`` (:func:`others_waiting`, asked at most every :data:`POOL_CHECK_S`).
    Every commit but the last is logged as an ``AssetMaterialization`` of the run's slot; the
    last is returned. Errors of ``one_batch`` propagate (earlier commits stay committed)."""
    budget = stream_budget_s(dict(context.run.tags), stream.budget_s)
    idle_s = stream.idle_s
    started = time.monotonic()
    deadline = started + budget
    waiting = at_most_every(POOL_CHECK_S, lambda: others_waiting(context, pool))
    result, commits = one_batch(), 1
    while budget > 0 and time.monotonic() < deadline and not waiting():
        lag = wait_for_lag(kafka, topic, committed_offsets(result), min(idle_s, deadline - time.monotonic()))
        if lag == 0 or time.monotonic() >= deadline:
            break
        context.log_event(
            AssetMaterialization(
                asset_key=context.asset_key,
                partition=context.partition_key,
                metadata={**result.metadata, "stream_commit": MetadataValue.int(commits)},
            )
        )
        result, commits = one_batch(), commits + 1
    if commits > 1:
        context.log.info(
            f"streaming run: {commits} micro-batches in {time.monotonic() - started:.1f} s (budget {budget:.0f} s)"
        )
    return MaterializeResult(metadata={**result.metadata, "stream_commit": MetadataValue.int(commits)})


__all__ = [
    "POOL_CHECK_S",
    "at_most_every",
    "committed_offsets",
    "lower_cpu_priority",
    "materialize_stream",
    "others_waiting",
    "pool_waiting",
    "stream_budget_s",
    "wait_for_lag",
]
