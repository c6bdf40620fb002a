"""Prometheus metrics of the worker runs (kafka_iceberg/ops/metrics.py, hooked into lake_assets/worker.py).

The first test serves the client's registry on free ports; the second scrapes a real worker run (real
Spark, the real JDBC catalog, the dev broker, an ephemeral Dagster instance) while it commits micro-batches.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from dagster import DagsterInstance
from prometheus_client.parser import text_string_to_metric_families

from devtools.demo.data import produce
from kafka_iceberg.catalog.tables import load_catalog, read_state
from kafka_iceberg.lake_assets.worker import BUDGET_TAG, worker_job
from kafka_iceberg.ops import metrics
from kafka_iceberg.resources import default_resources
from tests.helpers import event_records, make_spec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


def _samples(text: str, table: str) -> dict[str, float]:
    """name -> value of the samples labelled ``table`` (histogram buckets left out)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("table") == table and not s.name.endswith("_bucket"):
                out[s.name] = s.value
    return out


def test_the_endpoint_serves_each_series_and_the_next_process_takes_a_port_above():
    base = _free_port()
    with metrics.serve(base, addr="127.0.0.1") as first, metrics.serve(base, addr="127.0.0.1") as second:
        assert first == base
        # the next free port above it: base + 1 unless another process on the host took that one meanwhile
        assert base < second < base + metrics.PORTS_TRIED
        metrics.record_commit("m.unit", records=120, bytes_committed=4096, duration_s=0.7, at_s=time.time() - 30)
        metrics.record_commit("m.unit", records=30, bytes_committed=1024, duration_s=1.4)
        metrics.record_failure("m.unit")
        metrics.observe_lag({"m.unit": 17})
        for port in (first, second):  # one registry per process, served on each port
            got = _samples(_scrape(port), "m.unit")
            assert got["lake_table_records_committed_total"] == 150
            assert got["lake_table_bytes_committed_total"] == 5120
            assert got["lake_micro_batch_failures_total"] == 1
            assert got["lake_table_offset_lag_records"] == 17
            assert got["lake_micro_batch_duration_seconds_count"] == 2
            assert got["lake_micro_batch_duration_seconds_sum"] == pytest.approx(2.1)
            assert 0 <= got["lake_table_last_commit_age_seconds"] < 60
            assert got["lake_table_last_commit_timestamp_seconds"] > time.time() - 60
    with pytest.raises(urllib.error.URLError):  # stopped with the block: the port is free for the next run
        _scrape(base)
    with metrics.serve(0) as off:
        assert off is None


def test_a_scrape_during_a_worker_run_shows_each_table_s_lag_freshness_commits_and_failures(
    settings, kafka, kafka_config, unique, topic_factory, monkeypatch
):
    port = _free_port()
    monkeypatch.setenv("LAKE_METRICS_PORT", str(port))
    specs = []
    for i, n in enumerate((160, 1)):
        topic = topic_factory(f"{unique}_{i}", partitions=2)
        produce(kafka_config, topic, event_records(range(n)))
        extra = {"bad_records": {"policy": "fail"}} if i == 1 else {}
        specs.append(make_spec(f"{unique}_{i}", topic, max_records_per_partition=20, **extra))
    produce(kafka_config, specs[1].topic, [(b"x", b"{not json", 1_700_000_000_000)])  # the second table fails
    good, poisoned = (s.identifier for s in specs)

    scrapes: list[str] = []
    stop = threading.Event()

    def scrape_while_running() -> None:
        while not stop.is_set():
            try:
                scrapes.append(_scrape(port))
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not serving yet, or already stopped
            stop.wait(0.2)

    scraper = threading.Thread(target=scrape_while_running, daemon=True)
    scraper.start()
    try:
        run = worker_job(0, specs, sqlite_catalog=True, crons={}).execute_in_process(
            instance=DagsterInstance.ephemeral(),
            resources=default_resources(settings),
            raise_on_error=False,
            # serves until nothing waits; with BUDGET_TAG the check op leaves the test process at its CPU priority
            tags={"dagster/sensor_name": "lake_workers", BUDGET_TAG: "1800"},
        )
    finally:
        stop.set()
        scraper.join(10)
    assert not run.success, "the poisoned table fails the run"
    catalog = load_catalog(settings.catalog)

    seen = [_samples(text, good) for text in scrapes]
    during = [s for s in seen if s.get("lake_table_records_committed_total", 0) > 0]
    assert during, f"no scrape during the run showed a commit of {good} ({len(scrapes)} scrapes)"
    last = during[-1]
    assert 0 < last["lake_table_records_committed_total"] <= 160
    assert last["lake_table_bytes_committed_total"] > 0
    assert last["lake_micro_batch_duration_seconds_count"] >= 1
    assert last["lake_table_offset_lag_records"] >= 0
    assert 0 <= last["lake_table_last_commit_age_seconds"] < 600
    assert any(_samples(text, poisoned).get("lake_table_offset_lag_records", 0) >= 1 for text in scrapes)
    # the registry the endpoint served, read after the run (its last micro-batches may end after the last
    # scrape): every committed record counted once, the poisoned table's one failure
    final = {s.name: s.value for m in metrics.RECORDS.collect() for s in m.samples if s.labels["table"] == good}
    assert final["lake_table_records_committed_total"] == 160 == sum(read_state(catalog, good).offsets.values())
    failed = {s.name: s.value for m in metrics.FAILURES.collect() for s in m.samples if s.labels["table"] == poisoned}
    assert failed["lake_micro_batch_failures_total"] == 1
    with pytest.raises(urllib.error.URLError):
        _scrape(port)  # the serving op stopped the endpoint
