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
    assert schedules == set(), "the worker runs maintain and fully check every table by its crons"
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


def _instance(tables: list[dict], defaults: dict | None = None, **lake) -> str:
    attributes = {"defaults": defaults or {}, "tables": tables, **lake}
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
    """The definitions and tables of ``project``'s defs folder, as the code location loads them."""
    from kafka_iceberg.lake_assets.component import component_specs, defs_tree, quiet_components

    monkeypatch.syspath_prepend(str(project))
    for name in [m for m in sys.modules if m.startswith("compproj")]:
        del sys.modules[name]
    tree = defs_tree("compproj.defs")
    specs = component_specs(tree)
    with quiet_components():
        return tree.build_defs(), specs


def test_two_lakes_in_one_code_location_keep_their_own_resources(tmp_path, monkeypatch):
    """Two instances on two Kafka clusters and two catalogs: each brings its resources under its own
    keys, its jobs and sensors; one brings the location's sensors; the location validates."""
    from dagster import Definitions, build_resources

    monkeypatch.delenv("LAKE_TABLES_FILE", raising=False)
    monkeypatch.setenv("LAKE_HOME", str(tmp_path / "lake"))
    monkeypatch.setenv("COMP_TEST_TOPIC", "orders.v2")
    monkeypatch.setenv("WEB_BROKERS", "web-kafka:9092")
    first = _instance(
        [_table("orders", "{{ env.COMP_TEST_TOPIC }}"), _table("refunds", "refunds.v1")],
        defaults={"owners": ["team:payments"], "tags": {"domain": "payments"}},
    )
    web_catalog = f"sqlite:///{tmp_path / 'web' / 'catalog.db'}"
    second = _instance(
        [_table("clicks", "clicks.v1", tags={"domain": "web"})],
        key_prefix="web_",
        kafka_bootstrap_servers="{{ env.WEB_BROKERS }}",
        catalog_name="web",
        catalog_uri=web_catalog,
        warehouse=f"file://{tmp_path / 'web' / 'warehouse'}",
    )
    project = _project(tmp_path / "two", {"payments": first, "web": second})

    defs, specs = _load(project, monkeypatch)
    Definitions.validate_loadable(defs)
    assert sorted(s.name for s in specs) == ["clicks", "orders", "refunds"]
    by_name = {s.name: s for s in specs}
    assert by_name["orders"].topic == "orders.v2"  # {{ env.X }}, resolved by Dagster when the instance loads
    assert by_name["refunds"].owners == ("team:payments",) and by_name["clicks"].owners == ()  # defaults per instance
    keys = defs.resolve_asset_graph().get_all_asset_keys()
    assert {AssetKey(["lake", "comp", n]) for n in ("orders", "refunds", "clicks")} <= keys
    assert AssetKey(["kafka", "orders_v2"]) in keys
    roles = ("kafka", "catalog", "pyspark", "slack", "reader")
    assert set(defs.resources) == {f"{p}_{r}" for p in ("lake", "web") for r in roles}
    assert defs.resources["web_kafka"].bootstrap_servers == "web-kafka:9092"
    assert defs.resources["lake_kafka"].bootstrap_servers == load_settings().kafka_bootstrap_servers
    with build_resources({"c": defs.resources["web_catalog"]}) as built:
        assert built.c.catalog_settings().sqlalchemy_uri == web_catalog
    assert defs.resources["web_pyspark"].spark_config["spark.sql.catalog.web.uri"].endswith("/web/catalog.db")
    repo = defs.get_repository_def()
    required = {n: d.required_resource_keys for n, d in repo.assets_defs_by_key.items() if d.required_resource_keys}
    assert required[AssetKey(["lake", "comp", "clicks"])] >= {"web_kafka", "web_catalog", "web_pyspark"}
    assert required[AssetKey(["lake", "comp", "orders"])] >= {"lake_kafka", "lake_catalog", "lake_pyspark"}
    sensors = {s.name for s in repo.sensor_defs}
    assert {"lake_workers", "lake_retention", "run_liveness", "run_failure_alert_sensor"} <= sensors
    assert {"web_lake_workers", "web_lake_retention"} <= sensors  # the second lake's own
    assert "web_run_failure_alert_sensor" not in sensors and "web_run_liveness" not in sensors
    jobs = {j.name for j in defs.resolve_all_job_defs()}
    assert "ingest_all" not in jobs  # not the demo's tables
    assert jobs >= {"replay", "web_replay", "lake_worker_0", "web_lake_worker_0"}

    # the same table in two instances is refused, naming it; so are two instances of one key prefix
    clash = _project(tmp_path / "clash", {"a": first, "b": _instance([_table("orders", "x")], key_prefix="b_")})
    with pytest.raises(ConfigError, match=r"name must be unique across tables, repeated: \['orders'\]"):
        _load(clash, monkeypatch)
    same = _project(tmp_path / "same", {"a": first, "b": _instance([_table("clicks", "clicks.v1")])})
    with pytest.raises(ConfigError, match=r"key_prefix must differ between instances .*repeated: \['lake_'\]"):
        _load(same, monkeypatch)


def test_two_lakes_with_workers_have_their_own_worker_jobs_and_sensors(tmp_path, monkeypatch):
    """With ``LAKE_WORKERS``, each lake's worker jobs and sensors take its key prefix and its resources."""
    from dagster import Definitions

    from kafka_iceberg.lake_assets.worker import worker_job
    from kafka_iceberg.resources import ResourceKeys

    monkeypatch.delenv("LAKE_TABLES_FILE", raising=False)
    monkeypatch.setenv("LAKE_HOME", str(tmp_path / "lake"))
    monkeypatch.setenv("LAKE_WORKERS", "1")
    first = _instance([_table("orders", "orders.v1")])
    second = _instance([_table("clicks", "clicks.v1")], key_prefix="web_", kafka_bootstrap_servers="web:9092")
    defs, specs = _load(_project(tmp_path / "workers", {"payments": first, "web": second}), monkeypatch)
    Definitions.validate_loadable(defs)
    repo = defs.get_repository_def()
    workers = {s.name: s for s in repo.sensor_defs if s.name.endswith("lake_workers")}
    assert set(workers) == {"lake_workers", "web_lake_workers"}
    assert workers["web_lake_workers"].required_resource_keys == {"web_kafka", "web_catalog"}
    assert [t.job_name for t in workers["web_lake_workers"].targets] == ["web_lake_worker_0"]
    jobs = {j.name: j for j in repo.get_all_jobs() if "worker" in j.name}
    assert set(jobs) == {"lake_worker_0", "web_lake_worker_0"}
    serve = jobs["web_lake_worker_0"].graph.node_named("serve_web_lake_worker_0").definition
    assert serve.required_resource_keys == {"web_kafka", "web_catalog", "web_pyspark", "web_slack"}
    # off SQLite each lake's worker holds a pool of its own, so neither hands over to the other's runs
    pools = {}
    for prefix in ("lake_", "web_"):
        job = worker_job(0, specs, sqlite_catalog=False, crons={}, keys=ResourceKeys(prefix))
        pools[job.name] = job.graph.node_named(f"serve_{job.name}").definition.pool
    assert pools == {"lake_worker_0": "lake/worker/0", "web_lake_worker_0": "lake/worker/web_0"}


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
    env = _env(tmp_path)
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
    assert len(component["assets"]) == 9 and len(component["checks"]) == 12 and component["schedules"] == set()


def _team_project(root: Path) -> Path:
    """A team's project laid out as ``create-dagster project team_proj`` (1.13) lays it out, with the lake
    as a dependency; its package is importable from ``root/src`` (the test's interpreter has the lake)."""
    import dagster

    (root / "src" / "team_proj" / "defs").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""\
            [project]
            name = "team_proj"
            requires-python = ">=3.10,<3.15"
            version = "0.1.0"
            dependencies = ["dagster=={dagster.__version__}", "kafka-iceberg-lake"]

            [build-system]
            requires = ["hatchling"]
            build-backend = "hatchling.build"

            [tool.dg]
            directory_type = "project"

            [tool.dg.project]
            root_module = "team_proj"
            registry_modules = ["team_proj.components.*"]
            """
        )
    )
    for init in ("src/team_proj/__init__.py", "src/team_proj/defs/__init__.py", "tests/__init__.py"):
        (root / init).write_text("")
    (root / "src" / "team_proj" / "definitions.py").write_text(
        textwrap.dedent(
            """\
            from pathlib import Path

            from dagster import definitions, load_from_defs_folder


            @definitions
            def defs():
                return load_from_defs_folder(path_within_project=Path(__file__).parent)
            """
        )
    )
    return root


def test_a_teams_project_scaffolds_the_component_and_loads_what_it_needs(tmp_path):
    """``dg scaffold defs`` of the Component in a team's own project, its starter table uncommented:
    ``dg list defs`` loads the table's assets and checks with the lake's resources, sensors and jobs."""
    from importlib.metadata import entry_points

    registered = entry_points(group="dagster_dg_cli.registry_modules")  # what `dg list components` reads
    assert "kafka_iceberg.lake_assets.component" in {e.value for e in registered}

    project = _team_project(tmp_path / "team_proj")
    env = {k: v for k, v in _env(tmp_path).items() if k not in ("LAKE_TABLES_FILE", "LAKE_DEFS_MODULE", "LAKE_WORKERS")}
    env.update(
        PYTHONPATH=str(project / "src"),
        KAFKA_BOOTSTRAP_SERVERS="kafka.team.example:9092",
        LAKE_CATALOG_URI=f"sqlite:///{tmp_path / 'lake' / 'catalog.db'}",
        LAKE_WAREHOUSE=f"file://{tmp_path / 'lake' / 'warehouse'}",
    )
    out = _dg(["scaffold", "defs", COMPONENT, "ingest"], project, env)
    assert out.returncode == 0, out.stdout + out.stderr
    defs_yaml = project / "src" / "team_proj" / "defs" / "ingest" / "defs.yaml"
    starter = defs_yaml.read_text()
    assert f"type: {COMPONENT}\n" in starter and "  tables: []\n" in starter
    table = [line.replace("  #", "  ", 1) for line in starter.splitlines() if line.startswith(("  #  -", "  #    "))]
    defs_yaml.write_text(starter.replace("  tables: []\n", "  tables:\n" + "\n".join(table) + "\n"))

    out = _dg(["list", "defs", "--json"], project, env)
    assert out.returncode == 0, out.stdout + out.stderr
    listed = json.loads(out.stdout)
    assert {"lake/shop/orders", "kafka/shop_orders"} <= {a["asset_key"] for a in listed["assets"]}
    checks = {c["key"] for c in listed["asset_checks"]}
    assert {f"lake/shop/orders:{c}" for c in ("duplicate_free", "freshness", "quarantine")} <= checks
    resources = {r["name"] for r in listed["resources"]}
    assert resources == {"lake_kafka", "lake_catalog", "lake_pyspark", "lake_slack", "lake_reader"}
    sensors = {s["name"] for s in listed["sensors"]}
    assert {"run_failure_alert_sensor", "run_liveness", "lake_workers", "lake_retention"} <= sensors
    assert "replay" in {j["name"] for j in listed["jobs"]}
