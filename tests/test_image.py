"""The user-code image runs as built, checked without a Docker engine (none installs here).

The image tree is built by deploy/build-image.sh, the script deploy/Dockerfile runs, into a
temporary directory that stands in for the image's root: a virtualenv made from the system's
``/usr/bin/python3.11`` is the image's Python (its dependencies are this test venv's site-packages,
through a ``.pth`` file, instead of a download of the runtime lock). Then the chart's code-server
command (``dagster api grpc`` with ``dagsterApiGrpcArgs`` of deploy/helm/values.yaml) starts from
the image's WORKDIR as the image's user (uid 10001, no capabilities) with the settings a pod gets,
and the location it serves is read over gRPC the way the webserver reads it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from devtools.rehearsal.deploy_kit import SYSTEM_PYTHON, build_image_tree
from devtools.services.k8s_standin import as_user, with_default_signals

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
IMAGE_UID = 10001
TABLES = """\
tables:
  - name: orders
    identifier: shop.orders
    topic: shop.orders
    format: {type: json}
    schema:
      - {name: id, type: long, required: true}
"""

pytestmark = pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason="needs the system's python3.11")


def _script_sources() -> list[str]:
    text = (DEPLOY / "build-image.sh").read_text()
    return re.search(r'^SOURCES="([^"]+)"', text, re.M)[1].split()


def test_the_dockerfile_copies_what_the_script_builds_and_runs_the_script():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    copied = {Path(p).name for line in re.findall(r"^COPY (.+)$", dockerfile, re.M) for p in line.split()[:-1]}
    assert set(_script_sources()) <= copied
    assert "sh /tmp/lake-src/deploy/build-image.sh /" in dockerfile
    assert "WORKDIR /opt/lake" in dockerfile and "\nUSER 10001" in dockerfile
    # no source tree is copied into the WORKDIR (it would shadow the installed package)
    assert not re.search(r"^COPY .* (\./|/opt/lake)", dockerfile, re.M)


@pytest.fixture(scope="module")
def image_root():
    """The image tree: deploy/build-image.sh run into a directory uid 10001 can enter."""
    root = Path(tempfile.mkdtemp(prefix="lake-image-", dir="/tmp"))
    # the locked dependencies (and pip) of this test venv stand in for the image's requirements-runtime.lock
    build_image_tree(root, timeout_s=300)
    (root / "etc").mkdir()
    (root / "etc" / "tables.yaml").write_text(TABLES)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _as_image_user(cmd: list[str]) -> list[str]:
    """``cmd`` as a container starts it: every signal at its default, as the image's user when run as root."""
    return with_default_signals(as_user(cmd, IMAGE_UID, IMAGE_UID) if os.geteuid() == 0 else cmd)


def _pod_env(root: Path) -> dict[str, str]:
    """What a code-server pod gets: the image's ENV and the settings a ConfigMap would hold."""
    lake = root / "opt" / "dagster" / "lake"
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(lake),
        "PYTHONDONTWRITEBYTECODE": "1",
        "DAGSTER_HOME": str(root / "opt" / "dagster" / "dagster_home"),
        "LAKE_HOME": str(lake),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9",  # loading connects to no broker
        "LAKE_CATALOG_URI": f"sqlite:///{lake / 'catalog.db'}",
        "LAKE_WAREHOUSE": f"file://{lake / 'warehouse'}",
        "LAKE_TABLES_FILE": str(root / "etc" / "tables.yaml"),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_image_tree_holds_the_installed_package_and_an_empty_workdir(image_root):
    workdir = image_root / "opt" / "lake"
    assert workdir.is_dir() and not any(workdir.iterdir())
    for home in ("dagster_home", "lake"):
        assert (image_root / "opt" / "dagster" / home).stat().st_uid == (
            IMAGE_UID if os.geteuid() == 0 else os.geteuid()
        )
    site = next((image_root / "opt" / "venv" / "lib").glob("python3.*/site-packages"))
    assert (site / "kafka_iceberg" / "lake_assets" / "definitions.py").is_file()


def test_the_charts_code_server_command_serves_the_location_from_the_workdir(image_root):
    from dagster import DagsterInstance
    from dagster._core.remote_origin import GrpcServerCodeLocationOrigin

    values = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
    (deployment,) = values["deployments"]
    port = _free_port()
    python = str(image_root / "opt" / "venv" / "bin" / "python")
    # the dagster-user-deployments chart's container command, with dagsterApiGrpcArgs appended
    cmd = [
        python,
        "-m",
        "dagster",
        "api",
        "grpc",
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        *deployment["dagsterApiGrpcArgs"],
    ]
    log = image_root / "code-server.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            _as_image_user(cmd), cwd=image_root / "opt" / "lake", env=_pod_env(image_root), stdout=out, stderr=out
        )
    try:
        health = ["-m", "dagster", "api", "grpc-health-check", "-p", str(port), "-h", "127.0.0.1"]
        deadline = time.monotonic() + 90
        while True:
            assert server.poll() is None, log.read_text()[-3000:]
            if subprocess.run([sys.executable, *health], capture_output=True).returncode == 0:
                break
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        with DagsterInstance.ephemeral() as instance:
            origin = GrpcServerCodeLocationOrigin(host="127.0.0.1", port=port, location_name="lake")
            with origin.create_location(instance) as location:
                (repo,) = location.get_repositories().values()
                keys = {n.asset_key.to_user_string() for n in repo.get_asset_node_snaps()}
                sensors = {s.name for s in repo.get_sensors()}
        assert "lake/shop/orders" in keys, sorted(keys)
        assert not any(k.startswith("lake/nyc/") for k in keys), "the demo's tables are not served"
        assert sensors, "the location's sensors are served"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_source_tree_in_the_workdir_would_shadow_the_installed_package(image_root, tmp_path):
    """The control: the same interpreter, started from a directory holding the source copy of
    kafka_iceberg/ (what the image's WORKDIR held before), cannot import the location's module."""
    shadowed = tmp_path / "workdir"
    shutil.copytree(ROOT / "kafka_iceberg", shadowed / "kafka_iceberg", ignore=shutil.ignore_patterns("__pycache__"))
    python = str(image_root / "opt" / "venv" / "bin" / "python")
    probe = [python, "-c", "import kafka_iceberg.lake_assets.definitions"]
    out = subprocess.run(probe, cwd=shadowed, env=_pod_env(image_root), capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "No module named 'kafka_iceberg.lake_assets'" in out.stderr, out.stderr[-2000:]


def test_the_installed_package_without_a_catalog_exits_naming_it(image_root, tmp_path):
    """The documented ConfigMap and Secret without the catalog, in the image tree as its user: one line
    naming the catalog setting, a non-zero exit, no SQLite file, no credential printed."""
    from tests.test_k8s import _pod_environment

    env, secrets = _pod_environment(tmp_path, drop=("LAKE_CATALOG_PROPERTIES",))
    lake = image_root / "opt" / "dagster" / "lake"
    env.update(LAKE_HOME=str(lake), HOME=str(lake), DAGSTER_HOME=str(image_root / "opt" / "dagster" / "dagster_home"))
    python = str(image_root / "opt" / "venv" / "bin" / "python")
    out = subprocess.run(
        _as_image_user([python, "-m", "kafka_iceberg.lake_assets.cli", "status"]),
        cwd=image_root / "opt" / "lake",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and out.stderr.count("\n") == 1, out.stderr[-2000:]
    assert "LAKE_CATALOG_PROPERTIES (or LAKE_CATALOG_URI) is not set" in out.stderr
    assert not any(v in out.stdout + out.stderr for v in secrets.values())
    assert not list(lake.rglob("*.db")), "no SQLite catalog appears"
