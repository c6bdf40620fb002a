"""The product/dev-tooling boundary: the packages pyproject installs never import ``devtools``
(the dev broker, dev PostgreSQL, demo data, DuckDB reader and rehearsal), and ``devtools`` is
not among the installed packages; only ``kafka_iceberg/settings.py`` touches the process environment."""

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
    packages = pyproject["tool"]["setuptools"]["packages"]  # may list subpackages (kafka_iceberg.batch)
    assert {name.split(".")[0] for name in packages} == set(PRODUCT)


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
    allowed = {"lake_assets.vocabulary", "lake_assets.backfill", "lake_assets.liveness"}
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in _imported_modules(path) if m.startswith("lake_assets") and m not in allowed)
        for package in ("sensors", "schedules")
        for path in (ROOT / package).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    backfill = {m for m in _imported_modules(ROOT / "lake_assets" / "backfill.py") if m.startswith("lake_assets")}
    assert backfill == {"lake_assets.vocabulary", "lake_assets.dagster_internals"}


def test_only_the_composition_root_imports_sensors_and_schedules():
    importers = {
        str(path.relative_to(ROOT))
        for package in PRODUCT
        for path in (ROOT / package).rglob("*.py")
        if package not in ("sensors", "schedules")
        and {m.split(".")[0] for m in _imported_modules(path)} & {"sensors", "schedules"}
    }
    assert importers == {"lake_assets/definitions.py"}


def test_dagster_internals_are_imported_in_one_module_written_for_this_dagster():
    import dagster

    from lake_assets.dagster_internals import WRITTEN_FOR

    importers = {
        str(path.relative_to(ROOT))
        for package in PRODUCT
        for path in (ROOT / package).rglob("*.py")
        if any(m.startswith("dagster._") for m in _imported_modules(path))
    }
    assert importers == {"lake_assets/dagster_internals.py"}
    assert dagster.__version__ == WRITTEN_FOR  # an upgrade: re-check lake_assets/dagster_internals.py, then bump


MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _sizes() -> tuple[dict[str, int], dict[str, int]]:
    """Lines per production module, and lines per function (``module:qualname``, decorators included)."""
    modules, functions = {}, {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            text = path.read_text()
            modules[name] = len(text.splitlines())
            for node in ast.walk(ast.parse(text, name)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    functions[f"{name}:{node.name}@{node.lineno}"] = node.end_lineno - first + 1
    return modules, functions


def test_production_modules_and_functions_stay_within_budget():
    """issue 8's budgets: no production module over 400 lines, no function over 60."""
    modules, functions = _sizes()
    assert len(modules) > 40 and len(functions) > 300  # the walk found the packages
    assert {m: n for m, n in modules.items() if n > MAX_MODULE_LINES} == {}
    assert {f: n for f, n in functions.items() if n > MAX_FUNCTION_LINES} == {}
ENV_ACCESS = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}
"""The ``os`` names that read or write the process environment."""

ENV_READERS = {
    "kafka_iceberg/settings.py",  # the one place: every variable, its default and unit (docs/configuration.md)
}
"""Product modules allowed to touch the process environment. Anything else gets its values passed
down from :mod:`kafka_iceberg.settings` (or, for a Dagster secret, names an ``EnvVar``)."""


def _environment_uses(path: Path) -> list[str]:
    """``os.environ``/``os.getenv``/... (or ``from os import environ``) in ``path``, as ``line: name``."""
    uses = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in ENV_ACCESS and getattr(node.value, "id", None) == "os":
            uses.append(f"{node.lineno}: os.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            uses += [f"{node.lineno}: from os import {a.name}" for a in node.names if a.name in ENV_ACCESS]
    return uses


def test_only_settings_reads_the_environment():
    offenders = {
        str(path.relative_to(ROOT)): uses
        for package in PRODUCT
        for path in (ROOT / package).rglob("*.py")
        if (uses := _environment_uses(path)) and str(path.relative_to(ROOT)) not in ENV_READERS
    }
    assert offenders == {}, "read the variable in kafka_iceberg/settings.py and pass the value down"
    assert _environment_uses(ROOT / "kafka_iceberg" / "settings.py"), "the check must see settings.py's reads"
