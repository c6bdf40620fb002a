"""Stop every process the demo and ``make dev`` started for one ``$LAKE_HOME``, and delete the
PostgreSQL files kept outside it (``make clean`` runs this, then stops the broker and deletes
``$LAKE_HOME``).

Stopped: the stand-in Schema Registry (pid in ``registry/registry.pid``), Debezium captures
(pids in ``cdc/debezium/*.pid``), and every private PostgreSQL whose home is under
``$LAKE_HOME`` (:mod:`devtools.services.devpostgres`; its relocated directory under
``/var/tmp`` is deleted too). A pid is signalled only when ``/proc/<pid>/cmdline`` still names
the expected program, so a reused pid is never hit.

Run: ``python -m devtools.services.cleanup LAKE_HOME``; prints one line per thing stopped.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

from devtools.services import devpostgres

PID_FILES = {  # glob under $LAKE_HOME -> what its process's command line must contain
    "registry/registry.pid": "devtools.services.registry",
    "cdc/debezium/*.pid": "devtools.services.cdc_source",
    "**/debezium-*/*.pid": "devtools.services.cdc_source",  # the rehearsal's captures
}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stop_pid_file(pid_file: Path, marker: str, wait_s: float = 30.0) -> bool:
    """SIGTERM the process of ``pid_file`` if its command line contains ``marker``; SIGKILL it after
    ``wait_s`` seconds. Deletes ``pid_file``. Returns whether a process was stopped."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return False
    pid_file.unlink(missing_ok=True)
    if marker not in _cmdline(pid):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while marker in _cmdline(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if marker in _cmdline(pid):
        os.kill(pid, signal.SIGKILL)
    return True


def postgres_homes(lake_home: Path) -> list[Path]:
    """Homes of the private PostgreSQL servers under ``lake_home`` (a location record or ``data/PG_VERSION``)."""
    found = {p.parent for p in lake_home.rglob(devpostgres.LOCATION_FILE)}
    found |= {p.parent.parent for p in lake_home.rglob("data/PG_VERSION")}
    return sorted(found)


def clean(lake_home: Path) -> list[str]:
    """Stop what runs for ``lake_home`` and delete relocated PostgreSQL files; returns what was done."""
    done = []
    for pattern, marker in PID_FILES.items():
        for pid_file in sorted(lake_home.glob(pattern)):
            if stop_pid_file(pid_file, marker):
                done.append(f"stopped {marker.rsplit('.', 1)[-1]} ({pid_file})")
    for home in postgres_homes(lake_home):
        files = devpostgres.files_dir(home)
        if devpostgres.stop_data_dir(files / "data", "fast"):
            done.append(f"stopped PostgreSQL of {home}")
        if files != home:
            shutil.rmtree(files, ignore_errors=True)
            done.append(f"deleted {files}")
    return done


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m devtools.services.cleanup LAKE_HOME", file=sys.stderr)
        return 2
    lake_home = Path(args[0])
    if lake_home.is_dir():
        for line in clean(lake_home):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
