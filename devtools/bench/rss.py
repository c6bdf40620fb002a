"""Peak RSS of a process tree, sampled from ``/proc`` by a process of its own (goal 5).

    python -m devtools.bench.rss ROOT_PID INTERVAL_S

Samples every INTERVAL_S seconds the RSS (bytes) of ROOT_PID and its descendants, itself excluded: ``java``
(the Spark driver JVM, which in local mode also runs the executor) and ``python*`` (the driver process,
the PySpark worker daemon and its forked workers). When a line arrives on stdin (or stdin closes) it
samples once more and prints one JSON object of the peaks: ``jvm_peak`` and ``workers_peak`` in bytes and
``workers_max_count`` processes. A sampling thread inside the measured process would hold its GIL, which
the driver's consuming thread needs. Dev tooling.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path


def children() -> dict[int, list[int]]:
    """Every process's children: parent pid -> child pids, from ``/proc/*/stat``."""
    out: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out.setdefault(ppid, []).append(int(d))
    return out


def rss_and_comm(pid: int) -> tuple[int, str]:
    """(RSS in bytes, command name) of ``pid``; (0, "") once it is gone."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024, comm
    except OSError:
        pass
    return 0, ""


def sample(root: int, peaks: dict) -> None:
    """One sample of ``root``'s tree (this process left out), folded into ``peaks``."""
    tree, todo, jvm, count = children(), [root], 0, 1
    workers = rss_and_comm(root)[0]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child == os.getpid():
                continue
            todo.append(child)
            rss, comm = rss_and_comm(child)
            if comm == "java":
                jvm += rss
            elif comm.startswith("python"):
                workers, count = workers + rss, count + 1
    peaks["jvm_peak"] = max(peaks["jvm_peak"], jvm)
    peaks["workers_peak"] = max(peaks["workers_peak"], workers)
    peaks["workers_max_count"] = max(peaks["workers_max_count"], count)


def main(argv: list[str]) -> int:
    root, interval = int(argv[0]), float(argv[1])
    peaks = {"jvm_peak": 0, "workers_peak": 0, "workers_max_count": 0}
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    while not stop.is_set():
        sample(root, peaks)
        stop.wait(interval)
    sample(root, peaks)
    print(json.dumps(peaks), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
