"""The install is reproducible: what the product imports is declared, and the venv is the lock.

* Every third-party module the product packages import (module level or inside a function) belongs
  to a distribution declared in pyproject.toml's ``[project] dependencies``: nothing works only
  because some other dependency happens to pull it in.
* Every pin of requirements.lock (the file ``make install`` installs with ``--require-hashes``)
  equals the version installed in the running interpreter: a venv that drifted from the lock fails.
* uv.lock and the requirements files exported from it agree, and uv.lock was resolved from the
  current pyproject.toml (an edit of the dependencies without ``make lock`` fails).

Fast: reads files and installed metadata only.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# the product's source folders (installed as kafka_iceberg and its namespace; devtools/, scripts/
# and tests/ are dev tooling whose imports the dev extra covers)
PRODUCT_DIRS = ("kafka_iceberg", "lake_assets", "resources", "sensors", "schedules")
LOCKS = ("requirements.lock", "requirements-runtime.lock")


def own_top_level_names() -> set[str]:
    """The project's own import names: its folders and whatever [tool.setuptools] installs."""
    names = set(PRODUCT_DIRS)
    setuptools = PYPROJECT.get("tool", {}).get("setuptools", {})
    packages = setuptools.get("packages", [])
    if isinstance(packages, list):
        names |= {p.split(".")[0] for p in packages}
    names |= {k.split(".")[0] for k in setuptools.get("package-dir", {}) if k}
    return names


def imported_top_level_modules() -> dict[str, set[str]]:
    """Absolute imports anywhere in the product folders: {top-level module: {file, ...}}."""
    found: dict[str, set[str]] = {}
    for folder in PRODUCT_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def declared(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def test_product_folders_are_scanned():
    modules = imported_top_level_modules()
    # the scan sees the product's imports at all (a moved folder would make the next test vacuous)
    assert {"dagster", "pyspark", "pyiceberg", "confluent_kafka"} <= modules.keys(), sorted(modules)


def test_every_third_party_import_is_a_declared_dependency():
    own = own_top_level_names()
    deps = declared(PYPROJECT["project"]["dependencies"])
    # an optional extra (not dev) may serve an optional feature, e.g. [duckdb] for TableSnapshot.to_duckdb
    extras = PYPROJECT["project"]["optional-dependencies"]
    deps |= declared([r for name, reqs in extras.items() if name != "dev" for r in reqs])
    dists_of = md.packages_distributions()
    missing, unknown = [], []
    for module, files in sorted(imported_top_level_modules().items()):
        if module in sys.stdlib_module_names or module in own or module == "__future__":
            continue
        dists = {canonicalize_name(d) for d in dists_of.get(module, [])}
        if not dists:
            unknown.append(f"{module} (imported by {sorted(files)[0]}) is not installed")
        elif not dists & deps:
            # a namespace such as google.* is shared by several distributions: one declared is enough
            missing.append(f"{module} -> {sorted(dists)} (imported by {sorted(files)[0]})")
    assert not unknown, unknown
    assert not missing, f"imported but not in [project] dependencies or a product extra: {missing}"


def read_pins(lock: str) -> dict[str, tuple[str, str | None]]:
    """{name: (version, marker or None)} of an exported requirements file; a name pinned twice
    under different markers (one version per Python) keeps the entry whose marker holds here."""
    pins: dict[str, tuple[str, str | None]] = {}
    for line in (ROOT / lock).read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$", line)
        if not m:
            continue
        name, version, marker = canonicalize_name(m[1]), m[2], m[3]
        if name in pins and pins[name][1] and Marker(pins[name][1]).evaluate():
            continue
        pins[name] = (version, marker)
    assert pins, f"no pins read from {lock}"
    return pins


def applies_here(marker: str | None) -> bool:
    return marker is None or Marker(marker).evaluate()


def test_requirements_lock_pins_every_entry_with_hashes():
    for lock in LOCKS:
        text = (ROOT / lock).read_text()
        entries = [ln for ln in text.splitlines() if re.match(r"^[A-Za-z0-9]", ln)]
        assert entries and all("==" in ln for ln in entries), lock
        # each pin is followed by its hashes: pip install --require-hashes accepts nothing else
        assert text.count("--hash=sha256:") >= len(entries), lock
        assert not re.search(r"^-e |^kafka-iceberg-lake", text, re.M), f"{lock} must not install the project itself"


def test_installed_versions_equal_requirements_lock():
    drifted = []
    for name, (version, marker) in read_pins("requirements.lock").items():
        if not applies_here(marker):
            continue
        try:
            installed = md.version(name)
        except md.PackageNotFoundError:
            installed = None
        if installed != version:
            drifted.append(f"{name}: lock {version}, installed {installed}")
    assert not drifted, "this venv is not the lock (make install reinstalls it): " + "; ".join(drifted)


def uv_lock() -> dict:
    return tomllib.loads((ROOT / "uv.lock").read_text())


def test_uv_lock_and_requirements_locks_agree():
    locked: dict[str, set[str]] = {}
    for package in uv_lock()["package"]:
        locked.setdefault(canonicalize_name(package["name"]), set()).add(package["version"])
    full = read_pins("requirements.lock")
    for lock in LOCKS:
        for name, (version, _marker) in read_pins(lock).items():
            assert version in locked.get(name, set()), f"{lock}: {name}=={version}, uv.lock has {locked.get(name)}"
    # the image's runtime lock is a subset of the full lock, at the same versions
    for name, (version, marker) in read_pins("requirements-runtime.lock").items():
        if applies_here(marker):
            assert full[name][0] == version, name


def requirement_key(name: str, extras, specifier: str, extra: str | None) -> tuple:
    return (canonicalize_name(name), tuple(sorted(extras)), str(SpecifierSet(specifier)), extra)


def test_uv_lock_was_resolved_from_this_pyproject():
    """uv.lock records the requirements it resolved; they must be pyproject.toml's current ones."""
    (project,) = [p for p in uv_lock()["package"] if p["name"] == PYPROJECT["project"]["name"]]
    locked = set()
    for r in project["metadata"]["requires-dist"]:
        m = re.fullmatch(r"extra == '([^']+)'", r.get("marker", ""))
        assert m or "marker" not in r, r
        locked.add(requirement_key(r["name"], r.get("extras", []), r.get("specifier", ""), m and m[1]))
    wanted = {
        requirement_key(q.name, q.extras, str(q.specifier), None)
        for q in map(Requirement, PYPROJECT["project"]["dependencies"])
    }
    for extra, reqs in PYPROJECT["project"].get("optional-dependencies", {}).items():
        wanted |= {requirement_key(q.name, q.extras, str(q.specifier), extra) for q in map(Requirement, reqs)}
    assert wanted == locked, (
        "pyproject.toml's dependencies changed since uv.lock was resolved (run make lock): "
        f"only in pyproject {sorted(wanted - locked)}, only in uv.lock {sorted(locked - wanted)}"
    )


@pytest.mark.parametrize("lock", LOCKS)
def test_uv_is_not_a_dependency(lock):
    assert "uv" not in read_pins(lock)
    assert "uv" not in declared(PYPROJECT["project"]["dependencies"])
