"""A Spark standalone cluster on the loopback interface, started from the pyspark package.

``$SPARK_HOME/bin/spark-class org.apache.spark.deploy.master.Master`` and ``...worker.Worker``
(the pyspark wheel has no ``sbin/`` start scripts). Used by tests/test_spark_cluster.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

# The dev tooling these deployment tests use, imported in this one place (re-exported):
from devtools import duck  # noqa: F401
from devtools.demo.data import produce  # noqa: F401
from devtools.services import devpostgres  # noqa: F401
from devtools.services.devbroker import free_port

SPARK_HOME = Path(pyspark.__file__).parent


@dataclass
class StandaloneCluster:
    """A running master and its workers; ``url`` is ``spark://127.0.0.1:PORT``."""

    url: str
    webui: str  # http://127.0.0.1:PORT of the master
    procs: list[subprocess.Popen] = field(default_factory=list)

    def alive_workers(self) -> int:
        """Workers the master lists as ALIVE (its JSON status page)."""
        try:
            no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with no_proxy.open(f"{self.webui}/json/", timeout=5) as resp:
                status = json.load(resp)
        except OSError:
            return 0
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")

    def stop(self) -> None:
        """Terminate workers, then the master (SIGTERM, then SIGKILL after 20 s)."""
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _spark_class(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def start_cluster(
    root: Path, workers: int = 2, cores: int = 1, memory: str = "1g", wait_s: float = 90.0
) -> StandaloneCluster:
    """Start a master and ``workers`` workers (each ``cores`` cores, ``memory`` for executors) under ``root``.

    Raises:
        RuntimeError: not every worker registered within ``wait_s`` seconds (logs under ``root``).
    """
    root.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(root),
        "SPARK_WORKER_DIR": str(root / "work"),
    }
    port, ui = free_port(), free_port()
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}")
    cluster.procs.append(
        _spark_class(
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui),
            ],
            root / "master.log",
            env,
        )
    )
    for i in range(workers):
        work = root / f"worker{i}"
        work.mkdir(exist_ok=True)
        cluster.procs.append(
            _spark_class(
                [
                    "org.apache.spark.deploy.worker.Worker",
                    cluster.url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(cores),
                    "--memory",
                    memory,
                    "--work-dir",
                    str(work),
                    "--webui-port",
                    str(free_port()),
                ],
                root / f"worker{i}.log",
                env,
            )
        )
    deadline = time.monotonic() + wait_s
    while cluster.alive_workers() < workers:
        if time.monotonic() > deadline or any(p.poll() is not None for p in cluster.procs):
            cluster.stop()
            raise RuntimeError(f"Spark standalone cluster did not come up with {workers} workers (logs in {root})")
        time.sleep(0.5)
    return cluster
