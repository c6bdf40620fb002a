"""The shape of the house, read from the code's imports:

- the product packages never import dev tooling (``devtools``, ``scripts``, ``tests``), and dev
  tooling is not installed;
- everything installs under the ``kafka_iceberg`` namespace (the card's ``lake_assets/``,
  ``resources/``, ``sensors/``, ``schedules/`` folders through a package-dir mapping);
- the import graph of the product modules has no cycle, and the core (``kafka_iceberg/``) imports
  nothing of the Dagster layer;
- a project module is imported inside a function only where the import would pull in pyspark,
  with a comment line saying why;
- only ``kafka_iceberg/config/settings.py`` touches the process environment.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "kafka_iceberg"
DAGSTER_LAYER = ("lake_assets", "resources", "sensors", "schedules")
FOLDERS = {"kafka_iceberg": NAMESPACE, **{f: f"{NAMESPACE}.{f}" for f in DAGSTER_LAYER}}
"""Product folder on disk -> its import name."""
PRODUCT = tuple(FOLDERS)
DEV_ONLY = {"devtools", "scripts", "tests"}
HEAVY_ROOTS = {"pyspark", "py4j"}


def _imports(path: Path) -> list[tuple[str, ast.stmt, bool]]:
    """``(dotted name, node, inside a function)`` for every absolute import in ``path``
    (``from a.b import c`` gives ``a.b`` and ``a.b.c``)."""
    tree = ast.parse(path.read_text(), str(path))
    in_function = {
        id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node, id(node) in in_function) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node, id(node) in in_function))
            found += [(f"{node.module}.{a.name}", node, id(node) in in_function) for a in node.names]
    return found


def _imported_top_levels(path: Path) -> set[str]:
    return {name.split(".")[0] for name, _, _ in _imports(path)}


def _imported_modules(path: Path) -> set[str]:
    return {name for name, _, _ in _imports(path)}


def _modules() -> dict[str, Path]:
    """Import name -> file of every product module."""
    mods = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            mods[".".join([package, *parts])] = path
    return mods


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]], set[str]]:
    """Module-level edges, in-function edges (between product modules) and the modules that import
    pyspark at import time (directly or through module-level imports)."""
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    top, inner, spark = {m: set() for m in mods}, {m: set() for m in mods}, set()
    for module, path in mods.items():
        for name, _, in_function in _imports(path):
            if not in_function and name.split(".")[0] in HEAVY_ROOTS:
                spark.add(module)
            target = resolve(name) if name.startswith(NAMESPACE) else None
            if target and target != module:
                (inner if in_function else top)[module].add(target)
    heavy, grew = set(spark), True
    while grew:
        grew = False
        for module, targets in top.items():
            if module not in heavy and targets & heavy:
                heavy.add(module)
                grew = True
    return top, inner, heavy


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycle():
    top, inner, _ = _graph()
    edges = {m: top[m] | inner[m] for m in top}
    assert len(edges) > 60 and sum(map(len, edges.values())) > 150  # the walk found the modules
    assert _cycles(edges) == []
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]  # the check can fail


def test_the_core_imports_nothing_of_the_dagster_layer():
    top, inner, _ = _graph()
    layer = tuple(f"{NAMESPACE}.{f}" for f in DAGSTER_LAYER)
    offenders = {m: sorted(t for t in top[m] | inner[m] if t.startswith(layer)) for m in top if not m.startswith(layer)}
    assert {m: t for m, t in offenders.items() if t} == {}
    core_dagster = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "kafka_iceberg").rglob("*.py")
        if "dagster" in _imported_top_levels(p) or {"dagster_k8s", "dagster_pyspark"} & _imported_top_levels(p)
    }
    assert core_dagster == set()


def test_project_modules_are_imported_in_functions_only_to_keep_pyspark_out():
    """An in-function import of a project module must target a module that imports pyspark at
    import time, from a module that does not, and carry a comment line just above it."""
    _, inner, heavy = _graph()
    mods = _modules()
    wrong = {m: sorted(t for t in targets if t not in heavy or m in heavy) for m, targets in inner.items()}
    assert {m: t for m, t in wrong.items() if t} == {}
    unexplained = []
    for _module, path in mods.items():
        lines = path.read_text().splitlines()
        for name, node, in_function in _imports(path):
            if in_function and name.startswith(NAMESPACE):
                above = lines[node.lineno - 2].strip()
                if not above.startswith("#") and not lines[node.lineno - 2].strip().startswith("from kafka_iceberg"):
                    unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert unexplained == []
    assert "kafka_iceberg.batch.pipeline" in heavy and "kafka_iceberg.declaration.spec" not in heavy


def test_parsing_declarations_does_not_import_pyspark(tmp_path):
    import subprocess

    import yaml

    tables = tmp_path / "tables.yaml"  # the demo's declarations as a tables file
    tables.write_text(
        yaml.safe_dump(yaml.safe_load((ROOT / "kafka_iceberg/defs/nyc/defs.yaml").read_text())["attributes"])
    )
    code = (
        "import sys; from kafka_iceberg.declaration.spec import load_table_specs; "
        "from kafka_iceberg.lake_assets import vocabulary; "
        "load_table_specs(sys.argv[1]); print(sorted(m for m in sys.modules if m.startswith('pyspark')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tables)],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    assert out.stdout.strip() == "[]"


def test_product_packages_never_import_dev_tooling():
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_top_levels(path) & DEV_ONLY)
        for package in PRODUCT
        for path in (ROOT / package).rglob("*.py")
        if _imported_top_levels(path) & DEV_ONLY
    }
    assert offenders == {}


def test_everything_installs_under_the_namespace_and_devtools_is_not_installed():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert {name.split(".")[0] for name in setuptools["packages"]} == {NAMESPACE}
    assert setuptools["package-dir"] == {f"{NAMESPACE}.{f}": f for f in DAGSTER_LAYER}
    listed = set(setuptools["packages"])
    on_disk = {m for m, p in _modules().items() if p.name == "__init__.py"}
    assert on_disk == listed  # every package is installed


def test_nothing_imports_the_dagster_layer_by_its_folder_name():
    """``import sensors`` would work from the checkout and fail when installed."""
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_top_levels(path) & set(DAGSTER_LAYER))
        for folder in (*PRODUCT, "devtools", "scripts", "tests")
        for path in (ROOT / folder).rglob("*.py")
        if _imported_top_levels(path) & set(DAGSTER_LAYER)
    }
    assert offenders == {}


def test_sensors_and_schedules_never_import_asset_modules():
    # shared names come from lake_assets.vocabulary; lake_assets.backfill is the backfill library
    # (no asset definitions, imports only the vocabulary from lake_assets)
    allowed = {
        "kafka_iceberg.lake_assets.vocabulary",
        "kafka_iceberg.lake_assets.backfill",
        "kafka_iceberg.lake_assets.liveness",
    }
    top, inner, _ = _graph()
    offenders = {
        m: sorted(t for t in top[m] | inner[m] if t.startswith("kafka_iceberg.lake_assets") and t not in allowed)
        for m in top
        if m.startswith(("kafka_iceberg.sensors", "kafka_iceberg.schedules"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    backfill = {t for t in top["kafka_iceberg.lake_assets.backfill"] if t.startswith("kafka_iceberg.lake_assets")}
    assert backfill <= {"kafka_iceberg.lake_assets.vocabulary", "kafka_iceberg.lake_assets.dagster_internals"}


def test_only_the_composition_root_imports_sensors_and_schedules():
    top, inner, _ = _graph()
    importers = {
        m
        for m in top
        if not m.startswith(("kafka_iceberg.sensors", "kafka_iceberg.schedules"))
        and any(t.startswith(("kafka_iceberg.sensors", "kafka_iceberg.schedules")) for t in top[m] | inner[m])
    }
    # the Component type, which builds everything of a lake (the code location is its instances)
    assert importers == {"kafka_iceberg.lake_assets.component"}


def test_dagster_internals_are_imported_in_one_module_written_for_this_dagster():
    import dagster

    from kafka_iceberg.lake_assets.dagster_internals import CHECKED, WRITTEN_FOR

    importers = {
        str(path.relative_to(ROOT))
        for package in PRODUCT
        for path in (ROOT / package).rglob("*.py")
        if any(m.startswith("dagster._") for m in _imported_modules(path))
    }
    assert importers == {"lake_assets/dagster_internals.py"}
    # a minor upgrade: re-check lake_assets/dagster_internals.py against the new release, then bump
    assert dagster.__version__.rsplit(".", 1)[0] == WRITTEN_FOR
    assert all(v.rsplit(".", 1)[0] == WRITTEN_FOR for v in CHECKED) and dagster.__version__ in CHECKED


MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _sizes() -> tuple[dict[str, int], dict[str, int]]:
    """Lines per production module, and lines per function (``module:name@line``, decorators and
    docstring included)."""
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
    "kafka_iceberg/config/settings.py",  # the one place: every variable, its default and unit (docs/configuration.md)
}
"""Product modules allowed to touch the process environment. Anything else gets its values passed
down from :mod:`kafka_iceberg.config.settings` (or, for a Dagster secret, names an ``EnvVar``)."""


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
    assert offenders == {}, "read the variable in kafka_iceberg/config/settings.py and pass the value down"
    assert _environment_uses(ROOT / "kafka_iceberg" / "config" / "settings.py"), (
        "the check must see settings.py's reads"
    )
