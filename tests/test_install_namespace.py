"""The install lands under one namespace: the wheel of the project holds no top-level package but
``kafka_iceberg`` (the card's ``lake_assets/``, ``resources/``, ``sensors/``, ``schedules/`` folders are
installed as ``kafka_iceberg.*``), and a second project built the same way, under another name,
installs beside it into one site-packages without a file in common. Builds real wheels (setuptools)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _wheel(project: Path, out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(project)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("*.whl")
    return wheel


def _top_levels(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {name.split("/")[0] for name in z.namelist() if not name.split("/")[0].endswith(".dist-info")}


def _second_project(tmp: Path) -> Path:
    """A copy of the project's packaging under another name: distribution ``other-lake``, namespace
    ``other_lake``, with Dagster-layer folders of the same generic names."""
    other = tmp / "other"
    for folder in ("lake_assets", "resources", "sensors", "schedules"):
        (other / folder).mkdir(parents=True)
        (other / folder / "__init__.py").write_text(f'"""{folder} of the other project."""\n')
    (other / "other_lake").mkdir()
    (other / "other_lake" / "__init__.py").write_text("")
    mapping = "\n".join(f'"other_lake.{f}" = "{f}"' for f in ("lake_assets", "resources", "sensors", "schedules"))
    (other / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "other-lake"\nversion = "0.1.0"\n'
        '[tool.setuptools]\npackages = ["other_lake", '
        + ", ".join(f'"other_lake.{f}"' for f in ("lake_assets", "resources", "sensors", "schedules"))
        + "]\n[tool.setuptools.package-dir]\n"
        + mapping
        + "\n"
    )
    return other


def test_the_wheel_has_one_top_level_package_and_a_second_project_installs_beside_it(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".lake", ".git", "*.egg-info", "build"))
    ours = _wheel(source, tmp_path / "wheels")
    assert _top_levels(ours) == {"kafka_iceberg"}
    with zipfile.ZipFile(ours) as z:
        names = set(z.namelist())
    assert {"kafka_iceberg/lake_assets/definitions.py", "kafka_iceberg/sensors/__init__.py"} <= names
    assert "kafka_iceberg/defs/nyc/defs.yaml" in names, "the Component's declarations ship in the wheel"
    other = _wheel(_second_project(tmp_path), tmp_path / "other-wheels")
    assert _top_levels(other) == {"other_lake"}
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(ours), str(other)],
        check=True,
        capture_output=True,
    )
    installed = {p.name for p in site.iterdir() if not p.name.endswith(".dist-info")}
    assert installed - {"bin"} == {"kafka_iceberg", "other_lake"}  # bin: the lake command
    probe = "import kafka_iceberg.lake_assets.vocabulary, other_lake.sensors; print('both')"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin"},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.stdout.strip() == "both", out.stderr[-2000:]
