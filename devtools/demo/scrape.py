"""The demo's Prometheus endpoint: the product's metrics server (:mod:`kafka_iceberg.ops.metrics`) in the demo's
process, fed as a worker run feeds it, and scraped over HTTP as Prometheus would.

The demo ingests with the ``ingest_all`` job in its own process, not with worker runs, so no worker serves
the metrics. ``make demo`` therefore serves them itself (:func:`kafka_iceberg.ops.metrics.serve` on
``LAKE_METRICS_PORT``, default 9464, or the next free port), and after each round sets what a worker's
watermark poll sets: each table's offset lag (:func:`~kafka_iceberg.ops.metrics.observe_lag`) and when its
last snapshot was committed (:func:`~kafka_iceberg.ops.metrics.observe_last_commit`; the age is computed
at scrape time). :func:`scrape` reads the endpoint back and :func:`print_scrape` prints one line per table.
"""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from kafka_iceberg.batch.planning import offset_lag
from kafka_iceberg.catalog.tables import read_state
from kafka_iceberg.ops import metrics

LAG = "lake_table_offset_lag_records"
AGE = "lake_table_last_commit_age_seconds"


def observe(specs, kafka, catalog) -> int:
    """Set each declared table's offset lag (records, summed over partitions) and last commit time in the
    metrics, from its topic's watermarks (``kafka``: :class:`~kafka_iceberg.kafka.admin.KafkaMetadata`) and
    its ingest state in ``catalog``; returns the total lag (records)."""
    lags = {}
    for spec in specs:
        state = read_state(catalog, spec.identifier)
        lags[spec.identifier] = sum(offset_lag(kafka.watermarks(spec.topic), state.offsets).values())
        if state.snapshot_timestamp_ms:
            metrics.observe_last_commit(spec.identifier, state.snapshot_timestamp_ms / 1000)
    metrics.observe_lag(lags)
    return sum(lags.values())


def scrape(port: int, timeout_s: float = 10.0) -> dict[str, dict[str, float]]:
    """GET ``http://127.0.0.1:<port>/metrics`` and return table -> {:data:`LAG`: records, :data:`AGE`: seconds}
    for the tables the endpoint reports. Raises ``OSError`` when the endpoint does not answer."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as response:
        text = response.read().decode()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (LAG, AGE):
            for s in family.samples:
                out.setdefault(s.labels["table"], {})[family.name] = s.value
    return out


def print_scrape(port: int, specs, when: str) -> bool:
    """Scrape the endpoint and print the lag and freshness (seconds since the last commit) of every declared
    table; returns whether every table was reported with both."""
    got = scrape(port)
    print(f"Prometheus scrape of http://127.0.0.1:{port}/metrics {when}:")
    complete = True
    for spec in specs:
        m = got.get(spec.identifier, {})
        complete &= LAG in m and AGE in m
        lag = f"{m[LAG]:,.0f} records" if LAG in m else "missing"
        age = f"{m[AGE]:,.1f} s" if AGE in m else "missing"
        print(f"    {spec.identifier:<28} {LAG} {lag:<16} {AGE} {age}")
    return complete
