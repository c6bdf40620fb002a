"""The benchmarks' deployment: the code location as a gRPC code server, and ``dagster-daemon run`` on it.

A production deployment serves its code location from a long-lived code server (a user-code deployment
on Kubernetes, ``dagster api grpc`` or ``dagster code-server start`` elsewhere), and its workspace points
at it. A daemon given a ``python_module`` workspace instead starts a code server of its own and replaces
it every 60 s (Dagster's workspace refresh), each start loading every table's definitions again.

``python -m devtools.bench.deployment WORKSPACE PORT`` writes WORKSPACE (one ``grpc_server`` entry on
127.0.0.1:PORT), starts ``dagster api grpc`` on this checkout's module, waits until it answers a health
check (at most 300 s), then becomes ``dagster-daemon run``: both in the caller's process session, so one
``killpg`` stops the deployment and the run workers it launched.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

MODULE = "kafka_iceberg.lake_assets.definitions"
LOCATION = "kafka_iceberg"
STARTUP_S = 300.0


def workspace_yaml(port: int) -> str:
    """A workspace of one code location served on 127.0.0.1:``port``."""
    entry = {"grpc_server": {"host": "127.0.0.1", "port": port, "location_name": LOCATION}}
    return yaml.safe_dump({"load_from": [entry]})


def main(argv: list[str]) -> None:
    workspace, port = Path(argv[0]), int(argv[1])
    workspace.write_text(workspace_yaml(port))
    bin_dir = Path(sys.executable).parent
    dagster = str(bin_dir / "dagster")
    subprocess.Popen(
        [dagster, "api", "grpc", "-m", MODULE, "-h", "127.0.0.1", "-p", str(port), "--log-level", "warning"]
    )
    deadline = time.monotonic() + STARTUP_S
    health = [dagster, "api", "grpc-health-check", "-h", "127.0.0.1", "-p", str(port)]
    while subprocess.run(health, capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            sys.exit(f"the code server on port {port} did not answer within {STARTUP_S:.0f} s")
        time.sleep(0.5)
    daemon = str(bin_dir / "dagster-daemon")
    os.execv(daemon, [daemon, "run", "-w", str(workspace)])


if __name__ == "__main__":
    main(sys.argv[1:])
