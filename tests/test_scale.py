"""A hundred tables in one deployment: the code location loads them as 100 table assets, and one
tick of the lag sensors over all of them runs against the dev broker.

Timings are printed (``-s`` shows them; docs/deployment.md records them; ``make bench`` prints
them next to their goals with the same code, devtools/bench/scale.py), never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from dagster import AssetKey, SensorResult

from devtools.bench import scale as bench_scale
from kafka_iceberg.declaration.spec import load_table_specs
from tests.helpers import event_records
from tests.spark_cluster import free_port, produce

N_TABLES = bench_scale.N_TABLES
hundred_tables = bench_scale.hundred_tables


def _load_code_location(env: dict[str, str]) -> subprocess.CompletedProcess:
    return bench_scale.load_code_location(env)


def _env(tmp_path: Path, tables: Path, **extra) -> dict[str, str]:
    return {
        **os.environ,
        "LAKE_HOME": str(tmp_path / "lake"),
        "LAKE_TABLES_FILE": str(tables),
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",  # nothing listens: the broker is down
        **extra,
    }


def test_hundred_tables_load_as_hundred_assets(tmp_path):
    tables = hundred_tables(tmp_path / "tables.yaml", "load")
    proc = _load_code_location(_env(tmp_path, tables))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(
        f"\n100-table code location: loaded in {result['seconds']:.2f} s, "
        f"{result['table_assets']} table assets, {result['sensors']} sensors, other assets: {result['other_assets']}"
    )
    assert result["table_assets"] == N_TABLES
    assert result["sensors"] <= 5, "sensors per location, not per table: lake_workers watches them all"
    # a user's own tables file gets none of the demo's assets and jobs
    assert result["other_assets"] == [] and "ingest_all" not in result["jobs"], result


def test_demo_assets_come_with_the_demo_tables_only(tmp_path):
    """The downstream asset and ``ingest_all`` need both nyc.flights and nyc.weather declared."""
    from kafka_iceberg.config.settings import load_settings
    from kafka_iceberg.lake_assets.component import declared_specs
    from kafka_iceberg.lake_assets.definitions import build_definitions

    settings = load_settings({"LAKE_HOME": str(tmp_path)})
    demo = declared_specs(settings)  # the Component instance of kafka_iceberg/defs/nyc/defs.yaml
    derived = AssetKey(["lake", "analytics", "hourly_departure_delay"])
    for specs, expected in [(demo, True), ([s for s in demo if s.identifier != "nyc.weather"], False)]:
        defs = build_definitions(settings, specs)
        assert (derived in defs.resolve_asset_graph().get_all_asset_keys()) is expected
        assert ("ingest_all" in {j.name for j in defs.resolve_all_job_defs()}) is expected


def test_code_location_loads_with_the_catalog_down(tmp_path):
    tables = hundred_tables(tmp_path / "tables.yaml", "down", n=3)
    closed = free_port()
    proc = _load_code_location(
        _env(
            tmp_path,
            tables,
            LAKE_CATALOG_URI=f"postgresql://lake:x@127.0.0.1:{closed}/lake",
            LAKE_DEV_HOOKS="catalog_retry_s=0",
        )
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_one_lag_sensor_tick_over_hundred_tables(settings, broker, kafka_config, tmp_path, unique):
    specs = load_table_specs(hundred_tables(tmp_path / "tables.yaml", unique))
    bench_scale.create_topics(kafka_config, specs)
    for spec in specs[:10]:
        produce(kafka_config, spec.topic, event_records(range(20)))

    seconds, results = bench_scale.lag_tick(settings, specs)
    print(
        f"\nlag sensor tick over {len(specs)} tables: {seconds:.2f} s ({1000 * seconds / len(specs):.0f} ms per table)"
    )
    assert all(isinstance(r, SensorResult) for r in results)
    observed = [r.asset_events[0].metadata for r in results]
    assert len(observed) == N_TABLES
    triggered = [spec.name for spec, r in zip(specs, results) if r.run_requests]
    assert triggered == [s.name for s in specs[:10]], "only the tables with records get a micro-batch"
