"""The product/dev-tooling boundary: the packages pyproject installs never import ``devtools``
(the dev broker, dev PostgreSQL, demo data, DuckDB reader and rehearsal), and ``devtools`` is
not among the installed packages."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("kafka_iceberg", "lake_assets", "sensors", "schedules", "resources")
DEV_ONLY = {"devtools", "scripts", "tests"}


def _imported_top_levels(path: Path) -> set[str]:
    """Top-level package names imported anywhere in ``path`` (module-level or inside functions)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_product_packages_never_import_dev_tooling():
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_top_levels(path) & DEV_ONLY)
        for package in PRODUCT
        for path in (ROOT / package).rglob("*.py")
        if _imported_top_levels(path) & DEV_ONLY
    }
    assert offenders == {}


def test_devtools_is_not_installed_with_the_product():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = pyproject["tool"]["setuptools"]["packages"]
    assert set(packages) == set(PRODUCT)


def _imported_modules(path: Path) -> set[str]:
    """Dotted names of the modules ``path`` imports (``from a.b import c`` gives ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_sensors_and_schedules_never_import_asset_modules():
    # shared names come from lake_assets.vocabulary; lake_assets.backfill is the backfill library
    # (no asset definitions, imports only the vocabulary from lake_assets)
    allowed = {"lake_assets.vocabulary", "lake_assets.backfill"}
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in _imported_modules(path) if m.startswith("lake_assets") and m not in allowed)
        for package in ("sensors", "schedules")
        for path in (ROOT / package).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    backfill = {m for m in _imported_modules(ROOT / "lake_assets" / "backfill.py") if m.startswith("lake_assets")}
    assert backfill == {"lake_assets.vocabulary"}


def test_only_the_composition_root_imports_sensors_and_schedules():
    importers = {
        str(path.relative_to(ROOT))
        for package in PRODUCT
        for path in (ROOT / package).rglob("*.py")
        if package not in ("sensors", "schedules")
        and {m.split(".")[0] for m in _imported_modules(path)} & {"sensors", "schedules"}
    }
    assert importers == {"lake_assets/definitions.py"}
