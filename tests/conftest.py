"""Fixtures: a real Kafka-protocol broker (noida-db), real Spark (local mode) and a real
Iceberg JDBC catalog (SQLite), all under one temporary ``LAKE_HOME`` per test session.

Each test declares its own topic and table (unique names), so tests share the broker,
the Spark session and the catalog without seeing each other's data.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from devtools.demo.data import create_topic
from devtools.services import devbroker, devpostgres
from devtools.services import registry as dev_registry
from kafka_iceberg.batch.pipeline import TableWriter
from kafka_iceberg.catalog.spark import get_spark
from kafka_iceberg.catalog.tables import load_catalog
from kafka_iceberg.config.settings import load_settings
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.errors import CatalogUnavailableError
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata

_names = itertools.count()

# the development defaults (the dev broker, the SQLite catalog under LAKE_HOME, the demo's tables), also
# in the subprocesses the tests start (an installed package outside LAKE_DEV refuses to load without them)
os.environ.setdefault("LAKE_DEV", "1")
# Every JVM the tests start (Spark drivers in this process and in the sinks, runs and servers they start, a
# standalone cluster's daemons) lives for seconds to minutes: C1 alone and the serial collector spend about
# 40% less CPU starting Spark than the tiered JIT and G1 (machine CPU of tests/test_rehearsal_acl.py, 126 s
# against 77 s, bb49983), on a suite that is CPU-bound on 2 cores. The product's JVMs keep the defaults.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


# Modules that take minutes each (Dagster daemons, Spark runs in subprocesses, Debezium, rehearsal scenarios),
# longest first (by the "slowest 15 modules" summary of full make test runs on 2026-11-28): under pytest-xdist
# (make test: -n 2 --dist loadfile --no-loadscope-reorder) they are handed out first, so no worker starts one of
# them while the other has run out of work. Update from that summary.
SLOW_MODULES = (
    "test_rehearsal.py",
    "test_ui_browser.py",
    "test_cdc.py",
    "test_rehearsal_storage.py",
    "test_rehearsal_cdc.py",
    "test_leaks.py",
    "test_write_path.py",
    "test_pools_postgres.py",
    "test_rehearsal_workers.py",
    "test_cli.py",
    "test_rehearsal_acl.py",
    "test_bad_records.py",
    "test_maintenance.py",
    "test_spark_cluster.py",
    "test_rehearsal_dagster.py",
    "test_replay.py",
    "test_s3_warehouse.py",
    "test_dg_dev.py",
    "test_liveness.py",
    "test_component.py",
    "test_compaction_concurrency.py",
    "test_backfill.py",
    "test_worker.py",
    "test_dagster_postgres.py",
    "test_formats_keys.py",
    "test_snapshot_ceiling.py",
)


def pytest_collection_modifyitems(config, items):
    """On a pytest-xdist worker, put the tests of :data:`SLOW_MODULES` first, in that order (a stable sort:
    every worker computes the same order, as xdist requires); a run in one process keeps the file order."""
    if not hasattr(config, "workerinput"):
        return
    rank = {name: i for i, name in enumerate(SLOW_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


_MODULE_S: dict[str, float] = {}
_WORKER_S: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Add each test phase's duration (seconds) to its module's and its xdist worker's totals (on the
    controller under xdist, where every worker's reports arrive)."""
    module = report.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    _MODULE_S[module] = _MODULE_S.get(module, 0.0) + report.duration
    node = getattr(report, "node", None)
    worker = node.gateway.id if node is not None else "main"
    _WORKER_S[worker] = _WORKER_S.get(worker, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """After ``--durations``: the 15 slowest modules and each worker's busy seconds, the figures to order
    :data:`SLOW_MODULES` by (a worker that ends long before the other wastes a core)."""
    if not _MODULE_S or hasattr(terminalreporter.config, "workerinput"):
        return
    slow = sorted(_MODULE_S.items(), key=lambda kv: -kv[1])[:15]
    terminalreporter.write_sep("=", "slowest 15 modules (seconds)")
    terminalreporter.write_line("  ".join(f"{m} {s:.0f}" for m, s in slow))
    terminalreporter.write_line("busy per worker: " + ", ".join(f"{w} {s:.0f} s" for w, s in sorted(_WORKER_S.items())))


@pytest.fixture(scope="session")
def lake_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lake")


@pytest.fixture(scope="session")
def broker(lake_home):
    data_dir = lake_home / "kafka"
    bootstrap = devbroker.start(data_dir, devbroker.free_port())
    yield bootstrap
    devbroker.stop(data_dir)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """The stand-in Schema Registry (devtools/services/registry.py) on a free port, one per test module; its URL."""
    data_dir = tmp_path_factory.mktemp("registry")
    url = dev_registry.start(data_dir, devbroker.free_port())
    yield url
    dev_registry.stop(data_dir)


@pytest.fixture(scope="session")
def postgres_server():
    """One private PostgreSQL server (:mod:`devtools.services.devpostgres`, initdb + start: seconds) for the
    whole session (one per xdist worker); each module or test takes a database of its own on it
    (:func:`tests.helpers.new_database`), so they share the server without seeing each other's data."""
    try:
        server = devpostgres.create()
    except CatalogUnavailableError as exc:
        pytest.fail(str(exc))
    yield server
    server.destroy()


@pytest.fixture(scope="session")
def lake_env(lake_home, broker) -> dict[str, str]:
    """The environment the test settings are read from (for code that calls ``load_settings()``
    itself, such as a code location loaded by Dagster: set these with ``monkeypatch.setenv``)."""
    return {
        "LAKE_HOME": str(lake_home),
        "KAFKA_BOOTSTRAP_SERVERS": broker,
        "SPARK_MASTER": "local[2]",
        "LAKE_SPARK_CONF": json.dumps({"spark.driver.memory": "1g"}),
        "LAKE_DEV_HOOKS": "read_timeout_s=30",
        "LAKE_KAFKA_TIMEOUT_S": "15",
    }


@pytest.fixture(scope="session")
def settings(lake_env):
    return load_settings(env=lake_env)


@pytest.fixture(scope="session")
def spark(settings):
    session = get_spark(settings)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kafka_config(settings) -> KafkaConfig:
    return KafkaConfig(settings.kafka_bootstrap_servers, {}, settings.kafka_timeout_s)


@pytest.fixture(scope="session")
def kafka(kafka_config):
    meta = KafkaMetadata(kafka_config)
    yield meta
    meta.admin = None  # destroy the client before the broker stops, so it does not log reconnects
    gc.collect()


@pytest.fixture()
def catalog(settings):
    return load_catalog(settings.catalog)


@pytest.fixture()
def unique() -> str:
    """A short unique name for this test's topic and table."""
    return f"t{next(_names)}_{uuid.uuid4().hex[:6]}"


@pytest.fixture()
def topic_factory(kafka_config):
    """Create a topic with N partitions and return its name."""

    def make(name: str, partitions: int = 3) -> str:
        topic = f"events.{name}"
        create_topic(kafka_config, topic, partitions, {"retention.ms": "-1"})
        return topic

    return make


@pytest.fixture()
def writer_factory(spark, settings, kafka, catalog):
    def make(spec: TableSpec) -> TableWriter:
        w = TableWriter(spark, settings, spec, kafka, catalog)
        w.ensure_table()
        return w

    return make


class SlackRecorder:
    """What the fake Slack API received, and how it should answer next."""

    def __init__(self, base_url: str):
        self.base_url = base_url  # e.g. http://127.0.0.1:PORT/api/
        self.requests: list[dict] = []  # {"path", "authorization", "body"}
        self.status = 200
        self.reply: object = {"ok": True, "channel": "C1", "ts": "1.0"}
        self.delay_s = 0.0
        self.release = threading.Event()

    @property
    def messages(self) -> list[dict]:
        return [r["body"] for r in self.requests if r["path"] == "/api/chat.postMessage"]


@pytest.fixture
def slack(monkeypatch):
    """A threaded HTTP server on a free 127.0.0.1 port that records chat.postMessage bodies."""
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(var, raising=False)
    recorder: SlackRecorder

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            if "json" in (self.headers.get("Content-Type") or ""):
                body = json.loads(raw)
            else:
                body = {k: v[0] for k, v in parse_qs(raw).items()}
            recorder.requests.append(
                {"path": self.path, "authorization": self.headers.get("Authorization"), "body": body}
            )
            if recorder.delay_s:
                recorder.release.wait(recorder.delay_s)
            if self.path != "/api/chat.postMessage":
                status, reply = 404, {"ok": False, "error": "unknown_method"}
            else:
                status, reply = recorder.status, recorder.reply
            data = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if not isinstance(reply, str) else "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout test)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.block_on_close = False
    recorder = SlackRecorder(f"http://127.0.0.1:{server.server_address[1]}/api/")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield recorder
    recorder.release.set()
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def slack_alerts(slack, monkeypatch):
    """The alert path pointed at the recording server with a token set (``SLACK_BOT_TOKEN``,
    ``SLACK_API_BASE_URL``), so alerts are posted there; returns the recorder."""
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test")
    monkeypatch.setenv("SLACK_API_BASE_URL", slack.base_url)
    return slack
