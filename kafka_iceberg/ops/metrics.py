"""Prometheus metrics of the worker runs, per table. Plain Python (``prometheus_client``), no Dagster.

A worker run (:mod:`kafka_iceberg.lake_assets.worker`) records each micro-batch here and serves the
metrics over HTTP in the Prometheus text format while it serves its tables (:func:`serve`):

==========================================  =========  ==========================================================
name                                        type       what (label ``table``: the identifier, ``nyc.flights``)
==========================================  =========  ==========================================================
``lake_table_offset_lag_records``           gauge      records between the committed offsets and the high
                                                       watermarks, summed over partitions (each watermark poll)
``lake_table_last_commit_timestamp_seconds`` gauge     when the table's last snapshot was committed (seconds
                                                       since epoch)
``lake_table_last_commit_age_seconds``      gauge      seconds since then, computed at scrape time
``lake_table_records_committed_total``      counter    records committed to the table by this process
``lake_table_bytes_committed_total``        counter    bytes of Parquet data files committed by this process
``lake_micro_batch_duration_seconds``       histogram  seconds per micro-batch (wall clock), committed or not
``lake_micro_batch_failures_total``         counter    micro-batches that raised
==========================================  =========  ==========================================================

plus the client's ``process_*`` (resident memory, open files, CPU) and ``python_*`` collectors.
Counters count from the process start; Prometheus' ``rate()`` and ``increase()`` handle the restart of
each worker run.

Port: ``LAKE_METRICS_PORT`` (default :data:`DEFAULT_PORT`, 9464; ``0`` turns the endpoint off). When
the port is taken (another worker process on the same host, a run handing over to its successor),
:func:`serve` takes the next free one of :data:`PORTS_TRIED`, so N worker processes on one host listen
on 9464 .. 9464 + N - 1; in Kubernetes each run's pod has its own IP, and all listen on 9464.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

DEFAULT_PORT = 9464
"""Port of the metrics endpoint unless ``LAKE_METRICS_PORT`` says otherwise."""
PORTS_TRIED = 16
"""Ports tried from the configured one upwards when it is taken (so many worker processes per host)."""
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Upper bounds (seconds) of the micro-batch duration histogram's buckets."""

OFFSET_LAG = Gauge(
    "lake_table_offset_lag_records",
    "Records between the table's committed offsets and the topic's high watermarks, summed over partitions.",
    ["table"],
)
LAST_COMMIT = Gauge(
    "lake_table_last_commit_timestamp_seconds",
    "When the table's last snapshot was committed, seconds since epoch.",
    ["table"],
)
RECORDS = Counter("lake_table_records_committed", "Records committed to the table by this process.", ["table"])
BYTES = Counter(
    "lake_table_bytes_committed", "Bytes of Parquet data files committed to the table by this process.", ["table"]
)
DURATION = Histogram(
    "lake_micro_batch_duration_seconds",
    "Seconds per micro-batch of the table (recover, plan, read, write, commit), committed or not.",
    ["table"],
    buckets=DURATION_BUCKETS,
)
FAILURES = Counter("lake_micro_batch_failures", "Micro-batches of the table that raised.", ["table"])

_last_commit_s: dict[str, float] = {}
_lock = threading.Lock()


class _CommitAge(Collector):
    """``lake_table_last_commit_age_seconds``: seconds since each table's last commit, at scrape time."""

    def collect(self):
        family = GaugeMetricFamily(
            "lake_table_last_commit_age_seconds",
            "Seconds since the table's last snapshot was committed.",
            labels=["table"],
        )
        now = time.time()
        with _lock:
            known = dict(_last_commit_s)
        for table, at in sorted(known.items()):
            family.add_metric([table], max(0.0, now - at))
        yield family


REGISTRY.register(_CommitAge())


def observe_last_commit(table: str, at_s: float) -> None:
    """Set when ``table`` last committed (seconds since epoch; e.g. its snapshot's ``timestamp-ms`` / 1000)."""
    with _lock:
        _last_commit_s[table] = max(at_s, _last_commit_s.get(table, 0.0))
        LAST_COMMIT.labels(table).set(_last_commit_s[table])


def record_commit(table: str, records: int, bytes_committed: int, duration_s: float, at_s: float | None = None) -> None:
    """Count one micro-batch that committed ``records`` records and ``bytes_committed`` bytes of data files
    to ``table`` in ``duration_s`` seconds, at ``at_s`` (seconds since epoch; default now)."""
    RECORDS.labels(table).inc(max(0, records))
    BYTES.labels(table).inc(max(0, bytes_committed))
    DURATION.labels(table).observe(max(0.0, duration_s))
    observe_last_commit(table, time.time() if at_s is None else at_s)


def record_micro_batch(table: str, result: Any, duration_s: float) -> None:
    """Record a finished micro-batch of ``table`` that took ``duration_s`` seconds, from its ``BatchResult``
    (:class:`kafka_iceberg.batch.types.BatchResult`): a commit (``snapshot_id`` set: ``records``,
    ``data_bytes_added``) or only its duration (nothing new to commit)."""
    if getattr(result, "snapshot_id", None) is not None:
        record_commit(table, int(result.records), int(result.data_bytes_added), duration_s)
    else:
        DURATION.labels(table).observe(max(0.0, duration_s))


def metered_batch(run_batch: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap a worker's ``run_batch(spec)`` (``spec.identifier``: the table) so each call is recorded: its
    wall-clock duration and commit (:func:`record_micro_batch`), or its failure (:func:`record_failure`,
    then the exception propagates unchanged). Thread-safe, like the client's metrics."""

    def run(spec: Any) -> Any:
        started = time.monotonic()
        try:
            result = run_batch(spec)
        except Exception:
            record_failure(spec.identifier)
            raise
        record_micro_batch(spec.identifier, result, time.monotonic() - started)
        return result

    return run


def metered_group(run_group: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap a worker's ``run_group(specs)`` (a consistency group's micro-batch; returns identifier -> each
    member's ``BatchResult``) so each member is recorded as :func:`metered_batch` records a table: the
    group's duration and the member's commit, or a failure of every member (the exception propagates)."""

    def run(specs: Any) -> Any:
        started = time.monotonic()
        try:
            results = run_group(specs)
        except Exception:
            for spec in specs:
                record_failure(spec.identifier)
            raise
        for identifier, result in results.items():
            record_micro_batch(identifier, result, time.monotonic() - started)
        return results

    return run


def record_failure(table: str) -> None:
    """Count one micro-batch of ``table`` that raised."""
    FAILURES.labels(table).inc()


def observe_lag(lags: Mapping[str, int]) -> None:
    """Set the offset lag (records) of each table identifier in ``lags``."""
    for table, lag in lags.items():
        OFFSET_LAG.labels(table).set(lag)


def metered_watermarks(
    watermarks: Callable[[list[str]], dict],
    specs: Sequence[Any],
    committed: Mapping[str, Mapping[int, int]],
    states: Mapping[str, Any] | None = None,
) -> Callable[[list[str]], dict]:
    """Wrap a worker's ``watermarks(topics)`` call so each poll also sets the offset lag of the tables
    (``specs``: ``identifier`` and ``topic``) whose topic it returned, against ``committed`` (identifier ->
    partition -> offset; the dict the worker keeps up to date). A missing topic (``None``) sets nothing.
    ``states``: identifier -> the table's :class:`kafka_iceberg.state.IngestState` when the run starts (its
    ``snapshot_timestamp_ms`` sets the table's last commit time)."""
    for table, state in (states or {}).items():
        if getattr(state, "snapshot_timestamp_ms", None):
            observe_last_commit(table, state.snapshot_timestamp_ms / 1000)

    def poll(topics: list[str]) -> dict:
        marks = watermarks(topics)
        lags = {}
        for spec in specs:
            parts = marks.get(spec.topic)
            if parts is not None:
                done = committed.get(spec.identifier, {})
                lags[spec.identifier] = sum(max(0, w.high - done.get(p, w.low)) for p, w in parts.items())
        observe_lag(lags)
        return marks

    return poll


@contextmanager
def serve(port: int = DEFAULT_PORT, addr: str = "0.0.0.0") -> Iterator[int | None]:
    """Serve the metrics on ``addr`` over HTTP (any path; ``/metrics`` by convention) while the block runs.

    Tries ``port`` .. ``port`` + :data:`PORTS_TRIED` - 1 and yields the port it listens on; yields
    ``None`` when ``port`` is 0 (off) or none is free (logged at WARNING: the metrics are not worth
    failing a run). The server stops at the end of the block, so the next run on the host can take it.
    """
    if port <= 0:
        yield None
        return
    server = thread = None
    bound = None
    for candidate in range(port, min(port + PORTS_TRIED, 65536)):
        try:
            server, thread = start_http_server(candidate, addr=addr)
            bound = candidate
            break
        except OSError as e:
            log.debug("metrics port %s is taken: %s", candidate, e)
    if bound is None:
        log.warning("no free metrics port in %s..%s: metrics not served", port, port + PORTS_TRIED - 1)
    try:
        yield bound
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
            thread.join(5)


__all__ = [
    "DEFAULT_PORT",
    "DURATION_BUCKETS",
    "PORTS_TRIED",
    "metered_batch",
    "metered_group",
    "metered_watermarks",
    "observe_lag",
    "observe_last_commit",
    "record_commit",
    "record_failure",
    "record_micro_batch",
    "serve",
]
