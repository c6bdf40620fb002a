"""A hundred tables in one deployment (issue 13, section 4): the figures of ``make bench``'s
scale section and the measuring code tests/test_scale.py shares.

- :func:`load_code_location`: the code location (``kafka_iceberg.lake_assets.definitions``) on a generated
  declaration of :data:`N_TABLES` tables, loaded in a fresh Python process; seconds from the
  import to the resolved asset graph. Goal: under :data:`LOAD_GOAL_S`.
- :func:`lag_tick`: one tick of every table's lag sensor against a broker (the topics exist, a
  few hold records). Goal: under :data:`TICK_GOAL_S` for 100 tables.

Dev tooling: not installed with the product. Prints figures; never asserts.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from kafka_iceberg.config.settings import CHECKOUT, Settings

N_TABLES = 100
LOAD_GOAL_S = 10.0
"""Goal: seconds to load the code location of :data:`N_TABLES` tables."""
TICK_GOAL_S = 5.0
"""Goal: seconds of one lag-sensor tick over :data:`N_TABLES` tables."""
SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "event_time", "type": "timestamp", "required": True},
]
"""Columns of every generated table."""

LOAD = """
import json, time
t0 = time.perf_counter()
from kafka_iceberg.lake_assets.definitions import defs
graph = defs.resolve_asset_graph()
keys = [k.path for k in graph.get_all_asset_keys()]
sensors = defs.resolve_all_job_defs() and list(defs.sensors or [])
print(json.dumps({"seconds": time.perf_counter() - t0, "table_assets": sum(1 for p in keys if p[:2] == ["lake", "scale"]),
                  "other_assets": sorted("/".join(p) for p in keys if p[0] != "kafka" and p[:2] != ["lake", "scale"]),
                  "sensors": len(sensors), "jobs": sorted(j.name for j in defs.resolve_all_job_defs())}))
"""
"""Run by :func:`load_code_location` in a fresh interpreter: prints one JSON line."""


def hundred_tables(path: Path, prefix: str, n: int = N_TABLES) -> Path:
    """Write a tables file declaring ``n`` tables ``scale.<prefix>_NNN`` on topics
    ``scale.<prefix>.NNN`` (:data:`SCHEMA`, freshness 1 day); returns ``path``."""
    tables = [
        {
            "name": f"{prefix}_{i:03d}",
            "identifier": f"scale.{prefix}_{i:03d}",
            "topic": f"scale.{prefix}.{i:03d}",
            "schema": SCHEMA,
            "partition_by": ["days(event_time)"],
        }
        for i in range(n)
    ]
    path.write_text(yaml.safe_dump({"defaults": {"freshness": {"max_snapshot_age": "1d"}}, "tables": tables}))
    return path


def load_code_location(env: dict[str, str], timeout_s: float = 300) -> subprocess.CompletedProcess:
    """Import ``kafka_iceberg.lake_assets.definitions`` in a fresh interpreter with environment ``env`` (this
    checkout first on ``PYTHONPATH``), running :data:`LOAD`. Its stdout's last line is JSON:
    ``seconds`` (import to resolved asset graph), ``table_assets`` (under ``lake/scale``),
    ``other_assets``, ``sensors``, ``jobs``.

    Raises:
        subprocess.TimeoutExpired: it took longer than ``timeout_s`` seconds.
    """
    env = {**env, "PYTHONPATH": os.pathsep.join([str(CHECKOUT), env.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", LOAD], env=env, cwd=CHECKOUT, capture_output=True, text=True, timeout=timeout_s
    )


def create_topics(kafka_config, specs, partitions: int = 2) -> None:
    """Create every spec's topic (``partitions`` each, ``retention.ms=-1``) in one admin request.

    Raises:
        confluent_kafka.KafkaException: a topic could not be created (including: it exists).
    """
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(kafka_config.client_conf())
    futures = admin.create_topics([NewTopic(s.topic, partitions, 1, config={"retention.ms": "-1"}) for s in specs])
    for fut in futures.values():
        fut.result(timeout=60)


def lag_tick(settings: Settings, specs) -> tuple[float, list]:
    """One tick of each spec's lag sensor (:func:`kafka_iceberg.sensors.lag.lag_sensor`), in sequence, on an
    ephemeral Dagster instance with the code location's kafka, catalog and slack resources from
    ``settings``. Returns (seconds of all the ticks, their ``SensorResult`` s in spec order)."""
    from dagster import DagsterInstance, build_sensor_context

    from kafka_iceberg.resources import default_resources
    from kafka_iceberg.sensors.lag import lag_sensor

    resources = {
        k: v for k, v in default_resources(settings).items() if k in ("lake_kafka", "lake_catalog", "lake_slack")
    }
    instance = DagsterInstance.ephemeral()
    sensors = [lag_sensor(spec) for spec in specs]
    started = time.perf_counter()
    results = [s(build_sensor_context(instance=instance, resources=resources)) for s in sensors]
    return time.perf_counter() - started, results


def run_scale(tmp: Path, settings: Settings, say: Callable[[str], None]) -> dict:
    """The scale section of ``make bench``: the 100-table load (the broker of ``settings`` is not
    contacted by a load) and one lag tick over 100 topics on that broker, 10 of them holding 20
    records. Returns ``{"load_s", "table_assets", "tick_s", "triggered"}`` and prints each figure
    next to its goal."""
    from devtools.bench.common import _SHARED_STATE_VARS
    from devtools.demo import data as demo_data
    from kafka_iceberg.declaration.spec import load_table_specs
    from kafka_iceberg.kafka.admin import KafkaConfig

    tmp.mkdir(parents=True, exist_ok=True)
    tables = hundred_tables(tmp / "tables.yaml", "bench")
    env = {k: v for k, v in os.environ.items() if k not in _SHARED_STATE_VARS}
    env |= {
        "LAKE_HOME": str(tmp / "lake"),
        "LAKE_TABLES_FILE": str(tables),
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
    }
    proc = load_code_location(env)
    if proc.returncode != 0:
        raise RuntimeError(f"the code location did not load: {proc.stderr.strip().splitlines()[-1:]}")
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    say(
        f"code location of {N_TABLES} tables: {loaded['table_assets']} table assets, {loaded['sensors']} sensors, "
        f"loaded in {loaded['seconds']:.2f} s  |  goal < {LOAD_GOAL_S:.0f} s"
    )
    specs = load_table_specs(tables)
    config = KafkaConfig.from_settings(settings)
    create_topics(config, specs)
    now_ms = int(time.time() * 1000)
    for spec in specs[:10]:
        demo_data.produce(
            config,
            spec.topic,
            (
                (
                    str(i).encode(),
                    json.dumps(
                        {"id": i, "name": f"n{i}", "amount": 1.0, "event_time": "2026-01-01T00:00:00Z"}
                    ).encode(),
                    now_ms,
                )
                for i in range(20)
            ),
        )
    dagster_log = logging.getLogger("dagster")
    level = dagster_log.level
    dagster_log.setLevel(logging.WARNING)  # one INFO line per table otherwise
    try:
        tick_s, results = lag_tick(settings, specs)
    finally:
        dagster_log.setLevel(level)
    triggered = sum(1 for r in results if r.run_requests)
    say(
        f"one lag-sensor tick over {len(specs)} tables (dev broker): {tick_s:.2f} s, "
        f"{1000 * tick_s / len(specs):.0f} ms per table, {triggered} tables with records requested a micro-batch  "
        f"|  goal < {TICK_GOAL_S:.0f} s"
    )
    return {
        "load_s": loaded["seconds"],
        "table_assets": loaded["table_assets"],
        "tick_s": tick_s,
        "triggered": triggered,
    }


__all__ = [
    "LOAD_GOAL_S",
    "N_TABLES",
    "SCHEMA",
    "TICK_GOAL_S",
    "create_topics",
    "hundred_tables",
    "lag_tick",
    "load_code_location",
    "run_scale",
]
