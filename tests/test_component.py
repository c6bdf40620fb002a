"""The table declarations as a Dagster Component (``KafkaIcebergTables``): what the ``dg`` CLI sees
in the checkout, what it reports for a broken declaration, and several instances in one project.

The ``dg`` CLI runs in a subprocess from the checkout (or from a project made in ``tmp_path``), as a
user runs it; loading definitions opens no connection, so no broker or catalog is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey

from kafka_iceberg.config.settings import CHECKOUT, load_settings
from kafka_iceberg.errors import ConfigError
from tests.helpers import EVENT_SCHEMA

DG = str(Path(sys.executable).with_name("dg"))
DEMO_DEFS = CHECKOUT / "kafka_iceberg" / "defs" / "nyc" / "defs.yaml"
COMPONENT = "kafka_iceberg.lake_assets.component.KafkaIcebergTables"


def _env(tmp_path: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LAKE_TABLES_FILE"}
    (tmp_path / "dagster").mkdir(exist_ok=True)
    return {**env, "LAKE_HOME": str(tmp_path / "lake"), "DAGSTER_HOME": str(tmp_path / "dagster"), **more}


def _dg(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([DG, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_dg_list_defs_lists_every_table_asset_check_sensor_and_schedule(tmp_path):
    from kafka_iceberg.lake_assets.component import declared_specs

    env = _env(tmp_path)
    out = _dg(["list", "defs", "--json"], CHECKOUT, env)
    assert out.returncode == 0, out.stdout + out.stderr
    listed = json.loads(out.stdout)
    assets = {a["asset_key"] for a in listed["assets"]}
    sources = {a["asset_key"]: a.get("source") or "" for a in listed["assets"]}
    checks = {c["key"] for c in listed["asset_checks"]}
    sensors = {s["name"] for s in listed["sensors"]}
    schedules = {s["name"] for s in listed["schedules"]}

    specs = declared_specs(load_settings(env))
    assert sorted(s.identifier for s in specs) == ["nyc.flights", "nyc.plane_days", "nyc.planes", "nyc.weather"]
    for spec in specs:
        namespace, table = spec.identifier.split(".")
        assert f"lake/{namespace}/{table}" in assets
        assert sources[f"lake/{namespace}/{table}"].startswith("kafka_iceberg/defs/nyc/defs.yaml")  # the Component
        assert {f"lake/{namespace}/{table}:{c}" for c in ("duplicate_free", "freshness", "quarantine")} <= checks
        assert f"duplicate_free_full_{spec.name}_schedule" in schedules  # the worker runs do the maintenance
    # the per-location definitions, once: the demo's downstream asset and the shared sensors
    assert "lake/analytics/hourly_departure_delay" in assets
    assert {"lake_workers", "lake_retention", "run_liveness", "run_failure_alert_sensor"} <= sensors


def _project(root: Path, instances: dict[str, str]) -> Path:
    """A dg project in ``root`` whose defs folder holds one ``defs.yaml`` per entry of ``instances``
    (folder name -> file text); its package ``compproj`` is importable from ``root``."""
    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [project]
            name = "compproj"
            version = "0"

            [tool.dg]
            directory_type = "project"

            [tool.dg.project]
            root_module = "compproj"
            defs_module = "compproj.defs"
            """
        )
    )
    for folder, text in instances.items():
        (root / "compproj" / "defs" / folder).mkdir(parents=True)
        (root / "compproj" / "defs" / folder / "defs.yaml").write_text(text)
    (root / "compproj" / "__init__.py").write_text("")
    return root


def _instance(tables: list[dict], defaults: dict | None = None) -> str:
    attributes = {"defaults": defaults or {}, "tables": tables}
    return yaml.safe_dump({"type": COMPONENT, "attributes": attributes}, sort_keys=False)


def _table(name: str, topic: str, **more) -> dict:
    return {"name": name, "identifier": f"comp.{name}", "topic": topic, "schema": EVENT_SCHEMA, **more}


def test_dg_check_yaml_reports_a_bad_declaration_with_its_line(tmp_path):
    """The demo's defs.yaml copied into a project of its own, then broken: a typo'd key in the first
    table, and a count that is not a number in the second."""
    text = DEMO_DEFS.read_text()
    assert text.count("      freshness:\n") == 4 and text.count("      max_records_per_partition: 50000\n") == 2
    broken = text.replace("      freshness:\n", "      freshnes:\n", 1)  # flights
    broken = broken.replace("      max_records_per_partition: 50000\n", "      max_records_per_partition: lots\n")
    lines = broken.splitlines()
    typo = lines.index("      freshnes:") + 1
    not_a_number = [i + 1 for i, line in enumerate(lines) if line == "      max_records_per_partition: lots"]
    project = _project(tmp_path / "proj", {"nyc": broken})
    env = _env(tmp_path, PYTHONPATH=str(project))

    out = _dg(["check", "yaml"], project, env)
    report = out.stdout + out.stderr
    assert out.returncode != 0, report
    assert f"nyc/defs.yaml:{typo} - {COMPONENT} attributes.tables.0.freshnes" in report, report
    assert "'freshnes' was unexpected" in report
    for line, entry in zip(not_a_number, (0, 1)):
        assert f"nyc/defs.yaml:{line} - {COMPONENT} attributes.tables.{entry}.max_records_per_partition" in report

    (project / "compproj" / "defs" / "nyc" / "defs.yaml").write_text(text)
    fixed = _dg(["check", "yaml"], project, env)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "All component YAML validated successfully" in fixed.stdout


def _load(project: Path, monkeypatch):
    """The definitions and tables of ``project``'s defs folder, as the code location merges them."""
    from dagster import Definitions

    from kafka_iceberg.lake_assets.component import component_specs, defs_tree, quiet_components
    from kafka_iceberg.lake_assets.definitions import location_definitions

    monkeypatch.syspath_prepend(str(project))
    for name in [m for m in sys.modules if m.startswith("compproj")]:
        del sys.modules[name]
    tree = defs_tree("compproj.defs")
    specs = component_specs(tree)
    with quiet_components():
        tables = tree.build_defs()
    return Definitions.merge(tables, location_definitions(load_settings(), specs)), specs


def test_two_instances_in_one_project_give_the_union_of_their_tables(tmp_path, monkeypatch):
    monkeypatch.delenv("LAKE_TABLES_FILE", raising=False)
    monkeypatch.setenv("LAKE_HOME", str(tmp_path / "lake"))
    monkeypatch.setenv("COMP_TEST_TOPIC", "orders.v2")
    first = _instance(
        [_table("orders", "{{ env.COMP_TEST_TOPIC }}"), _table("refunds", "refunds.v1")],
        defaults={"owners": ["team:payments"], "tags": {"domain": "payments"}},
    )
    second = _instance([_table("clicks", "clicks.v1", tags={"domain": "web"})])
    project = _project(tmp_path / "two", {"payments": first, "web": second})

    defs, specs = _load(project, monkeypatch)
    assert sorted(s.name for s in specs) == ["clicks", "orders", "refunds"]
    by_name = {s.name: s for s in specs}
    assert by_name["orders"].topic == "orders.v2"  # {{ env.X }}, resolved by Dagster when the instance loads
    assert by_name["refunds"].owners == ("team:payments",) and by_name["clicks"].owners == ()  # defaults per instance
    keys = defs.resolve_asset_graph().get_all_asset_keys()
    assert {AssetKey(["lake", "comp", n]) for n in ("orders", "refunds", "clicks")} <= keys
    assert AssetKey(["kafka", "orders_v2"]) in keys
    sensors = {s.name for s in defs.get_repository_def().sensor_defs}
    assert {"lake_workers", "lake_retention", "run_liveness", "run_failure_alert_sensor"} <= sensors
    assert "ingest_all" not in {j.name for j in defs.resolve_all_job_defs()}  # not the demo's tables
    assert {j.name for j in defs.resolve_all_job_defs()} >= {"replay", "lake_worker_0"}

    # the same table in two instances is refused, naming it
    clash = _project(tmp_path / "clash", {"a": first, "b": _instance([_table("orders", "other.topic")])})
    with pytest.raises(ConfigError, match=r"name must be unique across tables, repeated: \['orders'\]"):
        _load(clash, monkeypatch)


def test_the_code_location_loads_the_defs_folder_or_a_tables_file(tmp_path):
    """Without ``LAKE_TABLES_FILE`` the code location is the defs folder's instances; with it, the file's
    tables (the defs folder is then not loaded)."""
    from kafka_iceberg.lake_assets.definitions import load_definitions

    _, specs = load_definitions(load_settings({"LAKE_HOME": str(tmp_path)}))
    assert {s.identifier for s in specs} == {"nyc.flights", "nyc.weather", "nyc.plane_days", "nyc.planes"}

    tables = tmp_path / "tables.yaml"
    tables.write_text(yaml.safe_dump({"tables": [_table("solo", "solo.topic")]}))
    defs, specs = load_definitions(load_settings({"LAKE_HOME": str(tmp_path), "LAKE_TABLES_FILE": str(tables)}))
    assert [s.identifier for s in specs] == ["comp.solo"]
    assert AssetKey(["lake", "nyc", "flights"]) not in defs.resolve_asset_graph().get_all_asset_keys()


def test_lake_defs_module_names_a_teams_own_defs_folder(tmp_path, monkeypatch):
    """``LAKE_DEFS_MODULE``: the code location is the instances of that importable defs folder, whose
    code references point at its ``defs.yaml``; a module that cannot be imported is a ConfigError."""
    from kafka_iceberg.lake_assets.definitions import load_definitions

    project = _project(tmp_path / "own", {"web": _instance([_table("clicks", "clicks.v1")])})
    monkeypatch.syspath_prepend(str(project))
    for name in [m for m in sys.modules if m.startswith("compproj")]:
        del sys.modules[name]
    env = {"LAKE_HOME": str(tmp_path / "lake"), "LAKE_DEFS_MODULE": "compproj.defs"}
    defs, specs = load_definitions(load_settings(env))
    assert [s.identifier for s in specs] == ["comp.clicks"]
    node = defs.resolve_asset_graph().get(AssetKey(["lake", "comp", "clicks"]))
    references = node.metadata["dagster/code_references"].code_references
    assert str(project / "compproj" / "defs" / "web" / "defs.yaml") in {r.file_path for r in references}, references
    with pytest.raises(ConfigError, match="LAKE_DEFS_MODULE 'compproj.nope' cannot be imported"):
        load_definitions(load_settings({**env, "LAKE_DEFS_MODULE": "compproj.nope"}))


def test_a_table_invalid_beyond_its_field_types_is_named_with_its_file(tmp_path, monkeypatch):
    """``partition_by`` on a column the table does not have: the models accept the field, parsing the
    table refuses it; the error names the file, the table and the column."""
    from kafka_iceberg.lake_assets.component import declaration_error

    monkeypatch.setenv("LAKE_HOME", str(tmp_path / "lake"))
    bad = _instance([_table("orders", "orders.v1", partition_by=["days(nope)"])])
    project = _project(tmp_path / "bad", {"payments": bad})
    with pytest.raises(Exception) as raised:
        _load(project, monkeypatch)
    message = declaration_error(raised.value)
    assert message.startswith(str(project / "compproj" / "defs" / "payments" / "defs.yaml"))
    assert message.endswith("table orders: partition_by 'days(nope)' refers to unknown column 'nope'")


def test_lake_validate_checks_the_component_instances(tmp_path):
    env = {k: v for k, v in _env(tmp_path).items() if k != "LAKE_DEBUG"}
    done = subprocess.run(
        [sys.executable, "-m", "kafka_iceberg.lake_assets.cli", "validate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "kafka_iceberg.defs: 4 tables valid: flights, weather, plane_days, planes" in done.stdout


def _names(defs) -> dict[str, set[str]]:
    repo = defs.get_repository_def()
    graph = defs.resolve_asset_graph()
    return {
        "assets": {k.to_user_string() for k in graph.get_all_asset_keys()},
        "checks": {f"{k.asset_key.to_user_string()}:{k.name}" for k in graph.asset_check_keys},
        "sensors": {s.name for s in repo.sensor_defs},
        "schedules": {s.name for s in repo.schedule_defs},
        "jobs": {j.name for j in repo.get_all_jobs()},
        "resources": set(defs.resources or {}),
    }


def test_the_component_builds_what_the_same_declarations_build_as_a_tables_file(tmp_path):
    """The demo's attributes saved as a tables file: the same specs, and the same assets, checks,
    sensors, schedules, jobs and resources, as the Component instance (Dagster's templating changes
    nothing in them)."""
    from kafka_iceberg.declaration.spec import load_table_specs
    from kafka_iceberg.lake_assets.definitions import load_definitions

    tables = tmp_path / "tables.yaml"
    tables.write_text(yaml.safe_dump(yaml.safe_load(DEMO_DEFS.read_text())["attributes"]))
    from_component, specs = load_definitions(load_settings({"LAKE_HOME": str(tmp_path)}))
    from_file, file_specs = load_definitions(
        load_settings({"LAKE_HOME": str(tmp_path), "LAKE_TABLES_FILE": str(tables)})
    )
    assert specs == file_specs == load_table_specs(tables)
    component, file = _names(from_component), _names(from_file)
    assert component == file
    assert len(component["assets"]) == 9 and len(component["checks"]) == 12 and len(component["schedules"]) == 4
