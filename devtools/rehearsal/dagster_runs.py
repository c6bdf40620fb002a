"""Rehearsal scenarios that kill what *Dagster* runs (issue 9), registered into
:data:`devtools.rehearsal.run.SCENARIOS` (see ``SCENARIO_MODULES``).

The other scenarios kill the rehearsal's own sink process; these materialize the table the way
users do, through the real code location (``kafka_iceberg.lake_assets.definitions`` with a tables file holding
only the scenario's table), each on a Dagster instance of its own (``DAGSTER_HOME`` under the
rehearsal home, the project's ``dagster.yaml``) and, where a webserver runs, a free port:

* ``dagster_cli_kills``: SIGKILL (process group) ``dagster asset materialize`` of the table at
  random points (before its run exists, holding the pool slot, mid micro-batch), then one more
  materialization catches up;
* ``dagster_sensor_kills``: ``dagster dev`` with the ``lake_workers`` sensor on; SIGKILL the run
  workers the sensor launched (with their Spark JVM and Python workers);
* ``dagster_daemon_kill``: ``lake backfill`` submitted, ``dagster-daemon run`` SIGKILLed (process
  group, with the runs it launched) mid-backfill and restarted;
* ``dagster_dev_restart``: ``dagster dev`` stopped as a whole (SIGTERM) mid-run and started again.

Producers write throughout; at the end every record is reconciled (:func:`devtools.rehearsal.run.reconcile`)
and each scenario checks that the table caught up by itself with no manual step: no run left
NOT_STARTED/QUEUED/STARTING/STARTED, no concurrency-pool slot held, lag 0, no attempt branch left.
"seconds to recover" (in the notes) is from the last fault until all of that held.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from devtools.polling import wait_for as _wait
from devtools.rehearsal.run import Rehearsal, ScenarioResult, Traffic, kill_group, reconcile
from devtools.services import devbroker
from kafka_iceberg.catalog.tables import load_table
from kafka_iceberg.config.settings import CHECKOUT
from kafka_iceberg.declaration.spec import parse_table_spec

LOCATION = ["-m", "kafka_iceberg.lake_assets.definitions"]
BIN = Path(sys.executable).parent


# -- processes -------------------------------------------------------------------------------------
def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_tree(pid: int, timeout_s: float = 30) -> int:
    """SIGKILL process ``pid`` and every descendant (a run worker with its Spark JVM and Python
    workers); returns how many processes were signalled. Raises RuntimeError if one survives."""
    tree, todo, pids = _children(), [pid], []
    while todo:
        p = todo.pop()
        pids.append(p)
        todo += tree.get(p, [])
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if not _wait(lambda: not any(_alive(p) for p in pids), timeout_s, 0.1):
        raise RuntimeError(f"processes {[p for p in pids if _alive(p)]} survived SIGKILL")
    return len(pids)


def stop_group(proc: subprocess.Popen | None, grace_s: float = 60) -> None:
    """Stop a process started in its own session: SIGTERM, then SIGKILL of its whole group."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        kill_group(proc)
    except RuntimeError:
        pass


# -- one scenario's Dagster instance ----------------------------------------------------------------
class DagsterSite:
    """A Dagster instance of its own for one scenario's table: ``DAGSTER_HOME`` under the rehearsal
    home with the project's dagster.yaml, a tables file declaring only ``decl``, the code location
    ``kafka_iceberg.lake_assets.definitions``; launches ``dagster`` commands on it and inspects its runs and pools."""

    def __init__(self, rehearsal: Rehearsal, decl: dict):
        from dagster import DagsterInstance

        from kafka_iceberg.lake_assets.backfill import ring_slot_keys
        from kafka_iceberg.lake_assets.vocabulary import MICRO_BATCHES, table_key

        self.rehearsal, self.decl, self.spec = rehearsal, decl, parse_table_spec(decl)
        self.home = rehearsal.lake.home / f"dagster-{decl['name']}"
        self.home.mkdir(parents=True)
        shutil.copy(CHECKOUT / "dagster.yaml", self.home / "dagster.yaml")
        self.tables_file = rehearsal._tables_file(decl)
        self.instance = DagsterInstance.from_config(str(self.home))
        self.instance.add_dynamic_partitions(MICRO_BATCHES.name, ring_slot_keys())
        self.select = "/".join(table_key(self.spec).path)
        self.logs = rehearsal.lake.home / f"logs-{decl['name']}"  # ($DAGSTER_HOME/logs is Dagster's)
        self.logs.mkdir()
        self.started: list[subprocess.Popen] = []

    def env(self, **more: str) -> dict[str, str]:
        return self.rehearsal.lake.env(
            DAGSTER_HOME=str(self.home), LAKE_TABLES_FILE=str(self.tables_file), PYTHONPATH=str(CHECKOUT), **more
        )

    def launch(self, args: list[str], log: str, **env: str) -> subprocess.Popen:
        """Start ``args`` (a command under the venv's bin) in its own session, output to ``logs/<log>``."""
        with open(self.logs / log, "ab") as out:
            proc = subprocess.Popen(
                [str(BIN / args[0]), *args[1:]],
                cwd=CHECKOUT,
                env=self.env(**env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append(proc)
        return proc

    def materialize(self, slot: str, log: str) -> subprocess.Popen:
        return self.launch(
            ["dagster", "asset", "materialize", *LOCATION, "--select", self.select, "--partition", slot], log
        )

    def dev(self, log: str) -> subprocess.Popen:
        port = devbroker.free_port()
        return self.launch(["dagster", "dev", *LOCATION, "-h", "127.0.0.1", "-p", str(port)], log)

    def daemon(self, log: str) -> subprocess.Popen:
        return self.launch(["dagster-daemon", "run", *LOCATION], log)

    def log_tail(self, log: str, chars: int = 3000) -> str:
        path = self.logs / log
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def runs(self, statuses=None) -> list:
        from dagster import RunsFilter

        return list(self.instance.get_runs(filters=RunsFilter(statuses=statuses) if statuses else None))

    def in_progress(self) -> list:
        """Runs NOT_STARTED, QUEUED, STARTING or STARTED."""
        from kafka_iceberg.lake_assets.vocabulary import IN_PROGRESS

        return self.runs(IN_PROGRESS)

    def held_slots(self) -> list[tuple[str, str]]:
        """(pool, run id) of every claimed slot or pending step in any concurrency pool."""
        storage = self.instance.event_log_storage
        held = []
        for pool in storage.get_concurrency_keys():
            info = storage.get_concurrency_info(pool)
            held += [(pool, s.run_id) for s in info.claimed_slots] + [(pool, s.run_id) for s in info.pending_steps]
        return held

    def attempt_branch(self, run_ids: list[str]) -> bool:
        """Whether one of these runs has an attempt branch on the table (is mid micro-batch)."""
        from kafka_iceberg.batch.recovery import commit_token, parse_attempt

        table = load_table(self.rehearsal.catalog, self.spec.identifier)
        tokens = {commit_token(run_id) for run_id in run_ids}
        attempts = [parse_attempt(ref) for ref in (table.metadata.refs if table is not None else {})]
        return any(a is not None and a.token in tokens for a in attempts)

    def new_runs(self, known: set[str]) -> list[str]:
        return [run.run_id for run in self.runs() if run.run_id not in known]

    def stop_all(self) -> None:
        """Stop every process this site started, then SIGKILL any run worker of its runs still alive."""
        from kafka_iceberg.lake_assets.liveness import PID_TAG

        for proc in reversed(self.started):
            stop_group(proc, grace_s=20)
        for run in self.runs():
            pid = run.tags.get(PID_TAG)
            if pid and _alive(int(pid)):
                kill_tree(int(pid))


# -- shared checks ---------------------------------------------------------------------------------
def settled(site: DagsterSite) -> bool:
    """The table caught up by itself: lag 0, no run in progress, no pool slot held."""
    return site.rehearsal._lag(site.spec) == 0 and not site.in_progress() and not site.held_slots()


def final_checks(site: DagsterSite, traffic: Traffic, killed: list[str], checks: dict[str, bool]):
    """Add the checks every Dagster scenario ends with; returns the reconciliation tally."""
    from dagster import DagsterRunStatus

    r, spec = site.rehearsal, site.spec
    stuck = site.in_progress()
    held = site.held_slots()
    checks["producer delivered everything"] = not traffic.errors
    checks["no stuck run (NOT_STARTED/QUEUED/STARTING/STARTED)"] = not stuck
    checks["no held pool slot"] = not held
    checks["table caught up (lag 0)"] = r._lag(spec) == 0
    checks["killed runs marked failed"] = all(
        site.instance.get_run_by_id(run_id).status == DagsterRunStatus.FAILURE for run_id in killed
    )
    checks["no attempt branches left"] = r._no_leftovers(spec)
    checks["no overlapping snapshot ranges"] = r._no_overlaps(spec)
    if not checks["killed runs marked failed"]:
        r.log(
            "  killed runs not FAILURE: "
            + ", ".join(
                f"{run_id[:8]} {site.instance.get_run_by_id(run_id).status.value}"
                for run_id in killed
                if site.instance.get_run_by_id(run_id).status != DagsterRunStatus.FAILURE
            )
        )
    if stuck or held:
        r.log(f"  stuck runs {[(x.run_id, x.status.value) for x in stuck]}; held slots {held}")
    return reconcile(r.catalog, spec, traffic.expected())


def _table(r: Rehearsal, prefix: str, **lag: str) -> dict:
    decl, _ = r._table(f"{prefix}_{uuid.uuid4().hex[:6]}", 2, 100_000)
    if lag:
        decl["lag"] = lag
    return decl


# -- dagster_cli_kills -----------------------------------------------------------------------------
KILL_TARGETS = ("early", "holding the pool slot", "mid micro-batch", "anywhere")


def _kill_moment(site: DagsterSite, ended: Callable[[], bool], run_ids: Callable[[], list[str]], target: str) -> None:
    """Wait for the moment ``target`` (one of :data:`KILL_TARGETS`) of the run (ids from ``run_ids``)
    plus a random delay, or until ``ended()``."""
    rng = site.rehearsal.rng
    if target == "early":
        time.sleep(rng.uniform(0.5, 8.0))
    elif target == "holding the pool slot":
        _wait(lambda: ended() or set(run_ids()) & {run_id for _, run_id in site.held_slots()}, 300)
        time.sleep(rng.uniform(0.0, 6.0))
    elif target == "mid micro-batch":
        _wait(lambda: ended() or site.attempt_branch(run_ids()), 300, 0.2)
        time.sleep(rng.uniform(0.0, 2.0))
    else:
        time.sleep(rng.uniform(2.0, 60.0))


def _where(site: DagsterSite, proc: subprocess.Popen, known: set[str]) -> tuple[str, list[str]]:
    """Where a kill now lands, and the id of ``proc``'s run (if it exists yet)."""
    new = site.new_runs(known)
    if proc.poll() is not None:
        return "after the run ended", new
    if not new:
        return "before the run existed", new
    if site.attempt_branch(new):
        return "mid micro-batch (attempt branch)", new
    if any(run_id in new for _, run_id in site.held_slots()):
        return "holding the pool slot", new
    return "run started, no slot yet", new


def cli_kills(r: Rehearsal, n: int = 20, rate: float = 150.0) -> ScenarioResult:
    """SIGKILL ``dagster asset materialize`` of the table at random points until ``n`` kills have
    landed on a live CLI (a kill after its run ended does not count; at most ``2 n`` tries) while a
    producer writes, then materialize once more: that run finds the dead runs, fails them, frees
    the pool slot, recovers the dead attempts and catches up (see the module docstring)."""
    from dagster import DagsterRunStatus

    t0 = time.monotonic()
    site = DagsterSite(r, _table(r, "dcli"))
    traffic = Traffic(r.lake.kafka_config, site.spec.topic, rate, bad_every=97)
    traffic.start()
    kinds: dict[str, int] = {}
    killed: list[str] = []
    try:
        i = 0
        while i - kinds.get("after the run ended", 0) < n and i < 2 * n:
            known = {run.run_id for run in site.runs()}
            proc = site.materialize(f"slot-{i % 50:02d}", f"materialize-{i}.log")
            target = KILL_TARGETS[i] if i < len(KILL_TARGETS) else r.rng.choice(KILL_TARGETS)
            _kill_moment(site, lambda: proc.poll() is not None, lambda: site.new_runs(known), target)
            where, new = _where(site, proc, known)
            kill_group(proc)
            new = site.new_runs(known)  # with a run created between the look and the kill
            if new and all(site.instance.get_run_by_id(x).status == DagsterRunStatus.SUCCESS for x in new):
                where = "after the run ended"  # it succeeded between the look and the kill (the CLI was tearing down)
            killed += new if where != "after the run ended" else []
            kinds[where] = kinds.get(where, 0) + 1
            r.log(f"  kill {i + 1} ({n} to land): {where} (run {new[0][:8] if new else '-'}, rc {proc.returncode})")
            i += 1
        traffic.stop()
        t_fault = time.monotonic()
        final = site.materialize("slot-49", "final.log")
        final.wait(timeout=900)
        recovered = _wait(lambda: settled(site), 60)
        recover_s = time.monotonic() - t_fault
        checks = {"final materialization succeeded": final.returncode == 0}
        if final.returncode != 0:
            r.log(site.log_tail("final.log"))
        tally = final_checks(site, traffic, killed, checks)
    finally:
        traffic.stop()
        site.stop_all()
    faults = sum(kinds.values()) - kinds.get("after the run ended", 0)
    return ScenarioResult(
        "dagster CLI kills",
        faults,
        tally,
        checks,
        f"kill points {kinds}; recovered in {recover_s:.0f} s{'' if recovered else ' (NOT settled)'}",
        time.monotonic() - t0,
    )


# -- runs launched by the daemon ---------------------------------------------------------------------
def _live_run(site: DagsterSite, tag: str, skip: set[str]):
    """A STARTED run with tag ``tag`` (e.g. ``dagster/sensor_name``), not in ``skip``, whose tagged
    worker process is alive, or ``None``."""
    from dagster import DagsterRunStatus

    from kafka_iceberg.lake_assets.liveness import PID_TAG

    for run in site.runs([DagsterRunStatus.STARTED]):
        if tag in run.tags and run.run_id not in skip and PID_TAG in run.tags and _alive(int(run.tags[PID_TAG])):
            return run
    return None


def _cut_off(site: DagsterSite) -> list[str]:
    """Runs left STARTING or STARTED whose worker process is gone (or never tagged itself): what a
    kill left behind, which liveness (or run monitoring, for STARTING) must fail."""
    from dagster import DagsterRunStatus

    from kafka_iceberg.lake_assets.liveness import PID_TAG

    return [
        run.run_id
        for run in site.runs([DagsterRunStatus.STARTING, DagsterRunStatus.STARTED])
        if PID_TAG not in run.tags or not _alive(int(run.tags[PID_TAG]))
    ]


def _settle(
    site: DagsterSite,
    traffic: Traffic,
    killed: list[str],
    checks: dict[str, bool],
    t_fault: float,
    timeout_s: float = 900,
):
    """Stop the producer, wait until the table caught up by itself, then the final checks.
    Returns (tally, seconds from ``t_fault`` to settled)."""
    traffic.stop()
    ok = _wait(lambda: settled(site), timeout_s, 2.0)
    recover_s = time.monotonic() - t_fault
    checks["caught up by itself (lag 0, no run, no slot)"] = bool(ok)
    return final_checks(site, traffic, killed, checks), recover_s


def sensor_kills(r: Rehearsal, n: int = 3, rate: float = 150.0) -> ScenarioResult:
    """``dagster dev`` (daemon and webserver) with the ``lake_workers`` sensor on, a producer writing:
    SIGKILL ``n`` runs the sensor launched (the run worker, its Spark JVM and Python workers) at
    random moments; the run_liveness sensor fails them and frees their slots, the lake_workers sensor
    launches the next run, and the table catches up by itself."""
    t0 = time.monotonic()
    site = DagsterSite(r, _table(r, "dsensor", max_offset_lag=200, max_interval="10s", interval="5s"))
    traffic = Traffic(r.lake.kafka_config, site.spec.topic, rate, bad_every=97)
    killed: list[str] = []
    seen: set[str] = set()
    checks: dict[str, bool] = {}
    try:
        traffic.start()
        dev = site.dev("dev.log")
        for i in range(2 * n):  # a run that ended before its kill moment does not count
            if len(killed) == n:
                break
            run = _wait(lambda: _live_run(site, "dagster/sensor_name", seen), 600, 1.0)
            if run is None:
                r.log(f"  no sensor-launched run within 600 s\n{site.log_tail('dev.log')}")
                break
            seen.add(run.run_id)
            pid, target = int(run.tags["lake/worker-pid"]), KILL_TARGETS[i % len(KILL_TARGETS)]
            _kill_moment(site, lambda: not _alive(pid), lambda: [run.run_id], target)
            where = "mid micro-batch" if site.attempt_branch([run.run_id]) else target
            if not _alive(pid):
                r.log(f"  run {run.run_id[:8]} ended before its kill moment")
                continue
            procs = kill_tree(pid)
            killed.append(run.run_id)
            r.log(f"  kill {len(killed)}/{n}: run {run.run_id[:8]}, {where} ({procs} processes)")
        checks["every kill hit a sensor-launched run"] = len(killed) == n
        tally, recover_s = _settle(site, traffic, killed, checks, time.monotonic())
        checks["dagster dev stayed up"] = dev.poll() is None
        launched = len([x for x in site.runs() if "dagster/sensor_name" in x.tags])
    finally:
        traffic.stop()
        site.stop_all()
    return ScenarioResult(
        "dagster sensor-run kills",
        len(killed),
        tally,
        checks,
        f"{launched} runs launched by the lake_workers sensor, {len(killed)} killed; recovered in {recover_s:.0f} s",
        time.monotonic() - t0,
    )


def _submit_backfill(site: DagsterSite, batches: int) -> str:
    """``lake backfill --table T --batches N`` on the site; returns the backfill id.
    Raises RuntimeError when the command failed."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kafka_iceberg.lake_assets.cli",
            "backfill",
            "--table",
            site.spec.name,
            "--batches",
            str(batches),
        ],
        cwd=CHECKOUT,
        env=site.env(),
        capture_output=True,
        text=True,
    )
    words = done.stdout.split()
    if done.returncode != 0 or len(words) < 2 or words[0] != "backfill":
        raise RuntimeError(f"lake backfill failed (rc {done.returncode}): {done.stdout[-500:]} {done.stderr[-1500:]}")
    return words[1].rstrip(":")


def _backfill_status(site: DagsterSite, backfill_id: str) -> str:
    return site.instance.get_backfill(backfill_id).status.value


def daemon_kill(r: Rehearsal, batches: int = 3, rate: float = 150.0) -> ScenarioResult:
    """A backfill of ``batches`` micro-batch runs (``lake backfill``) under ``dagster-daemon run``,
    a producer writing; SIGKILL the daemon's process group (with the runs it launched) mid-backfill,
    start it again: the dead run is failed, the backfill ends, the worker run catches up the rest."""
    from kafka_iceberg.lake_assets.backfill import ACTIVE_BACKFILL_STATUSES

    t0 = time.monotonic()
    site = DagsterSite(r, _table(r, "ddaemon", max_offset_lag=200, max_interval="10s", interval="5s"))
    traffic = Traffic(r.lake.kafka_config, site.spec.topic, rate, bad_every=97)
    checks: dict[str, bool] = {}
    try:
        traffic.start()
        time.sleep(10)  # lag builds
        backfill_id = _submit_backfill(site, batches)
        daemon = site.daemon("daemon-1.log")
        run = _wait(lambda: _live_run(site, "dagster/backfill", set()), 600, 1.0)
        checks["the backfill started a run"] = run is not None
        if run is not None:
            pid = int(run.tags["lake/worker-pid"])
            _kill_moment(site, lambda: not _alive(pid), lambda: [run.run_id], r.rng.choice(KILL_TARGETS[:3]))
        kill_group(daemon)
        killed = _cut_off(site)
        t_fault = time.monotonic()
        r.log(f"  daemon killed; runs of the backfill cut off: {[k[:8] for k in killed]}")
        time.sleep(5)
        site.daemon("daemon-2.log")
        ended = _wait(lambda: site.instance.get_backfill(backfill_id).status not in ACTIVE_BACKFILL_STATUSES, 900, 2.0)
        checks["the backfill ended"] = bool(ended)
        status = _backfill_status(site, backfill_id)
        tally, recover_s = _settle(site, traffic, killed, checks, t_fault)
        runs = site.runs()
    finally:
        traffic.stop()
        site.stop_all()
    return ScenarioResult(
        "dagster daemon killed mid-backfill",
        1,
        tally,
        checks,
        f"backfill {status}; {len(runs)} runs in all; {len(killed)} cut off by the kill; "
        f"recovered in {recover_s:.0f} s",
        time.monotonic() - t0,
    )


def dev_restart(r: Rehearsal, restarts: int = 2, rate: float = 150.0) -> ScenarioResult:
    """``dagster dev`` stopped as a whole (SIGTERM, then its process group) while a sensor-launched
    run executes, and started again, ``restarts`` times, a producer writing; the table catches up."""
    t0 = time.monotonic()
    site = DagsterSite(r, _table(r, "ddev", max_offset_lag=200, max_interval="10s", interval="5s"))
    traffic = Traffic(r.lake.kafka_config, site.spec.topic, rate, bad_every=97)
    checks: dict[str, bool] = {}
    cut: list[str] = []
    try:
        traffic.start()
        dev = site.dev("dev-0.log")
        for i in range(restarts):
            run = _wait(lambda: _live_run(site, "dagster/sensor_name", set(cut)), 600, 1.0)
            checks[f"restart {i + 1}: a run was executing"] = run is not None
            time.sleep(r.rng.uniform(0.0, 10.0))
            stop_group(dev, grace_s=60)
            cut += [run_id for run_id in _cut_off(site) if run_id not in cut]
            r.log(f"  dagster dev stopped ({i + 1}/{restarts}); runs left dead: {[c[:8] for c in cut]}")
            time.sleep(3)
            dev = site.dev(f"dev-{i + 1}.log")
        tally, recover_s = _settle(site, traffic, cut, checks, time.monotonic())
        checks["dagster dev up after the restarts"] = dev.poll() is None
    finally:
        traffic.stop()
        site.stop_all()
    return ScenarioResult(
        "dagster dev stop and restart",
        restarts,
        tally,
        checks,
        f"{len(cut)} runs cut off by the stops; recovered in {recover_s:.0f} s",
        time.monotonic() - t0,
    )


def register(scenarios: dict) -> None:
    """Add this module's scenarios to ``scenarios`` (name -> fn(rehearsal, args)): the CLI kills
    ``args.kills`` times (default :data:`~devtools.rehearsal.run.KILLS`), the sensor-run kills a fifth as often (at least 3)."""
    from devtools.rehearsal.run import KILLS, kills_or

    scenarios["dagster_cli_kills"] = lambda r, args: cli_kills(r, kills_or(args, KILLS))
    scenarios["dagster_sensor_kills"] = lambda r, args: sensor_kills(r, max(3, kills_or(args, KILLS) // 5))
    scenarios["dagster_daemon_kill"] = lambda r, args: daemon_kill(r)
    scenarios["dagster_dev_restart"] = lambda r, args: dev_restart(r)


__all__ = [
    "DagsterSite",
    "cli_kills",
    "daemon_kill",
    "dev_restart",
    "final_checks",
    "kill_tree",
    "register",
    "sensor_kills",
    "settled",
    "stop_group",
]
