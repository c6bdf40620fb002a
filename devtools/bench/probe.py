"""What the soak (:mod:`devtools.bench.soak`) samples of a running deployment, each a plain number.

- :func:`processes`: every process of a process session (the deployment's: daemon, code server, run
  workers, their Spark JVMs), from ``/proc``: resident memory (bytes), threads, open file descriptors;
- :func:`jvm_heap`: the old generation of a JVM right after a full collection (``jcmd PID GC.run``, then
  ``jstat -gc PID``: ``OU``, bytes): the full collection leaves every live object there, while eden fills
  again within milliseconds under load, so old-generation used is the live set, not the collector's sawtooth;
- :func:`table_files`: per table, the snapshots of its metadata (pyiceberg) and the ``*.metadata.json``
  files in its metadata directory;
- :func:`catalog_rows`: rows of the JDBC catalog's ``iceberg_tables``;
- :func:`dagster_storage`: bytes under ``DAGSTER_HOME`` and the events of its SQLite event log (the rows
  of ``event_logs`` in every shard of ``history/runs/``: one per run, ``.db`` for events of no run;
  ``index.db`` repeats some of them, so it is not counted).
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path

import sqlalchemy

from devtools import duck


def _status(pid: str) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def processes(sid: int, run_pids: dict[int, str] | None = None) -> list[dict]:
    """The live processes of session ``sid``: ``pid``, ``name`` (the first word of the command line's
    program, e.g. ``java``, ``dagster-daemon``), ``rss`` (bytes), ``threads``, ``fds``, and ``job``: the
    Dagster job of the run the process belongs to (``run_pids``: a run's worker pid -> its job, from
    :func:`run_pids`; the process or its nearest ancestor found there; None outside runs: daemon, code
    server). A process that ends while it is read is left out."""
    out, run_pids = _read(sid), run_pids or {}
    by_pid = {p["pid"]: p for p in out}
    for p in out:
        node, seen = p, 0
        while node is not None and node["pid"] not in run_pids and seen < 50:
            node, seen = by_pid.get(node["ppid"]), seen + 1
        p["job"] = run_pids[node["pid"]] if node is not None else None
    for p in out:
        del p["ppid"]
    return out


def run_pids(home: Path) -> dict[int, str]:
    """Worker pid -> job name of the runs in progress in the Dagster instance at ``home`` (each run tags
    itself with its worker's pid: ``lake/worker-pid``, :mod:`kafka_iceberg.lake_assets.liveness`)."""
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    from kafka_iceberg.lake_assets.liveness import PID_TAG

    busy = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
    with DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs(filters=RunsFilter(statuses=busy))
    return {int(r.tags[PID_TAG]): r.job_name for r in runs if r.tags.get(PID_TAG, "").isdigit()}


def _read(sid: int) -> list[dict]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getsid(int(pid)) != sid:
                continue
            status = _status(pid)
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except (OSError, ProcessLookupError):
            continue
        out.append(
            {
                "pid": int(pid),
                "ppid": int(status.get("PPid", "0")),
                "name": _name(cmd, status.get("Name", "?")),
                "rss": int(status.get("VmRSS", "0 kB").split()[0]) * 1024,
                "threads": int(status.get("Threads", "0")),
                "fds": fds,
            }
        )
    return out


def _name(cmd: list[bytes], fallback: str) -> str:
    """``java``, ``dagster-daemon``, ``dagster api`` or the Python module run (``-m x``)."""
    words = [w.decode(errors="replace") for w in cmd if w]
    if not words:
        return fallback
    prog = Path(words[0]).name
    if prog.startswith("python") and len(words) > 1:
        args = [w for w in words[1:] if w not in ("-B", "-u", "-O")]
        if args and args[0] == "-m" and len(args) > 1:
            return args[1]
        if args and args[0] == "-c":
            return "python (multiprocessing)" if "multiprocessing" in " ".join(args[1:2]) else "python -c"
        words = [words[0], *args]
        prog = Path(args[0]).name if args else prog
    if prog == "dagster" and len(words) > 1:
        return f"dagster {words[1]}" if not words[1].endswith("/dagster") else f"dagster {' '.join(words[2:3])}"
    return prog


def jvm_heap(pid: int, timeout_s: float = 30.0) -> tuple[int, int, int | None] | None:
    """(bytes of old generation used, bytes of heap committed, bytes of the heap resident) of JVM ``pid`` after
    a full collection (module docstring); None when ``jcmd`` or ``jstat`` is missing, fails or takes longer than
    ``timeout_s``. The committed heap is what the collector chose to keep, sized from the live set; the resident
    heap (:func:`heap_resident`, None when unreadable) is the part of it in memory, so the process's resident
    memory apart from it is what a leak outside the Java heap would raise."""
    try:
        subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, timeout=timeout_s, check=True)
        lines = subprocess.run(
            ["jstat", "-gc", str(pid)], capture_output=True, text=True, timeout=timeout_s, check=True
        ).stdout.split("\n")
        row = dict(zip(lines[0].split(), lines[1].split()))
        committed = sum(float(row.get(k, 0)) for k in ("S0C", "S1C", "EC", "OC"))
        return int(float(row["OU"]) * 1024), int(committed * 1024), heap_resident(pid, timeout_s)
    except (OSError, subprocess.SubprocessError, KeyError, IndexError, ValueError):
        return None


def heap_resident(pid: int, timeout_s: float = 30.0) -> int | None:
    """Bytes resident of JVM ``pid``'s Java heap: the ``Rss`` of the ``/proc/PID/smaps`` mappings inside the heap's
    reserved range (``jcmd PID GC.heap_info``: ``[0x..., 0x...)``); None when either is unreadable."""
    try:
        info = subprocess.run(
            ["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True, timeout=timeout_s, check=True
        ).stdout
        m = re.search(r"\[(0x[0-9a-f]+), (0x[0-9a-f]+)\)", info)
        if m is None:
            return None
        low, high, inside, total = int(m[1], 16), int(m[2], 16), False, 0
        with open(f"/proc/{pid}/smaps") as smaps:
            for line in smaps:
                head = line.split(" ", 1)[0]
                if "-" in head and not head.endswith(":"):
                    start, _, end = head.partition("-")
                    inside = low <= int(start, 16) and int(end, 16) <= high
                elif inside and line.startswith("Rss:"):
                    total += int(line.split()[1]) * 1024
        return total
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def age_s(pid: int) -> float | None:
    """Seconds since process ``pid`` started (``/proc/PID/stat`` start time against ``/proc/uptime``); None
    when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")


def table_files(catalog, identifiers: list[str]) -> dict[str, tuple[int, int]]:
    """Identifier -> (snapshots in its current metadata, ``*.metadata.json`` files in its metadata
    directory) of each table that exists."""
    out = {}
    for identifier in identifiers:
        try:
            table = catalog.load_table(identifier)
        except Exception:  # noqa: BLE001 - not created yet
            continue
        meta_dir = Path(duck.local_path(table.metadata.location)) / "metadata"
        files = sum(1 for _ in meta_dir.glob("*.metadata.json"))
        out[identifier] = (len(table.metadata.snapshots), files)
    return out


def catalog_rows(sqlalchemy_uri: str) -> int:
    """Rows of the JDBC catalog's ``iceberg_tables`` (``sqlalchemy_uri``: the catalog database)."""
    engine = sqlalchemy.create_engine(sqlalchemy_uri)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sqlalchemy.text("SELECT count(*) FROM iceberg_tables")).scalar())
    finally:
        engine.dispose()


def dagster_storage(home: Path) -> tuple[int, int]:
    """(bytes of every file under ``home``, events in its SQLite event log's per-run shards)."""
    size = sum(p.stat().st_size for p in home.rglob("*") if p.is_file())
    events = 0
    for shard in (home / "history" / "runs").glob("*.db"):
        if shard.name == "index.db":
            continue
        try:
            with closing(sqlite3.connect(f"file:{shard}?mode=ro", uri=True, timeout=30)) as conn:
                events += conn.execute("SELECT count(*) FROM event_logs").fetchone()[0]
        except sqlite3.Error:
            continue  # a shard being created
    return size, events
