"""A first run as root in a 0700 home (a container's ``/root``, any ``mktemp -d``): the dev
PostgreSQL of tests and the demo starts there, its binaries are found whatever the PostgreSQL
version, and ``make clean`` (devtools/services/cleanup.py) leaves no demo process running."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from devtools.services import cdc_source, cleanup, devpostgres
from devtools.services import registry as dev_registry
from devtools.services.devbroker import free_port, port_open

ROOT = Path(__file__).resolve().parents[1]


def _processes() -> str:
    return subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout


def _accepts_connections(server: devpostgres.PostgresServer, database: str = "iceberg") -> str:
    done = subprocess.run(
        [str(devpostgres.PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(server.port), "-U", "lake", "-d", database]
        + ["-X", "-A", "-t", "-c", "SELECT current_user || ' ' || current_database()"],
        capture_output=True,
        text=True,
        env={**os.environ, "PGPASSWORD": "lakepw"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def home_0700():
    """A LAKE_HOME inside a ``tempfile.mkdtemp()`` directory (mode 0700, owned by this user)."""
    top = Path(tempfile.mkdtemp(prefix="lake-0700-"))
    assert stat.S_IMODE(top.stat().st_mode) == 0o700
    yield top / "lake"
    cleanup.clean(top / "lake")
    subprocess.run(["rm", "-rf", str(top)], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="the 0700-home case is about root (PostgreSQL runs as postgres)")
def test_postgres_starts_as_root_with_its_home_in_a_0700_directory(home_0700):
    home = home_0700 / "cdc" / "pg"
    server = devpostgres.create(home)
    assert _accepts_connections(server) == "lake iceberg"
    files = devpostgres.files_dir(home)
    assert files != home and files.parent == devpostgres.RELOCATED_PARENT
    assert files.stat().st_uid == __import__("pwd").getpwnam("postgres").pw_uid
    assert str(files / "data") in _processes(), "the postmaster runs with the relocated data directory"

    server.stop()  # a later run (the second make demo) finds it through the home's record
    again = devpostgres.open_existing(home)
    assert again is not None and again.root == files
    again.start()
    assert _accepts_connections(again) == "lake iceberg"

    done = cleanup.clean(home_0700)  # make clean: stopped, relocated files deleted
    assert f"stopped PostgreSQL of {home}" in done and f"deleted {files}" in done and not files.exists()
    assert str(files / "data") not in _processes()


@pytest.mark.skipif(os.geteuid() != 0, reason="the 0700-home case is about root (PostgreSQL runs as postgres)")
def test_cdc_source_database_starts_in_a_0700_home_with_logical_decoding(home_0700):
    db = cdc_source.start_database(home_0700 / "cdc" / "pg")
    try:
        assert cdc_source.run_sql(db, "SHOW wal_level").strip() == "logical"
        assert _accepts_connections(db.server, cdc_source.DATABASE) == f"lake {cdc_source.DATABASE}"
    finally:
        db.stop()
    assert not db.server.root.exists()


def test_binaries_found_without_a_version_in_the_path(tmp_path, monkeypatch):
    for version in ("9.6", "13", "16"):
        for program in ("pg_ctl", "initdb"):
            exe = tmp_path / version / "bin" / program
            exe.parent.mkdir(parents=True, exist_ok=True)
            exe.write_text("#!/bin/sh\n")
    monkeypatch.setattr(devpostgres.shutil, "which", lambda name: None)
    assert devpostgres.find_bin_dir(debian_root=tmp_path) == tmp_path / "16" / "bin", "the newest major version"
    fake_config = tmp_path / "pg_config"
    fake_config.write_text(f"#!/bin/sh\necho {tmp_path / '13' / 'bin'}\n")
    fake_config.chmod(0o755)
    monkeypatch.setattr(devpostgres.shutil, "which", lambda name: str(fake_config) if name == "pg_config" else None)
    assert devpostgres.find_bin_dir(debian_root=tmp_path) == tmp_path / "13" / "bin", "pg_config --bindir first"
    assert (devpostgres.PG_BIN / "pg_ctl").exists(), "this machine's PostgreSQL is found"
    pinned = [
        str(f.relative_to(ROOT))
        for d in ("devtools", "scripts", "tests", "kafka_iceberg", "lake_assets", "resources", "sensors", "schedules")
        for f in (ROOT / d).rglob("*.py")
        if f.name != "test_first_run.py" and "postgresql/1" in f.read_text()
    ]
    assert pinned == [], "PostgreSQL's binaries are found, not assumed at one version's path"


def test_clean_stops_the_registry_and_the_captures_and_spares_other_processes(tmp_path):
    lake_home = tmp_path / "lake"
    port = free_port()
    dev_registry.start(lake_home / "registry", port)
    registry_pid = int((lake_home / "registry" / "registry.pid").read_text())
    capture_pid_file = lake_home / "cdc" / "debezium" / "lake_cdc.pid"
    capture_pid_file.parent.mkdir(parents=True)
    # stands in for the Debezium capture: a process whose command line names its module
    capture = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "devtools.services.cdc_source"])
    capture_pid_file.write_text(f"{capture.pid}\n")
    rehearsal_pid_file = lake_home / "rehearsal" / "debezium-ab12" / "rh_cdc_ab12.pid"  # a killed rehearsal's
    rehearsal_pid_file.parent.mkdir(parents=True)
    rehearsal_capture = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", "devtools.services.cdc_source"]
    )
    rehearsal_pid_file.write_text(f"{rehearsal_capture.pid}\n")
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    stale = lake_home / "cdc" / "debezium" / "old.pid"
    stale.write_text(f"{stranger.pid}\n")  # a pid file whose pid now belongs to another program
    try:
        done = subprocess.run(
            [sys.executable, "-m", "devtools.services.cleanup", str(lake_home)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert capture.wait(timeout=30) is not None
        assert rehearsal_capture.wait(timeout=30) is not None
        deadline = time.monotonic() + 10
        while port_open("127.0.0.1", port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not port_open("127.0.0.1", port), "the stand-in registry no longer listens"
        assert os.waitpid(registry_pid, 0)[0] == registry_pid, "the registry (a child of this test) exited"
        assert f"--data-dir {lake_home / 'registry'}" not in _processes(), "no registry process left"
        assert stranger.poll() is None, "a pid that is not the demo's is left alone"
        assert not capture_pid_file.exists() and not stale.exists() and not rehearsal_pid_file.exists()
    finally:
        for proc in (capture, rehearsal_capture, stranger):
            proc.kill()
            proc.wait()


def test_demo_names_a_missing_prerequisite_in_one_line(tmp_path, monkeypatch):
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py")],
        env={**env, "PATH": str(empty), "LAKE_HOME": str(tmp_path / "lake")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == "demo: Java (17) is not installed, which Spark needs: run `make system-deps`"
    assert not (tmp_path / "lake" / "kafka").exists(), "nothing started"

    import importlib.util

    from kafka_iceberg.config.settings import load_settings

    spec = importlib.util.spec_from_file_location("demo_script", ROOT / "scripts" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    monkeypatch.setattr(devpostgres, "PG_BIN", tmp_path / "no-postgresql" / "bin")
    missing = demo.missing_prerequisite(load_settings(env={"LAKE_HOME": str(tmp_path / "lake")}))
    assert missing.startswith("the CDC demo table needs PostgreSQL") and "make system-deps" in missing
