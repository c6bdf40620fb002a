"""The ``lake`` command: subcommands, exit codes (0 done, 1 finding, 2 bad input, 3 unreachable),
one-line errors, and the tables.yaml schema (pydantic models, published JSON Schema)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from devtools.services import devbroker
from kafka_iceberg.declaration.models import json_schema
from kafka_iceberg.declaration.spec import load_table_specs
from kafka_iceberg.errors import ConfigError
from kafka_iceberg.lake_assets import cli
from tests.helpers import spec_dict

ROOT = Path(__file__).resolve().parents[1]
SUBCOMMANDS = ("status", "backfill", "replay", "accept-gap", "validate", "tables")


def lake(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``lake ARGS`` as a process (the entry point is ``kafka_iceberg.lake_assets.cli:main``)."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full.pop("LAKE_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "kafka_iceberg.lake_assets.cli", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_entry_point_and_help_list_every_subcommand():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"lake": "kafka_iceberg.lake_assets.cli:main"}
    done = lake("--help")
    assert done.returncode == 0
    for name in SUBCOMMANDS:
        assert f"    {name}" in done.stdout, name
    assert lake("frobnicate").returncode == 2, "an unknown subcommand is bad input"


def test_published_json_schema_is_current():
    published = json.loads((ROOT / "docs" / "tables.schema.json").read_text())
    assert published == json_schema(), "run: lake validate --json-schema docs/tables.schema.json"
    assert published["$defs"]["TableDecl"]["additionalProperties"] is False
    assert {"owners", "tags", "schema", "lag"} <= set(published["$defs"]["TableDecl"]["properties"])


def _write(tmp_path: Path, tables: list[dict], defaults: dict | None = None) -> Path:
    path = tmp_path / "tables.yaml"
    path.write_text(yaml.safe_dump({"defaults": defaults or {}, "tables": tables}))
    return path


def test_owners_and_tags_per_table_and_in_defaults(tmp_path):
    path = _write(
        tmp_path,
        [spec_dict("a", "t.a", owners=["ana@example.com"], tags={"tier": "gold"}), spec_dict("b", "t.b")],
        defaults={"owners": ["team:platform"], "tags": {"domain": "sales"}},
    )
    a, b = load_table_specs(path)
    assert a.owners == ("ana@example.com",) and dict(a.tags) == {"domain": "sales", "tier": "gold"}
    assert b.owners == ("team:platform",) and dict(b.tags) == {"domain": "sales"}
    done = lake("validate", "--file", str(path))
    assert done.returncode == 0 and "2 tables valid" in done.stdout


@pytest.mark.parametrize(
    "override, message",
    [
        (
            {"maintenance": {"compact": "99 * * * *"}},
            "maintenance.compact: '99 * * * *' is not a valid five-field cron",
        ),
        ({"maintenance": {"expire": "0 3 * *"}}, "maintenance.expire"),
        ({"owners": ["bob"]}, "must be e-mail addresses or team:<name>"),
        ({"tags": {"a b": "c"}}, "tags ['a b=c']"),
        ({"lag": {"window": 1}}, "table bad: lag needs window >= 2, got 1"),
        ({"lag": {"grace": "soon"}}, "lag.grace: 'soon' is not a duration"),
        ({"colour": "blue"}, "table bad: unknown keys ['colour']"),
    ],
)
def test_invalid_declarations_exit_2_with_one_line(tmp_path, override, message):
    path = _write(tmp_path, [spec_dict("bad", "t.bad", **override)])
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[").replace("*", r"\*")):
        load_table_specs(path)
    done = lake("validate", "--file", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("lake: bad input: ") and message in line


def test_unknown_defaults_key_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match=r"defaults has unknown keys \['colour'\]"):
        load_table_specs(_write(tmp_path, [spec_dict("a", "t.a")], defaults={"colour": "blue"}))


@pytest.fixture
def offline_env(tmp_path) -> dict[str, str]:
    """A lake whose broker (a free port nobody listens on) is down; one declared table."""
    tables = _write(tmp_path, [spec_dict("down", "t.down")])
    return {
        "LAKE_HOME": str(tmp_path / "lake"),
        "LAKE_TABLES_FILE": str(tables),
        "DAGSTER_HOME": str(tmp_path / "dh"),
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{devbroker.free_port()}",
        "LAKE_KAFKA_TIMEOUT_S": "2",
        "LAKE_CATALOG_RETRY_S": "1",
    }


@pytest.mark.parametrize(
    "args", [("status",), ("backfill", "--table", "down"), ("accept-gap", "--table", "down", "--reason", "test")]
)
def test_broker_down_exits_3_with_one_line(offline_env, args):
    done = lake(*args, env=offline_env)
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("lake: unreachable: ") and offline_env["KAFKA_BOOTSTRAP_SERVERS"] in line


def test_catalog_down_exits_3(offline_env):
    env = {**offline_env, "LAKE_CATALOG_URI": f"postgresql://lake:secret@127.0.0.1:{devbroker.free_port()}/lake"}
    done = lake("status", env=env)
    assert done.returncode == 3 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("lake: unreachable: ") and "catalog" in line


def test_unknown_table_and_bad_settings_exit_2(offline_env):
    done = lake("backfill", "--table", "nope", env=offline_env)
    assert done.returncode == 2 and "unknown table 'nope'" in done.stderr and "Traceback" not in done.stderr
    done = lake("tables", env={**offline_env, "LAKE_KAFKA_TIMEOUT_S": "soon"})
    assert done.returncode == 2 and done.stderr.startswith("lake: bad input: ")


def test_status_exits_1_when_a_table_lags_past_its_cadence(
    kafka_config, settings, lake_env, topic_factory, unique, tmp_path
):
    from devtools.demo.data import produce
    from tests.helpers import event_records

    topic = topic_factory(unique, partitions=1)
    path = _write(tmp_path, [spec_dict(unique, topic)])
    env = {**lake_env, "LAKE_TABLES_FILE": str(path)}
    assert cli.main is not None
    quiet = lake("status", env=env)
    assert quiet.returncode == 0, quiet.stderr
    assert json.loads(quiet.stdout)["verdict"] == "OK"
    produce(kafka_config, topic, event_records(range(5)))  # never ingested: lag with no commit ever
    late = lake("status", env=env)
    assert late.returncode == 1 and json.loads(late.stdout)["lag"] == {"0": 5}
