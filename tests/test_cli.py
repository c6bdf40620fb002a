"""The ``lake`` command: subcommands, exit codes (0 done, 1 finding, 2 bad input, 3 unreachable),
one-line errors, and the tables.yaml schema (pydantic models, published JSON Schema)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
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
        ({"maintenance": {"max_snapshots": 100}}, "maintenance.max_snapshots must exceed retain_last, got 100 <= 100"),
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
        "LAKE_DEV_HOOKS": "catalog_retry_s=1",
    }


@pytest.mark.parametrize(
    "args", [("status",), ("backfill", "--table", "down"), ("accept-gap", "--table", "down", "--reason", "test")]
)
def test_broker_down_exits_3_with_one_line(offline_env, args):
    done = lake(*args, env=offline_env)
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    line = _outcome_line(done.stderr)
    assert line.startswith("lake: unreachable: ") and offline_env["KAFKA_BOOTSTRAP_SERVERS"] in line


def _outcome_line(stderr: str) -> str:
    """The last stderr line (the outcome); every line before it must be a ``lake: warning:`` line."""
    *warnings, line = stderr.strip().splitlines()
    assert all(w.startswith("lake: warning: ") for w in warnings), stderr
    return line


def test_catalog_down_exits_3_after_warning_of_each_retry(offline_env):
    """Catalog retries (a budget of 3 s) are announced as ``lake: warning:`` lines, then one outcome line."""
    port = devbroker.free_port()
    env = {
        **offline_env,
        "LAKE_CATALOG_URI": f"postgresql://lake:secret@127.0.0.1:{port}/lake",
        "LAKE_DEV_HOOKS": "catalog_retry_s=3",
    }
    done = lake("status", env=env)
    assert done.returncode == 3 and "Traceback" not in done.stderr
    line = _outcome_line(done.stderr)
    assert line.startswith("lake: unreachable: ") and "catalog" in line and "secret" not in done.stderr
    warnings = done.stderr.strip().splitlines()[:-1]
    assert warnings and all("transient catalog error" in w for w in warnings), done.stderr


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
    quiet = lake("status", "--json", env=env)
    assert quiet.returncode == 0, quiet.stderr
    assert json.loads(quiet.stdout)["verdict"] == "OK"
    produce(kafka_config, topic, event_records(range(5)))  # never ingested: lag with no commit ever
    late = lake("status", "--json", env=env)
    assert late.returncode == 1 and json.loads(late.stdout)["lag"] == {"0": 5}
    human = lake("status", env=env)
    assert human.returncode == 1 and f"test.{unique}" in human.stdout and "STOP" in human.stdout

    # accept-gap asks first: refused without a terminal unless --yes, and "n" on a terminal does nothing
    refused = lake("accept-gap", "--table", unique, "--reason", "test", env=env)
    assert refused.returncode == 2 and "--yes" in refused.stderr and "Traceback" not in refused.stderr
    declined = _on_terminal(["accept-gap", "--table", unique, "--reason", "test"], "n\n", env)
    assert declined.returncode == 1 and "[y/N]" in declined.output and "not confirmed" in declined.output


def _on_terminal(args: list[str], answer: str, env: dict[str, str]):
    """``lake ARGS`` with a pseudo-terminal as stdin, stdout and stderr; writes ``answer`` once the
    prompt shows. Returns the process (``returncode``) with ``output`` (all it printed)."""
    import pty
    import select

    master, slave = pty.openpty()
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kafka_iceberg.lake_assets.cli", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=full,
    )
    os.close(slave)
    output, answered = b"", False
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            proc.kill()
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the process closed the terminal
            break
        if not chunk:
            break
        output += chunk
        if not answered and b"[y/N]" in output:
            os.write(master, answer.encode())
            answered = True
    proc.wait(timeout=60)
    os.close(master)
    proc.output = output.decode(errors="replace")
    return proc


def test_version_is_the_installed_distributions():
    from importlib.metadata import version

    done = lake("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"lake (kafka-iceberg-lake) {version('kafka-iceberg-lake')}"


def test_every_subcommand_takes_json(offline_env, tmp_path):
    for name in SUBCOMMANDS:
        assert "--json" in lake(name, "--help").stdout, name
    tables = lake("tables", "--json", env=offline_env)
    assert tables.returncode == 0 and json.loads(tables.stdout)["name"] == "down"
    assert "down" in lake("tables", env=offline_env).stdout
    valid = lake("validate", "--json", env=offline_env)
    assert valid.returncode == 0 and json.loads(valid.stdout) == {
        "file": offline_env["LAKE_TABLES_FILE"],
        "valid": True,
        "tables": ["down"],
    }
    for args in (("status",), ("backfill", "--table", "down"), ("accept-gap", "--table", "down", "--reason", "x")):
        down = lake(*args, "--json", env=offline_env)
        assert down.returncode == 3, down.stderr
        error = json.loads(down.stdout)
        assert error["exit_code"] == 3 and error["error"] == "unreachable", args
    bad = lake("backfill", "--table", "nope", "--json", env=offline_env)
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"] == "bad input"


def test_unexpected_error_exits_1_with_one_line_and_a_log(offline_env, monkeypatch, capsys):
    for k, v in offline_env.items():
        monkeypatch.setenv(k, v)

    def broken(args):
        raise KeyError("a bug")

    monkeypatch.setitem(cli.COMMANDS, "tables", broken)
    assert cli.main(["tables"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("lake: error: KeyError: 'a bug' (traceback in ")
    log = Path(line.rsplit("(traceback in ", 1)[1].rstrip(")"))
    assert log.parent == Path(offline_env["LAKE_HOME"]) / "logs"
    assert "Traceback" in log.read_text() and "raise KeyError" in log.read_text()
    assert cli.main(["tables", "--debug"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "raise KeyError" in err, "--debug prints the traceback itself"

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "tables", interrupted)
    assert cli.main(["tables"]) == 130
    assert capsys.readouterr().err.strip() == "lake: interrupted: interrupted (Ctrl-C)"


def test_ctrl_c_exits_130_without_a_traceback(offline_env):
    """SIGINT while the command waits for an unreachable catalog (it retries in Python)."""
    import signal

    env = {
        **offline_env,
        "LAKE_CATALOG_URI": f"postgresql://lake:secret@127.0.0.1:{devbroker.free_port()}/lake",
        "LAKE_DEV_HOOKS": "catalog_retry_s=120",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "kafka_iceberg.lake_assets.cli", "status"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # wait until it is retrying the catalog (its first retry warning): by then every module it needs is imported,
    # so the SIGINT lands in the retry loop, not in a first import (a fresh clone compiles them as it goes, and an
    # import interrupted there hung the process)
    seen = []
    while not any("retrying" in line for line in seen) and len(seen) < 50:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
    time.sleep(0.3)
    assert proc.poll() is None, (seen, proc.communicate())
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "lake: interrupted: interrupted (Ctrl-C)"


def test_exit_3_only_for_unreachable_components():
    from kafka_iceberg.errors import BrokerUnavailableError, CatalogUnavailableError, ConfigError
    from kafka_iceberg.formats.resolver import RegistryUnavailableError
    from kafka_iceberg.lake_assets.backfill_graphql import WebserverUnavailableError
    from kafka_iceberg.lake_assets.cli_support import exit_code_for

    for unreachable in (
        BrokerUnavailableError("b"),
        CatalogUnavailableError("c"),
        RegistryUnavailableError("r"),
        WebserverUnavailableError("w"),
    ):
        assert exit_code_for(unreachable) == 3, unreachable
    try:
        try:
            raise ConnectionRefusedError("refused")
        except ConnectionRefusedError as cause:
            raise RuntimeError("the catalog query failed") from cause
    except RuntimeError as wrapped:
        assert exit_code_for(wrapped) == 3, "a connection error underneath counts"
    assert exit_code_for(ConfigError("x")) == 2
    assert exit_code_for(KeyError("x")) == exit_code_for(ValueError("x")) == exit_code_for(RuntimeError("x")) == 1
