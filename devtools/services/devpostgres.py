"""A private PostgreSQL server for a production-like JDBC catalog in tests and the rehearsal.

Debian's ``postgresql`` (15) package, installed by ``scripts/install-system-deps.sh``. The
server runs as the ``postgres`` user when this process is root (PostgreSQL refuses root), on
a loopback port, with its data under a directory of its own. Production points
``LAKE_CATALOG_URI`` at a managed PostgreSQL instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from devtools.services.devbroker import free_port
from kafka_iceberg.errors import CatalogUnavailableError

PG_BIN = Path("/usr/lib/postgresql/15/bin")


@dataclass
class PostgresServer:
    """One private PostgreSQL server: ``uri`` is its SQLAlchemy-style URI (database ``iceberg``)."""

    root: Path
    port: int
    uri: str

    @property
    def _as_user(self) -> list[str]:
        return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def start(self) -> None:
        """Start (or restart after :meth:`stop`) the server; waits until it accepts connections."""
        subprocess.run(
            [
                *self._as_user,
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(self.root / "data"),
                "-l",
                str(self.root / "log"),
                "-w",
                "-o",
                f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1",
                "start",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast`` disconnects every client at once, as an outage would)."""
        subprocess.run(
            [*self._as_user, str(PG_BIN / "pg_ctl"), "-D", str(self.root / "data"), "-m", mode, "-w", "stop"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def destroy(self) -> None:
        """Stop the server and delete its directory."""
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def create(root: Path | None = None) -> PostgresServer:
    """Initialize and start a new server with database ``iceberg`` owned by user ``lake``.

    ``root`` defaults to a new temporary directory (outside pytest's root-only temporary
    directories, so the ``postgres`` user can use it).

    Raises:
        CatalogUnavailableError: PostgreSQL 15 is not installed.
    """
    if not (PG_BIN / "pg_ctl").exists():
        raise CatalogUnavailableError(
            "PostgreSQL 15 is not installed: run scripts/install-system-deps.sh (make test does)"
        )
    root = Path(root or tempfile.mkdtemp(prefix="lake-pg-"))
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = PostgresServer(root, port, f"postgresql://lake:lakepw@127.0.0.1:{port}/iceberg")
    pwfile = root / "pw"
    pwfile.write_text("lakepw\n")
    if server._as_user:
        shutil.chown(root, "postgres")
        shutil.chown(pwfile, "postgres")
    subprocess.run(
        [
            *server._as_user,
            str(PG_BIN / "initdb"),
            "-D",
            str(root / "data"),
            "-U",
            "lake",
            "--pwfile",
            str(pwfile),
            "-A",
            "scram-sha-256",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    server.start()
    subprocess.run(
        [str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "lake", "iceberg"],
        check=True,
        env={**os.environ, "PGPASSWORD": "lakepw"},
    )
    return server
