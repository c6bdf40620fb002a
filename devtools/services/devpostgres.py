"""A private PostgreSQL server for a production-like JDBC catalog in tests, the rehearsal and the demo.

Any PostgreSQL server package (``scripts/install-system-deps.sh`` installs Debian's
``postgresql``); its binaries are found by :func:`find_bin_dir`. The server listens on a
loopback port, with its files in a directory of its own. Production points ``LAKE_CATALOG_URI``
at a managed PostgreSQL instead.

PostgreSQL refuses to run as root, so when this process is root the server runs as user
``postgres``, who cannot enter a home such as ``/root`` (mode 0700). Its files then live in a
``postgres``-owned directory made by ``mkdtemp`` under ``/var/tmp`` (kept across reboots, like
the rest of ``$LAKE_HOME``), and the home records that directory's path in :data:`LOCATION_FILE`;
:func:`open_existing` and ``make clean`` (:mod:`devtools.services.cleanup`) find it there.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from devtools.services.devbroker import free_port
from kafka_iceberg.errors import CatalogUnavailableError

LOCATION_FILE = "postgres.location"
"""File in a server's home holding the path of the directory its files live in (root only)."""
RELOCATED_PARENT = Path("/var/tmp")
"""Where a root process puts the ``postgres``-owned directories (world-traversable, sticky)."""


def find_bin_dir(debian_root: Path = Path("/usr/lib/postgresql")) -> Path | None:
    """PostgreSQL's server binaries (the directory holding ``pg_ctl`` and ``initdb``), or ``None``.

    Order: ``pg_config --bindir``; the newest ``<debian_root>/<major>/bin`` (Debian, Ubuntu);
    the directory of ``pg_ctl`` on ``PATH`` (Fedora, Arch, Homebrew). No version is assumed.
    """
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        done = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip():
            candidates.append(Path(done.stdout.strip()))
    debian = glob.glob(str(debian_root / "*" / "bin"))
    candidates += sorted((Path(d) for d in debian), key=_major_version, reverse=True)
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).parent)
    return next((c for c in candidates if (c / "pg_ctl").exists() and (c / "initdb").exists()), None)


def _major_version(bin_dir: Path) -> tuple[int, ...]:
    """``.../16/bin`` -> (16,); ``.../9.6/bin`` -> (9, 6); anything else sorts first."""
    parts = bin_dir.parent.name.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (-1,)


PG_BIN = find_bin_dir() or Path("/usr/lib/postgresql/<not installed>/bin")
"""The server binaries used (:func:`find_bin_dir`; a path that does not exist when none is installed)."""


class PostgresCommandError(RuntimeError):
    """A PostgreSQL command (``initdb``, ``pg_ctl``, ``createdb``) failed; the message is one line
    with the command, its last output line and the server log's path."""


def _as_postgres() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def run_command(cmd: list[str], log: Path | None = None, env: dict | None = None) -> None:
    """Run a PostgreSQL command.

    Raises:
        PostgresCommandError: it exited non-zero (one line: program, last output line, ``log``).
    """
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        last = ((done.stderr or done.stdout).strip().splitlines() or ["no output"])[-1]
        where = f"; log: {log}" if log else ""
        program = Path(cmd[len(_as_postgres())] if cmd[0] == "runuser" else cmd[0]).name
        raise PostgresCommandError(f"{program} failed: {last}{where}")


@dataclass
class PostgresServer:
    """One private PostgreSQL server: ``uri`` is its SQLAlchemy-style URI (database ``iceberg``).

    ``root`` holds its files (``data/``, ``log``, the socket); ``home`` is the directory the
    caller asked for (``root`` itself unless relocated for root, see the module docstring)."""

    root: Path
    port: int
    uri: str
    home: Path | None = field(default=None)

    @property
    def _as_user(self) -> list[str]:
        return _as_postgres()

    @property
    def log(self) -> Path:
        """The server log."""
        return self.root / "log"

    def start(self) -> None:
        """Start (or restart after :meth:`stop`) the server; waits until it accepts connections.

        Raises:
            PostgresCommandError: ``pg_ctl start`` failed (the line names the log).
        """
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        data = str(self.root / "data")
        run_command(
            [*self._as_user, str(PG_BIN / "pg_ctl"), "-D", data, "-l", str(self.log), "-w", "-o", options, "start"]
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast`` disconnects every client at once, as an outage would)."""
        stop_data_dir(self.root / "data", mode)

    def destroy(self) -> None:
        """Stop the server and delete its directory (and its home's location record)."""
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
        if self.home is not None and self.home != self.root:
            shutil.rmtree(self.home, ignore_errors=True)


def stop_data_dir(data: Path, mode: str = "fast") -> bool:
    """``pg_ctl stop`` the server of data directory ``data``; returns whether one was running there."""
    if not (data / "postmaster.pid").exists() or not (PG_BIN / "pg_ctl").exists():
        return False
    done = subprocess.run(
        [*_as_postgres(), str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", mode, "-w", "stop"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return done.returncode == 0


def files_dir(home: Path) -> Path:
    """Where the files of the server at ``home`` live: the recorded location, else ``home``."""
    record = home / LOCATION_FILE
    return Path(record.read_text().strip()) if record.exists() else home


def _files_dir_for_new(home: Path) -> Path:
    """The directory a new server at ``home`` keeps its files in, owned by ``postgres`` when root."""
    home.mkdir(parents=True, exist_ok=True)
    if not _as_postgres():
        return home
    root = Path(tempfile.mkdtemp(prefix="lake-pg-", dir=RELOCATED_PARENT))
    shutil.chown(root, "postgres")
    (home / LOCATION_FILE).write_text(f"{root}\n")
    return root


def require_installed() -> None:
    """Raises:
    CatalogUnavailableError: no PostgreSQL server binaries, or (as root) no ``postgres`` user / ``runuser``."""
    if not (PG_BIN / "pg_ctl").exists():
        raise CatalogUnavailableError(
            "PostgreSQL is not installed (no pg_ctl from pg_config --bindir, /usr/lib/postgresql/*/bin or PATH): "
            "run `make system-deps` (scripts/install-system-deps.sh installs it)"
        )
    if _as_postgres() and not shutil.which("runuser"):
        raise CatalogUnavailableError("running as root needs `runuser` (util-linux) to start PostgreSQL as postgres")
    if _as_postgres():
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise CatalogUnavailableError(
                "running as root needs the user `postgres` (the postgresql package creates it)"
            ) from None


def open_existing(home: Path) -> PostgresServer | None:
    """The server initialized at ``home`` earlier (on a new free port, not started), or ``None``."""
    root = files_dir(home)
    if not (root / "data" / "PG_VERSION").exists():
        return None
    port = free_port()
    return PostgresServer(root, port, f"postgresql://lake:lakepw@127.0.0.1:{port}/iceberg", home)


def create(root: Path | None = None) -> PostgresServer:
    """Initialize and start a new server with database ``iceberg`` owned by user ``lake``.

    ``root`` (the server's home) defaults to a new temporary directory. As root the files go to
    a ``postgres``-owned directory (module docstring), so any home works, even under ``/root``.

    Raises:
        CatalogUnavailableError: PostgreSQL is not installed (:func:`require_installed`).
        PostgresCommandError: ``initdb``, ``pg_ctl`` or ``createdb`` failed.
    """
    require_installed()
    if root is None:  # a new directory in the world-traversable temporary directory: reachable as it is
        home = files = Path(tempfile.mkdtemp(prefix="lake-pg-"))
    else:
        home, files = Path(root), _files_dir_for_new(Path(root))
    port = free_port()
    server = PostgresServer(files, port, f"postgresql://lake:lakepw@127.0.0.1:{port}/iceberg", home)
    pwfile = files / "pw"
    pwfile.write_text("lakepw\n")
    if server._as_user:
        shutil.chown(files, "postgres")
        shutil.chown(pwfile, "postgres")
    initdb = [str(PG_BIN / "initdb"), "-D", str(files / "data"), "-U", "lake", "--pwfile", str(pwfile)]
    run_command([*server._as_user, *initdb, "-A", "scram-sha-256"])
    server.start()
    createdb = [str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "lake", "iceberg"]
    run_command(createdb, server.log, env={**os.environ, "PGPASSWORD": "lakepw"})
    return server
