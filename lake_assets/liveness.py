"""Run liveness: a run whose worker process died never holds a table.

A SIGKILLed ``dagster asset materialize`` (or a run worker killed with ``dagster dev`` or the
daemon) leaves its run STARTED and its step's slot in the table's concurrency pool claimed; the
next run of the table would wait on the pool forever. Without the daemon nothing frees it.

Every run of this code location is tagged, before its first step claims a pool slot, with the
host name and pid of its run worker, that process's start time and the run's own id (:data:`HOST_TAG`,
:data:`PID_TAG`, :data:`START_TAG`, :data:`RUN_TAG`; set by :func:`liveness_executor`). A retry or a
re-execution starts with a copy of its parent's tags: until its own worker tags it, it counts as
untagged (:func:`has_own_worker_tags`), never as a run whose worker died. :func:`reap_dead_runs`
then

* marks failed (``report_run_failed``) every STARTING or STARTED run tagged with *this* host
  whose worker process no longer exists (or whose pid now belongs to a process started at
  another time), and frees its pool slots; and
* frees the slots still claimed by runs that have already ended (what the daemon's run
  monitoring does after ``free_slots_after_run_end_seconds``); and
* marks failed every run of this code location (tagged ``lake/table`` or selecting a ``lake/...``
  asset) that has stayed NOT_STARTED or STARTED for :data:`UNTAGGED_GRACE_S` seconds without
  liveness tags: its worker died between creating or starting the run and reaching the executor
  (a CLI process killed in its first second). Such a run holds no slot, but the sensors would
  take its table (or worker) for busy for ever. STARTING runs are left to run monitoring's start timeout.

It runs at the start of every run and every :data:`CHECK_INTERVAL_S` seconds while a run
executes (so a run blocked on the pool proceeds once the holder is found dead), and on every tick
of the ``run_liveness`` sensor (sensors/liveness.py). Runs on another host (a Kubernetes pod,
another machine) cannot be checked by pid: Dagster's run monitoring (dagster.yaml, the daemon)
covers them. See docs/operations.md, "Runs that die".
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, Executor, ExecutorDefinition, RunsFilter, executor

from kafka_iceberg.lake_assets.vocabulary import TABLE_TAG

HOST_TAG = "lake/worker-host"
"""Run tag: host name of the run's worker process."""
PID_TAG = "lake/worker-pid"
"""Run tag: pid of the run's worker process on :data:`HOST_TAG`."""
START_TAG = "lake/worker-start"
"""Run tag: start time of that process (clock ticks since boot, from ``/proc/<pid>/stat``; empty
where there is no ``/proc``), so a reused pid is not taken for the dead worker."""
RUN_TAG = "lake/worker-run"
"""Run tag: the id of the run the liveness tags were written for. Dagster's run retries and re-executions
copy the parent run's tags; a retry must not be taken for its dead parent."""

CHECK_INTERVAL_S = 10.0
"""Seconds between two liveness checks while a run executes."""

UNTAGGED_GRACE_S = 60.0
"""Seconds a run of this code location may stay NOT_STARTED or STARTED without liveness tags before
it counts as dead. A live worker tags its run within milliseconds of RUN_START."""

RUNNING = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]
ENDED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


def process_start_time(pid: int) -> str:
    """Start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22), or
    ``""`` without ``/proc``. Raises ``ProcessLookupError`` when ``/proc`` has no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            raise ProcessLookupError(pid) from None
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def worker_tags(pid: int | None = None, run_id: str = "") -> dict[str, str]:
    """The liveness tags of process ``pid`` (default: this process) on this host, for run ``run_id``
    (:data:`RUN_TAG`; without one, the tags count as the run's own wherever they are found)."""
    pid = pid or os.getpid()
    tags = {HOST_TAG: socket.gethostname(), PID_TAG: str(pid), START_TAG: process_start_time(pid)}
    return {**tags, RUN_TAG: run_id} if run_id else tags


def has_own_worker_tags(run: DagsterRun) -> bool:
    """Whether ``run`` carries liveness tags written for it, not a copy of its parent's (a retry, a
    re-execution) from before its own worker tagged it."""
    return HOST_TAG in run.tags and PID_TAG in run.tags and run.tags.get(RUN_TAG, run.run_id) == run.run_id


def worker_alive(tags: dict[str, str]) -> bool:
    """Whether the worker named by a run's liveness tags (on this host) still runs. A pid that now
    belongs to a process with another start time counts as dead."""
    try:
        pid = int(tags[PID_TAG])
        os.kill(pid, 0)
        started = process_start_time(pid)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return not tags.get(START_TAG) or not started or started == tags[START_TAG]


def _free_slots(instance: DagsterInstance, run_id: str) -> None:
    if instance.event_log_storage.supports_global_concurrency_limits:
        instance.event_log_storage.free_concurrency_slots_for_run(run_id)


def _slot_holders(instance: DagsterInstance) -> set[str]:
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return set()
    holders: set[str] = set()
    for pool in storage.get_concurrency_keys():
        info = storage.get_concurrency_info(pool)
        holders.update(slot.run_id for slot in info.claimed_slots)
        holders.update(step.run_id for step in info.pending_steps)
    return holders


def _fail(instance: DagsterInstance, run: DagsterRun, why: str) -> str:
    """Mark ``run`` failed with ``why``, free its pool slots; returns its run id."""
    instance.report_run_failed(run, why)
    _free_slots(instance, run.run_id)
    return run.run_id


def _ours(run: DagsterRun) -> bool:
    return TABLE_TAG in run.tags or any(key.path[0] == "lake" for key in (run.asset_selection or ()))


def reap_untagged_runs(
    instance: DagsterInstance, exclude_run_id: str | None = None, grace_s: float = UNTAGGED_GRACE_S
) -> list[str]:
    """Mark failed the runs of this code location that stayed NOT_STARTED or STARTED for ``grace_s``
    seconds (since their last status change) without liveness tags of their own (:func:`has_own_worker_tags`),
    and free any slot they hold.
    Never touches ``exclude_run_id``. Returns their run ids; reads and writes the instance only."""
    before = datetime.now(timezone.utc) - timedelta(seconds=grace_s)
    filters = RunsFilter(statuses=[DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTED], updated_before=before)
    reaped: list[str] = []
    for record in instance.get_run_records(filters=filters):
        run = record.dagster_run
        if run.run_id == exclude_run_id or has_own_worker_tags(run) or not _ours(run):
            continue
        reaped.append(
            _fail(
                instance,
                run,
                f"run {run.status.value} for over {grace_s:.0f} s without liveness tags: "
                "its worker died before reaching the executor; marked failed by the next liveness check",
            )
        )
    return reaped


def reap_dead_runs(instance: DagsterInstance, exclude_run_id: str | None = None) -> list[str]:
    """Mark failed the in-progress runs of this host whose worker died, free their pool slots and
    the slots of runs that already ended, and reap untagged runs (:func:`reap_untagged_runs`);
    never touches ``exclude_run_id`` (the caller's run).

    Returns the ids of the runs it marked failed or freed slots of. Reads and writes the
    instance's run and event-log storage only.
    """
    host = socket.gethostname()
    reaped: list[str] = []
    for run in instance.get_runs(filters=RunsFilter(statuses=RUNNING, tags={HOST_TAG: host})):
        if run.run_id == exclude_run_id or not has_own_worker_tags(run) or worker_alive(dict(run.tags)):
            continue
        reaped.append(
            _fail(
                instance,
                run,
                f"run worker pid {run.tags[PID_TAG]} on {host} is gone (killed or crashed); "
                "marked failed and its pool slots freed by the next run's liveness check",
            )
        )
    for run_id in _slot_holders(instance) - {exclude_run_id, *reaped}:
        run = instance.get_run_by_id(run_id)
        if run is None or run.status in ENDED:
            _free_slots(instance, run_id)
            reaped.append(run_id)
    return reaped + reap_untagged_runs(instance, exclude_run_id)


class LivenessWatch:
    """Calls :func:`reap_dead_runs` every ``interval_s`` seconds in a daemon thread until
    :meth:`stop`; errors are passed to ``on_error`` (a check must never fail the run)."""

    def __init__(
        self,
        instance: DagsterInstance,
        run_id: str,
        interval_s: float = CHECK_INTERVAL_S,
        on_error: Callable[[Exception], None] = lambda exc: None,
    ):
        self._instance, self._run_id, self._interval_s, self._on_error = instance, run_id, interval_s, on_error
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lake-run-liveness", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.check()

    def check(self) -> list[str]:
        try:
            return reap_dead_runs(self._instance, exclude_run_id=self._run_id)
        except Exception as exc:  # storage hiccup: try again next interval
            self._on_error(exc)
            return []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


class _LivenessExecutor(Executor):
    """Runs ``inner`` after tagging the run with its worker's liveness tags and reaping dead runs,
    and keeps reaping while it executes."""

    def __init__(self, inner: Executor):
        self._inner = inner

    @property
    def retries(self):
        return self._inner.retries

    @property
    def step_dependency_config(self):
        return self._inner.step_dependency_config

    def execute(self, plan_context, execution_plan):
        instance, run_id = plan_context.instance, plan_context.run_id
        instance.add_run_tags(run_id, worker_tags(run_id=run_id))
        watch = LivenessWatch(instance, run_id, on_error=lambda exc: plan_context.log.warning(f"liveness check: {exc}"))
        for dead in watch.check():
            plan_context.log.warning(
                f"run {dead}: its worker is gone or it had ended; marked failed / pool slots freed"
            )
        watch.start()
        try:
            yield from self._inner.execute(plan_context, execution_plan)
        finally:
            watch.stop()


def liveness_executor(base: ExecutorDefinition) -> ExecutorDefinition:
    """``base`` (e.g. ``in_process_executor``), with the same name and config, whose runs carry
    liveness tags and reap dead runs (see the module docstring)."""

    @executor(name=base.name, config_schema=base.config_schema, requirements=base.get_requirements)
    def _executor(init_context):
        return _LivenessExecutor(base.executor_creation_fn(init_context))

    return _executor


__all__ = [
    "CHECK_INTERVAL_S",
    "HOST_TAG",
    "LivenessWatch",
    "PID_TAG",
    "RUN_TAG",
    "START_TAG",
    "UNTAGGED_GRACE_S",
    "has_own_worker_tags",
    "liveness_executor",
    "process_start_time",
    "reap_dead_runs",
    "reap_untagged_runs",
    "worker_alive",
    "worker_tags",
]
