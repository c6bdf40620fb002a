"""CPU priority of a process tree (Linux): a worker run lowers its own, Spark JVM included, for its last
checks, so its successor serving on the same host gets the cores first. Plain Python, no Dagster."""

from __future__ import annotations

import os
from pathlib import Path


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
    """Raise the nice value of every thread of this process and of its descendants (the Spark JVM, its
    Python workers) to ``niceness`` at least; Linux keeps it per thread, and threads started later inherit it.
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


__all__ = ["lower_cpu_priority"]
