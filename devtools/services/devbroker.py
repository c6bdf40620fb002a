"""The local development broker: noida-db's Kafka-protocol service.

Used by ``make demo`` when ``KAFKA_BOOTSTRAP_SERVERS`` is unset, and by the test fixtures.
Production points ``KAFKA_BOOTSTRAP_SERVERS`` at a real Kafka (or MSK, Confluent,
Redpanda, AutoMQ) cluster instead; nothing else changes.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from kafka_iceberg.errors import BrokerUnavailableError


def _noida() -> str:
    exe = Path(sys.executable).with_name("noida-db")
    if exe.exists():
        return str(exe)
    found = shutil.which("noida-db")
    if not found:
        raise BrokerUnavailableError("noida-db is not installed (pip install noida-db==0.2.3)")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def start(data_dir: Path, port: int, host: str = "127.0.0.1", wait_s: float = 30.0) -> str:
    """Start noida-db's Kafka service on ``host:port`` with data in ``data_dir`` (idempotent).

    Returns the bootstrap servers string. Data survives a restart with the same ``data_dir``.

    Raises:
        BrokerUnavailableError: it did not accept connections within ``wait_s`` seconds, or
            ``host:port`` is served by a broker that does not keep its data in ``data_dir``
            (another checkout's dev broker: using it would mix its topics into this one's lake).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    if port_open(host, port) and not (data_dir / "noida.control.json").exists():  # noida-db's file while it runs
        raise BrokerUnavailableError(
            f"{host}:{port} is already served by a broker whose data is not in {data_dir} (another checkout's dev "
            "broker?); stop it (noida-db down --data-dir <its data dir>) or use another port"
        )
    if not port_open(host, port):
        subprocess.run(
            [_noida(), "up", "--only", "kafka", "--kafka-port", str(port), "--host", host, "--data-dir", str(data_dir)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + wait_s
    while not port_open(host, port):
        if time.monotonic() > deadline:
            raise BrokerUnavailableError(f"noida-db did not start on {host}:{port} (log: {data_dir}/noida.log)")
        time.sleep(0.1)
    return f"{host}:{port}"


def stop(data_dir: Path) -> None:
    """Stop the noida-db server that owns ``data_dir`` (a clean shutdown; data is kept)."""
    subprocess.run(
        [_noida(), "down", "--data-dir", str(data_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def stop_kafka(data_dir: Path) -> None:
    """Stop only the Kafka service (simulates a broker outage; ``start_kafka`` brings it back)."""
    subprocess.run(
        [_noida(), "stop", "kafka", "--data-dir", str(data_dir)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def start_kafka(data_dir: Path) -> None:
    """Start the Kafka service again after :func:`stop_kafka`."""
    subprocess.run(
        [_noida(), "start", "kafka", "--data-dir", str(data_dir)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
