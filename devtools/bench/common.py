"""Shared helpers of the benchmark (scripts/bench.py and the devtools/bench_*.py parts).

Output formatting, machine facts, producing and reading back flights records, and the
benchmark's private settings and table declarations. Dev tooling: not installed with the product.
"""

from __future__ import annotations

import gc
import os
import platform
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import yaml
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from devtools.demo import data as demo_data
from kafka_iceberg.batch.pipeline import BatchResult, TableWriter
from kafka_iceberg.batch.warm import warm_read_job
from kafka_iceberg.config.settings import CHECKOUT, Settings, load_settings
from kafka_iceberg.declaration.spec import TableSpec, _parse_table
from kafka_iceberg.kafka.admin import KafkaConfig

PARTITIONS = 4
TOPIC = "bench.flights"
WARMUP_TOPIC = "bench.warmup"
COMMITS_TOPIC = "bench.commits"
WARMUP_RECORDS = 2_000
RECEIVE_MAX_BYTES = 2_147_483_647  # librdkafka's maximum; see raw_consume
TOPIC_CONFIG = {"retention.ms": "-1"}  # record timestamps are from 2013
# env vars that would point the benchmark at shared state instead of its fresh LAKE_HOME
_SHARED_STATE_VARS = (
    "LAKE_CATALOG_URI",
    "LAKE_WAREHOUSE",
    "LAKE_CATALOG_NAME",
    "LAKE_TABLES_FILE",
    "KAFKA_CLIENT_CONFIG",
)


# -- output ------------------------------------------------------------------------------
def say(text: str = "") -> None:
    print(text, flush=True)


def section(title: str) -> None:
    say()
    say(f"== {title} " + "=" * max(0, 86 - len(title)))


def settle(idle_cores: float = 0.1, quiet_s: float = 1.5, timeout_s: float = 30.0) -> None:
    """Before a timed figure: wait until the machine has been idle (at most ``idle_cores`` busy, from
    ``/proc/stat``) for ``quiet_s`` seconds, at most ``timeout_s``, and say how long that took.

    Work left from the step before would otherwise share the two cores with the figure, but not with a
    one-core reference pinned beside it: the dev broker (noida-db) rewrites its whole state file for about
    3 s after every write, a produce or an offset commit (a full core with a million flights records held,
    measured on e7635ce), and a JVM that just ran a job compiles and collects in the background."""
    t0 = quiet_since = time.monotonic()
    window = 0.25
    while time.monotonic() - t0 < timeout_s:
        before = _busy_s()
        time.sleep(window)
        now = time.monotonic()
        if _busy_s() - before > idle_cores * window:
            quiet_since = now
        elif now - quiet_since >= quiet_s:
            break
    say(f"(machine idle after {time.monotonic() - t0:.1f} s)")


def _busy_s() -> float:
    """CPU seconds the machine spent busy (not idle, not waiting for I/O) since boot, all cores summed."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("nan")


def fmt_phases(phases: dict[str, float]) -> str:
    return "  ".join(f"{k}={v:.2f}" for k, v in phases.items())


# -- machine facts ---------------------------------------------------------------------
def _cmd_first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        text = (out.stdout or out.stderr).strip().splitlines()
        return text[0] if text else "?"
    except Exception as exc:  # noqa: BLE001 - a fact we could not read is printed, not fatal
        return f"? ({exc})"


def _mem_total_gb() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1e6:.1f} GB"
    except OSError:
        pass
    return "?"


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def print_machine(settings: Settings | None) -> None:
    import confluent_kafka
    import pyiceberg
    import pyspark

    section("machine")
    say(f"nproc                 {_cmd_first_line(['nproc'])}   (os.cpu_count()={os.cpu_count()})")
    say(f"memory                {_mem_total_gb()}")
    say(f"load average          {_load()}   (1/5/15 min, at start; other jobs share this machine)")
    say(f"platform              {platform.platform()}")
    say(f"python                {sys.version.split()[0]} ({sys.executable})")
    say(f"java                  {_cmd_first_line(['java', '-version'])}")
    say(f"pyspark               {pyspark.__version__}")
    say(f"pyiceberg             {pyiceberg.__version__}")
    ck = confluent_kafka.version()
    say(f"confluent-kafka       {ck if isinstance(ck, str) else ck[0]} (librdkafka {confluent_kafka.libversion()[0]})")
    noida = Path(sys.executable).with_name("noida-db")
    say(f"broker                {_cmd_first_line([str(noida), 'version']) if noida.exists() else 'noida-db ?'}")
    if settings is not None:
        say(
            f"Spark master          {settings.spark_master}   (driver memory {settings.spark_driver_memory}, "
            f"LAKE_MAX_RECORDS_PER_TASK={settings.max_records_per_task})"
        )


# -- Kafka helpers -----------------------------------------------------------------------
def flights_records(df, start: int, count: int, byte_counter: list[int] | None = None):
    """Rows ``start .. start+count-1`` of the flights frame repeated cyclically, through
    ``demo_data.to_records``; each row's ``rownames`` is its position + 1, so every copy is distinct."""
    base = len(df)
    pos, end = start, start + count
    while pos < end:
        i = pos % base
        take = min(base - i, end - pos)
        part = df.iloc[i : i + take].copy()
        part["rownames"] = np.arange(pos + 1, pos + take + 1, dtype="int64")
        for key, value, ts in demo_data.to_records("flights", part):
            if byte_counter is not None:
                byte_counter[0] += len(key) + len(value)
            yield key, value, ts
        pos += take


def produce_round_robin(config: KafkaConfig, topic: str, records, partitions: int) -> int:
    """Produce to explicit partitions 0, 1, .., partitions-1, 0, .. (so every partition gets
    the same number of records). Returns the count delivered."""
    errors: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(str(err))

    producer = Producer(config.client_conf(**{"enable.idempotence": True, "linger.ms": 5}))
    n = 0
    for key, value, ts in records:
        while True:
            try:
                producer.produce(
                    topic, key=key, value=value, timestamp=ts, partition=n % partitions, on_delivery=on_delivery
                )
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
    remaining = producer.flush(120)
    if remaining or errors:
        raise RuntimeError(f"producing to {topic}: {remaining} undelivered, errors: {errors[:3]}")
    return n


def raw_consume(config: KafkaConfig, topic: str, partitions: list[int]) -> dict:
    """Reference figure (a): one plain Consumer reads every record of ``topic`` from offset 0
    up to the high watermarks, touching each message's value."""
    client_errors: list[str] = []
    consumer = Consumer(
        config.client_conf(
            **{
                "error_cb": lambda err: client_errors.append(str(err)),
                "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                # the one non-default: noida-db ignores fetch.max.bytes / max.partition.fetch.bytes and can
                # answer a fetch with more than librdkafka's default 100 MB limit (1M records: 104 MB)
                "receive.message.max.bytes": RECEIVE_MAX_BYTES,
            }
        )
    )
    try:
        high = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
        pending = {p for p in partitions if high[p] > 0}
        remaining = sum(high.values())
        records = nbytes = 0
        last_progress = time.monotonic()
        t0 = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        while pending:
            # never ask for more than is left: librdkafka's batch consume returns early only once it
            # has num_messages, so a short tail would otherwise wait out the whole timeout
            msgs = consumer.consume(num_messages=max(1, min(10_000, remaining - records)), timeout=1.0)
            if msgs:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > 30:
                say(
                    f"  WARNING: raw consumer made no progress for 30 s; partitions {sorted(pending)} unfinished; "
                    f"last client error: {client_errors[-1] if client_errors else 'none'}"
                )
                break
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                value = m.value()
                key = m.key()
                records += 1
                nbytes += (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
                p = m.partition()
                if m.offset() + 1 >= high[p]:
                    pending.discard(p)
        seconds = time.perf_counter() - t0
    finally:
        consumer.close()
    return {"records": records, "bytes": nbytes, "seconds": seconds, "high": high}


def read_back(config: KafkaConfig, topic: str, start: dict[int, int], end: dict[int, int]) -> dict[int, list]:
    """Every record with ``start[p] <= offset < end[p]``, per partition in offset order, as
    (offset, timestamp_ms, key, value)."""
    out: dict[int, list] = {p: [] for p in start}
    pending = {p for p in start if end[p] > start[p]}
    if not pending:
        return out
    consumer = Consumer(
        config.client_conf(
            **{
                "receive.message.max.bytes": RECEIVE_MAX_BYTES,
                "group.id": f"bench-readback-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "error",
            }
        )
    )
    try:
        consumer.assign([TopicPartition(topic, p, start[p]) for p in sorted(pending)])
        deadline = time.monotonic() + 120
        while pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading back {topic}: partitions {sorted(pending)} unfinished after 120 s")
            for m in consumer.consume(num_messages=10_000, timeout=1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                p, off = m.partition(), m.offset()
                if p in pending and off < end[p]:
                    out[p].append((off, m.timestamp()[1], m.key(), m.value()))
                if off + 1 >= end[p]:
                    pending.discard(p)
    finally:
        consumer.close()
    return out


# -- lake helpers ------------------------------------------------------------------------
def bench_settings(lake_home: Path, bootstrap: str, catalog_uri: str | None = None) -> Settings:
    """Settings on a fresh LAKE_HOME and the benchmark's broker, with the catalog on ``catalog_uri``
    (default: SQLite in LAKE_HOME). Spark and task-sizing variables from the environment (SPARK_MASTER,
    LAKE_MAX_RECORDS_PER_TASK, LAKE_SPARK_CONF) still apply; catalog location
    variables do not."""
    env = {k: v for k, v in os.environ.items() if k not in _SHARED_STATE_VARS}
    env["LAKE_HOME"] = str(lake_home)
    env["KAFKA_BOOTSTRAP_SERVERS"] = bootstrap
    if catalog_uri:
        env["LAKE_CATALOG_URI"] = catalog_uri
    return load_settings(env=env)


def flights_spec(name: str, identifier: str, topic: str, bound: int) -> TableSpec:
    """The flights declaration of kafka_iceberg/defs/nyc/defs.yaml, re-pointed at a benchmark topic."""
    doc = yaml.safe_load((CHECKOUT / "kafka_iceberg" / "defs" / "nyc" / "defs.yaml").read_text())["attributes"]
    raw = dict(next(t for t in doc["tables"] if t["name"] == "flights"))
    raw.update(
        name=name,
        identifier=identifier,
        topic=topic,
        max_records_per_partition=bound,
        description=f"benchmark table on topic {topic}",
    )
    return _parse_table(raw, doc.get("defaults") or {})


def metadata_json_bytes(table) -> int:
    loc = table.metadata_location
    path = urlparse(loc).path if loc.startswith("file:") else loc
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def timed_batch(writer: TableWriter) -> tuple[float, float, BatchResult, object]:
    """plan() then execute(); returns (plan seconds, execute seconds, result, plan)."""
    gc.collect()
    t0 = time.perf_counter()
    plan = writer.plan()
    t1 = time.perf_counter()
    result = writer.execute(plan, str(uuid.uuid4()))
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, result, plan


def warm_up(spark, settings: Settings, config: KafkaConfig, kafka, catalog, df) -> float:
    """Run a 2,000-record table (its own topic) end to end, then what a worker's ``warm`` op runs when a
    table's next micro-batch is large (:func:`kafka_iceberg.batch.warm.warm_read_job`: the read phase's Spark
    job, which a 2,000-record micro-batch, read by the driver, does not start), so the JVM, Iceberg's classes
    and the Python workers are warm before a timed figure; returns its seconds."""
    t0 = time.perf_counter()
    demo_data.create_topic(config, WARMUP_TOPIC, PARTITIONS, TOPIC_CONFIG)
    demo_data.produce(config, WARMUP_TOPIC, flights_records(df, 0, WARMUP_RECORDS))
    spec = flights_spec("bench_warmup", "bench.warmup", WARMUP_TOPIC, WARMUP_RECORDS)
    writer = TableWriter(spark, settings, spec, kafka, catalog)
    writer.ensure_table()
    writer.recover()
    result = writer.execute(writer.plan(), str(uuid.uuid4()))
    warm_read_job(writer.lake, spec)  # as a worker's warm op on a backlog, cluster master (batch/warm.py)
    seconds = time.perf_counter() - t0
    say(
        f"warm-up: table bench.warmup ({WARMUP_RECORDS:,} records, its own topic) run end to end "
        f"(create, recover, plan, execute) in {seconds:.1f} s: committed={result.committed}, "
        f"records={result.records:,}. JVM, Iceberg classes and Python workers are now warm."
    )
    return seconds
