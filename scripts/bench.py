"""Throughput and commit-latency benchmark of the Kafka -> Iceberg write path.

Run by ``make bench`` (``BENCH_ARGS="--records 200000"`` to pass flags)::

    .venv/bin/python scripts/bench.py [--records N] [--skip-snapshots] [--snapshot-levels 10,100,1000]
                                      [--commit-batch 1000] [--keep]

Everything runs against fresh, private state: its own noida-db dev broker on a free port,
and its own ``LAKE_HOME`` (SQLite catalog + warehouse), both under ``/tmp/bench-*``, removed
at the end unless ``--keep``. It prints figures; it never asserts. See docs/benchmark.md.

(a) Reference: N nycflights13 flights records (the real rows repeated, each copy with its
    own ``rownames``) are produced to a fresh 4-partition topic, then read back by one
    plain confluent-kafka Consumer in this process: records/s and MB/s (1 MB = 1e6 bytes
    of key + value).
(b) End to end: after a Spark warm-up (session start plus one tiny table run end to end),
    one micro-batch takes all N records: ``TableWriter.plan()`` through ``execute()``
    returning with the snapshot published on ``main``. Records/s, MB/s, the phase
    seconds of ``BatchResult.phase_seconds``, and (b)/(a) in records/s.
(c) Commit time versus snapshot count: a table is grown to 10, 100 and 1,000 snapshots
    with pyiceberg appends (``Table.add_files``) that carry the same ``kafka.*`` summary
    the write path writes, over records really produced to its topic, so the committed
    offsets are always where the next micro-batch starts; at each size one real
    micro-batch of ``--commit-batch`` records is timed (plan, execute, publish_s).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import yaml
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

# the dev tools (devtools/) are not installed: import them, and this checkout's packages, from the
# repository root (python puts scripts/, not the checkout, on sys.path)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools import demo_data, devbroker  # noqa: E402
from kafka_iceberg.catalog import get_spark, load_catalog, metadata_view  # noqa: E402
from kafka_iceberg.kafka_client import KafkaConfig, KafkaMetadata  # noqa: E402
from kafka_iceberg.pipeline import BatchResult, TableWriter  # noqa: E402
from kafka_iceberg.planning import split_ranges  # noqa: E402
from kafka_iceberg.settings import CHECKOUT, Settings, load_settings  # noqa: E402
from kafka_iceberg.spec import TableSpec, _parse_table  # noqa: E402
from kafka_iceberg.state import ingest_summary, state_at  # noqa: E402

PARTITIONS = 4
TOPIC = "bench.flights"
WARMUP_TOPIC = "bench.warmup"
COMMITS_TOPIC = "bench.commits"
WARMUP_RECORDS = 2_000
RECEIVE_MAX_BYTES = 2_147_483_647  # librdkafka's maximum; see raw_consume
TOPIC_CONFIG = {"retention.ms": "-1"}  # record timestamps are from 2013
# env vars that would point the benchmark at shared state instead of its fresh LAKE_HOME
_SHARED_STATE_VARS = ("LAKE_CATALOG_URI", "LAKE_WAREHOUSE", "LAKE_CATALOG_NAME", "LAKE_TABLES_FILE", "KAFKA_CLIENT_CONFIG")


# -- output ------------------------------------------------------------------------------
def say(text: str = "") -> None:
    print(text, flush=True)


def section(title: str) -> None:
    say()
    say(f"== {title} " + "=" * max(0, 86 - len(title)))


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
        say(f"Spark master          {settings.spark_master}   (driver memory {settings.spark_driver_memory}, "
            f"LAKE_MAX_RECORDS_PER_TASK={settings.max_records_per_task})")


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
                producer.produce(topic, key=key, value=value, timestamp=ts, partition=n % partitions,
                                 on_delivery=on_delivery)
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
    consumer = Consumer(config.client_conf(**{
        "error_cb": lambda err: client_errors.append(str(err)),
        "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        # the one non-default: noida-db ignores fetch.max.bytes / max.partition.fetch.bytes and can
        # answer a fetch with more than librdkafka's default 100 MB limit (1M records: 104 MB)
        "receive.message.max.bytes": RECEIVE_MAX_BYTES,
    }))
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
                say(f"  WARNING: raw consumer made no progress for 30 s; partitions {sorted(pending)} unfinished; "
                    f"last client error: {client_errors[-1] if client_errors else 'none'}")
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
    consumer = Consumer(config.client_conf(**{
        "receive.message.max.bytes": RECEIVE_MAX_BYTES,
        "group.id": f"bench-readback-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "auto.offset.reset": "error",
    }))
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
def bench_settings(lake_home: Path, bootstrap: str) -> Settings:
    """Settings on a fresh LAKE_HOME and the benchmark's broker. Spark and task-sizing
    variables from the environment (SPARK_MASTER, LAKE_SPARK_DRIVER_MEMORY,
    LAKE_MAX_RECORDS_PER_TASK, LAKE_SPARK_CONF) still apply; catalog location variables do not."""
    env = {k: v for k, v in os.environ.items() if k not in _SHARED_STATE_VARS}
    env["LAKE_HOME"] = str(lake_home)
    env["KAFKA_BOOTSTRAP_SERVERS"] = bootstrap
    return load_settings(env=env)


def flights_spec(name: str, identifier: str, topic: str, bound: int) -> TableSpec:
    """The flights declaration of lake_assets/tables.yaml, re-pointed at a benchmark topic."""
    doc = yaml.safe_load((CHECKOUT / "lake_assets" / "tables.yaml").read_text())
    raw = dict(next(t for t in doc["tables"] if t["name"] == "flights"))
    raw.update(name=name, identifier=identifier, topic=topic, max_records_per_partition=bound,
               description=f"benchmark table on topic {topic}")
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


def _plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_list(t):
        return pa.list_(_plain_field(t.value_field))
    if pa.types.is_large_list(t):
        return pa.large_list(_plain_field(t.value_field))
    if pa.types.is_struct(t):
        return pa.struct([_plain_field(f) for f in t])
    return t


def _plain_field(f: pa.Field) -> pa.Field:
    return pa.field(f.name, _plain_type(f.type), f.nullable)  # same field, without its field-id metadata


def filler_rows(recs: list[tuple[int, tuple]], topic: str, spec: TableSpec) -> list[dict]:
    """Table rows for Kafka records, as the write path would write them.

    ``recs`` are (partition, (offset, timestamp_ms, key, value))."""
    out = []
    for p, (offset, ts_ms, key, value) in recs:
        data = json.loads(value)
        row = {}
        for col in spec.columns:
            v = data.get(col.name)
            if v is not None:
                if col.type == "timestamp":
                    v = datetime.fromisoformat(str(v).replace("Z", "+00:00"))
                elif col.type in ("double", "float"):
                    v = float(v)
            row[col.name] = v
        row.update({
            "_kafka_topic": topic,
            "_kafka_partition": p,
            "_kafka_offset": offset,
            "_kafka_timestamp": datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc),
            "_kafka_key": key,
            "_kafka_headers": None,
        })
        out.append(row)
    return out


def append_filler(table, rows: list[dict], summary: dict[str, str], schema: pa.Schema, data_dir: Path) -> None:
    """One pyiceberg append (one snapshot) of ``rows``, carrying ``summary``.

    ``Table.append`` would compute the months(time_hour) partition with pyiceberg-core, which is
    not installed; so the rows are written by pyarrow to one Parquet file per month under the
    table's data directory and committed with ``Table.add_files`` (the same append snapshot
    producer, so the same manifest handling)."""
    import pyarrow.parquet as pq

    by_month: dict[int, list[dict]] = {}
    for row in rows:
        th = row["time_hour"]
        by_month.setdefault((th.year - 1970) * 12 + th.month - 1, []).append(row)
    paths = []
    for month, month_rows in sorted(by_month.items()):
        path = data_dir / f"filler-{uuid.uuid4().hex}.parquet"
        pq.write_table(pa.Table.from_pylist(month_rows, schema=schema), path, compression="zstd")
        paths.append(f"file://{path}")
    table.add_files(paths, snapshot_properties=summary, check_duplicate_files=False)


@contextmanager
def cheap_metadata_copies():
    """Make pyiceberg appends to a table with many snapshots affordable, while growing fillers.

    pyiceberg 0.12's ``update_table_metadata`` ends with a deep copy of the whole table metadata,
    and ``Transaction.table_metadata`` calls it on every access (about 20 times per append), so
    one append to a table with ~1,000 snapshots costs seconds and the growth is O(snapshots^2).
    The metadata models are frozen (pydantic ``frozen=True``) and every update builds new
    objects with ``model_copy(update=...)``, so the same function without that final deep copy
    returns equal metadata. Only the filler growth runs under this patch; the timed
    micro-batches run the write path unchanged."""
    import pyiceberg.catalog as catalog_module
    import pyiceberg.table as table_module
    import pyiceberg.table.update as update_module
    from pyiceberg.utils.datetime import datetime_to_millis

    original = update_module.update_table_metadata

    def update_table_metadata(base_metadata, updates, enforce_validation=False, metadata_location=None):
        if enforce_validation:
            return original(base_metadata, updates, enforce_validation, metadata_location)
        context = update_module._TableMetadataUpdateContext()
        new_metadata = base_metadata
        for update in updates:
            new_metadata = update_module._apply_table_update(update, new_metadata, context)
        if context.has_changes():
            if metadata_location:
                new_metadata = update_module._update_table_metadata_log(
                    new_metadata, metadata_location, base_metadata.last_updated_ms)
            if base_metadata.last_updated_ms == new_metadata.last_updated_ms:
                new_metadata = new_metadata.model_copy(
                    update={"last_updated_ms": datetime_to_millis(datetime.now().astimezone())})
        new_metadata.spec().check_compatible(new_metadata.schema())
        new_metadata.sort_order().check_compatible(new_metadata.schema())
        return new_metadata  # the original returns new_metadata.model_copy(deep=True) here

    modules = (update_module, table_module, catalog_module)
    for module in modules:
        module.update_table_metadata = update_table_metadata
    try:
        yield
    finally:
        for module in modules:
            module.update_table_metadata = original


def grow_snapshots(catalog, spec: TableSpec, config: KafkaConfig, kafka: KafkaMetadata, df,
                   target: int) -> int:
    """Append pyiceberg snapshots until the table has ``target`` snapshots. Each filler snapshot
    holds one freshly produced record per partition, written as the write path would write
    it, and carries the ingest summary the write path would write for it (offsets advanced,
    max timestamps carried forward). Returns the snapshots added."""
    table = catalog.load_table(spec.identifier)
    need = target - len(table.metadata.snapshots)
    if need <= 0:
        return 0
    partitions = kafka.partitions(spec.topic)
    view = metadata_view(table)
    state = state_at(view.snapshots, view.main)
    before = kafka.watermarks(spec.topic, partitions)
    offsets = {p: state.offsets.get(p, before[p].low) for p in partitions}
    first_row = sum(w.high for w in before.values())  # rows produced so far = next row position
    produce_round_robin(config, spec.topic, flights_records(df, first_row, need * len(partitions)), len(partitions))
    after = kafka.watermarks(spec.topic, partitions)
    records = read_back(config, spec.topic, offsets, {p: after[p].high for p in partitions})
    max_ts = dict(state.max_timestamps)
    schema = pa.schema([_plain_field(f) for f in table.schema().as_arrow()])  # Parquet without field ids
    data_dir = Path(urlparse(table.location()).path) / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    with cheap_metadata_copies():
        _append_fillers(table, spec, partitions, records, offsets, max_ts, need, schema, data_dir)
    return need


def _append_fillers(table, spec, partitions, records, offsets, max_ts, need, schema, data_dir) -> None:
    for i in range(need):
        rows, batch = [], {}
        for p in partitions:
            if i < len(records[p]):
                rec = records[p][i]
                rows.append((p, rec))
                batch[p] = (offsets[p], rec[0] + 1)
                offsets[p] = rec[0] + 1
                max_ts[p] = max(max_ts.get(p, rec[1]), rec[1])
        summary = ingest_summary(topic=spec.topic, offsets=offsets, batch=batch, max_timestamps=max_ts,
                                 commit_id=str(uuid.uuid4()), records=len(rows))
        append_filler(table, filler_rows(rows, spec.topic, spec), summary, schema, data_dir)


# -- the three figures -------------------------------------------------------------------
def part_a(config: KafkaConfig, kafka: KafkaMetadata, df, n: int) -> dict:
    section(f"(a) reference: produce and raw-consume {n:,} flights records")
    say(f"flights rows in nycflights13: {len(df):,}; repeated cyclically to {n:,} records, "
        f"each copy with its own rownames")
    demo_data.create_topic(config, TOPIC, PARTITIONS, TOPIC_CONFIG)
    produced_bytes = [0]
    t0 = time.perf_counter()
    produced = demo_data.produce(config, TOPIC, flights_records(df, 0, n, produced_bytes))
    produce_s = time.perf_counter() - t0
    wm = kafka.watermarks(TOPIC)
    say(f"topic {TOPIC}: {PARTITIONS} partitions, retention.ms=-1; high watermarks "
        f"{ {p: w.high for p, w in wm.items()} } (sum {sum(w.high for w in wm.values()):,})")
    say(f"produce (demo_data.produce: idempotent, lz4, linger 20 ms): {produced:,} records, "
        f"{produced_bytes[0] / 1e6:.1f} MB key+value in {produce_s:.1f} s = {rate(produced, produce_s):,.0f} records/s "
        "(informational)")
    first = next(flights_records(df, 0, 1))
    if first[2] < 946_684_800_000:  # 2000-01-01 in ms
        say(f"  NOTE: demo_data.to_records gave record timestamp {first[2]} for time_hour 2013-01-01T10:00Z "
            f"= {datetime.fromtimestamp(first[2] / 1000, tz=timezone.utc):%Y-%m-%d %H:%M} UTC: not ms since epoch "
            "(a library bug; it does not change the throughput figures)")
    load_before = _load()
    res = raw_consume(config, TOPIC, sorted(wm))
    res["produce_s"] = produce_s
    res["produced"] = produced
    rps, mbps = rate(res["records"], res["seconds"]), rate(res["bytes"], res["seconds"]) / 1e6
    say("raw consume (1 plain Consumer, assign from 0, consume(num_messages=10000), touch key and value;\n"
        "             receive.message.max.bytes raised, see docs/benchmark.md):")
    say(f"  {res['records']:,} records, {res['bytes'] / 1e6:.1f} MB key+value in {res['seconds']:.2f} s")
    say(f"  => {rps:,.0f} records/s   {mbps:,.1f} MB/s   (load average before: {load_before})")
    if res["records"] != n:
        say(f"  WARNING: consumed {res['records']:,} records, expected {n:,}")
    res["rps"], res["mbps"] = rps, mbps
    return res


def warm_up(spark, settings: Settings, config: KafkaConfig, kafka: KafkaMetadata, catalog, df) -> float:
    t0 = time.perf_counter()
    demo_data.create_topic(config, WARMUP_TOPIC, PARTITIONS, TOPIC_CONFIG)
    demo_data.produce(config, WARMUP_TOPIC, flights_records(df, 0, WARMUP_RECORDS))
    spec = flights_spec("bench_warmup", "bench.warmup", WARMUP_TOPIC, WARMUP_RECORDS)
    writer = TableWriter(spark, settings, spec, kafka, catalog)
    writer.ensure_table()
    writer.recover()
    result = writer.execute(writer.plan(), str(uuid.uuid4()))
    seconds = time.perf_counter() - t0
    say(f"warm-up: table bench.warmup ({WARMUP_RECORDS:,} records, its own topic) run end to end "
        f"(create, recover, plan, execute) in {seconds:.1f} s: committed={result.committed}, "
        f"records={result.records:,}. JVM, Iceberg classes and Python workers are now warm.")
    return seconds


def part_b(spark, settings: Settings, kafka: KafkaMetadata, catalog, n: int) -> dict:
    section(f"(b) end-to-end materialization: one micro-batch of {n:,} records")
    spec = flights_spec("bench_flights", "bench.flights", TOPIC, max(n, 1))
    writer = TableWriter(spark, settings, spec, kafka, catalog)
    writer.ensure_table()
    writer.recover()
    say(f"table bench.flights (flights schema, partitioned by months(time_hour)), "
        f"max_records_per_partition={spec.max_records_per_partition:,}; created before timing")
    load_before = _load()
    plan_s, exec_s, result, plan = timed_batch(writer)
    total = plan_s + exec_s
    planned = sum(r.size for r in plan.ranges)
    rps, mbps = rate(result.records, total), rate(result.kafka_bytes, total) / 1e6
    tasks = len(split_ranges(plan.ranges, settings.max_records_per_task))
    say(f"planned {planned:,} offsets in {len(plan.ranges)} ranges = {tasks} Spark read tasks of <= "
        f"{settings.max_records_per_task:,} offsets (LAKE_MAX_RECORDS_PER_TASK)")
    say(f"committed={result.committed}  snapshot {result.snapshot_id}  records {result.records:,}  "
        f"key+value {result.kafka_bytes / 1e6:.1f} MB  data files {result.data_files_added}  "
        f"parquet {result.data_bytes_added / 1e6:.1f} MB")
    say(f"plan() {plan_s:.2f} s + execute() {exec_s:.2f} s = {total:.2f} s")
    say(f"  => {rps:,.0f} records/s   {mbps:,.1f} MB/s   (plan() through execute() returning; "
        f"load average before: {load_before})")
    phases = dict(result.phase_seconds)
    other = exec_s - sum(phases.values())
    say(f"execute() phases (s): {fmt_phases(phases)}  other={other:.2f}")
    say("  (read_s: Kafka -> Spark, JSON parse and classification against the table schema, persisted and "
        "counted; write_s: Parquet + branch commit (+ dead-letter rows, if any); publish_s: fast-forward main; "
        "other: metadata loads and watermarks)")
    snap_summary = catalog.load_table(spec.identifier).current_snapshot().summary
    total_records = int(snap_summary.additional_properties.get("total-records", -1)) if snap_summary else -1
    say(f"check: table total-records {total_records:,} (expected {n:,}): "
        f"{'OK' if total_records == n and result.records == n else 'MISMATCH'}")
    return {"plan_s": plan_s, "exec_s": exec_s, "total_s": total, "records": result.records,
            "bytes": result.kafka_bytes, "rps": rps, "mbps": mbps, "phases": phases}


def part_c(spark, settings: Settings, config: KafkaConfig, kafka: KafkaMetadata, catalog, df,
           levels: list[int], batch_records: int) -> list[dict]:
    section(f"(c) commit time versus snapshot count ({batch_records:,}-record micro-batches)")
    demo_data.create_topic(config, COMMITS_TOPIC, PARTITIONS, TOPIC_CONFIG)
    spec = flights_spec("bench_commits", "bench.commits", COMMITS_TOPIC, 10_000_000)
    writer = TableWriter(spark, settings, spec, kafka, catalog)
    writer.ensure_table()
    table = catalog.load_table(spec.identifier)
    # Iceberg Java (Spark) merges manifests on append by default; pyiceberg only with this
    # property, so setting it keeps the filler manifests as Spark would have left them.
    with table.transaction() as tx:
        tx.set_properties({"commit.manifest-merge.enabled": "true"})
    say(f"table {spec.identifier} on its own topic {COMMITS_TOPIC}. Filler snapshots: one pyiceberg append each\n"
        "(Table.add_files of a Parquet file written by pyarrow) of 1 record per Kafka partition, records really\n"
        "produced to the topic, with the kafka.* summary the write path writes (ingest_summary: offsets advanced,\n"
        "max timestamps carried forward), so the committed offsets stay where the next micro-batch starts.")
    rows = []
    for level in levels:
        t0 = time.perf_counter()
        added = grow_snapshots(catalog, spec, config, kafka, df, level)
        fill_s = time.perf_counter() - t0
        table = catalog.load_table(spec.identifier)
        before = len(table.metadata.snapshots)
        meta_before = metadata_json_bytes(table)
        view = metadata_view(table)
        state = state_at(view.snapshots, view.main)
        high = {p: w.high for p, w in kafka.watermarks(COMMITS_TOPIC).items()}
        consistent = state.offsets == high
        demo_data.produce(config, COMMITS_TOPIC, flights_records(df, sum(high.values()), batch_records))
        plan_s, exec_s, result, plan = timed_batch(writer)
        started_at_state = plan.start_offsets == state.offsets
        after_table = catalog.load_table(spec.identifier)
        in_table = int(after_table.current_snapshot().summary.additional_properties.get("total-records", -1))
        in_topic = sum(w.high - w.low for w in kafka.watermarks(COMMITS_TOPIC).values())
        row = {
            "snapshots": before, "plan_s": plan_s, "exec_s": exec_s,
            "publish_s": result.phase_seconds.get("publish_s", float("nan")),
            "write_s": result.phase_seconds.get("write_s", float("nan")),
            "meta_bytes": meta_before, "meta_after": metadata_json_bytes(after_table),
            "snapshots_after": len(after_table.metadata.snapshots), "records": result.records,
        }
        rows.append(row)
        say(f"{before:>5,} snapshots ({added} filler appends in {fill_s:.1f} s; committed offsets == high watermarks: "
            f"{'yes' if consistent else 'NO'}): timed micro-batch of {result.records:,} records")
        say(f"      plan {plan_s:.2f} s, execute {exec_s:.2f} s [{fmt_phases(result.phase_seconds)}]")
        say(f"      check: rows in table (total-records) {in_table:,} = records in topic {in_topic:,}: "
            f"{'OK' if in_table == in_topic else 'MISMATCH'}; plan started at the committed offsets: "
            f"{'yes' if started_at_state else 'NO'}; snapshots now {row['snapshots_after']:,}")
        if result.records != batch_records:
            say(f"      WARNING: the batch read {result.records} records, expected {batch_records}")
    say()
    say("snapshots before | plan s | execute s | publish s | write s | metadata.json bytes before -> after")
    say("-----------------+--------+-----------+-----------+---------+-------------------------------------")
    for r in rows:
        say(f"{r['snapshots']:>16,} | {r['plan_s']:>6.2f} | {r['exec_s']:>9.2f} | {r['publish_s']:>9.2f} | "
            f"{r['write_s']:>7.2f} | {r['meta_bytes']:>12,} -> {r['meta_after']:,}")
    return rows


# -- main --------------------------------------------------------------------------------
def run(args, tmp: Path, summary: dict) -> None:
    """Everything that talks to the broker; the broker itself is started and stopped by main()."""
    n = args.records
    settings = summary["settings"]
    print_machine(settings)
    say(f"dev broker            noida-db on {settings.kafka_bootstrap_servers}, data in {tmp / 'kafka'}")
    say(f"LAKE_HOME             {settings.lake_home} (fresh SQLite catalog {settings.catalog.jdbc_uri})")
    config = KafkaConfig.from_settings(settings)
    kafka = KafkaMetadata(config)
    df = demo_data.load_frame("flights")

    summary["a"] = part_a(config, kafka, df, n)

    section("Spark warm-up (not timed in (b))")
    t0 = time.perf_counter()
    spark = summary["spark"] = get_spark(settings)
    spark_s = time.perf_counter() - t0
    sc = spark.sparkContext
    say(f"SparkSession {spark.version}: master {sc.master}, default parallelism {sc.defaultParallelism}, "
        f"driver memory {spark.conf.get('spark.driver.memory')}, started in {spark_s:.1f} s")
    catalog = load_catalog(settings.catalog)
    summary["warmup_s"] = warm_up(spark, settings, config, kafka, catalog, df)

    summary["b"] = part_b(spark, settings, kafka, catalog, n)
    ratio = rate(summary["b"]["rps"], summary["a"]["rps"])
    summary["ratio"] = ratio
    say(f"(b)/(a) records/s: {ratio:.3f}  ({summary['b']['rps']:,.0f} / {summary['a']['rps']:,.0f})")

    if not args.skip_snapshots:
        summary["c"] = part_c(spark, settings, config, kafka, catalog, df, args.levels, args.commit_batch)

    section("(d) upsert: a 10% update / 2% delete micro-batch of change events (cdc_bench)")
    from devtools import cdc_bench

    d = summary["d"] = cdc_bench.upsert_throughput(spark, settings.catalog.name, min(n, 200_000))
    say(f"table of {d['rows']:,} rows loaded by {d['load_changes_per_s']:,} changes/s; then {d['changes']:,} changes "
        f"({d['records_read']:,} records with tombstones) in {d['change_s']:.2f} s: {d['changes_per_s']:,} changes/s, "
        f"{d['delete_files']} delete files")


def print_summary(args, summary: dict, started: float) -> None:
    section("summary")
    settings = summary.get("settings")
    say(f"records N                      {args.records:,}")
    if "a" in summary:
        a = summary["a"]
        say(f"(a) raw consume, 1 process     {a['rps']:>10,.0f} records/s  {a['mbps']:>7,.1f} MB/s  "
            f"({a['bytes'] / 1e6:,.1f} MB in {a['seconds']:.2f} s)")
    if "b" in summary:
        b = summary["b"]
        say(f"(b) end to end, plan+execute   {b['rps']:>10,.0f} records/s  {b['mbps']:>7,.1f} MB/s  "
            f"({b['total_s']:.2f} s; Spark warmed up first: {summary['warmup_s']:.1f} s, not timed)")
        say(f"    phases (s)                 plan={b['plan_s']:.2f}  {fmt_phases(b['phases'])}")
        say(f"(b)/(a) records/s              {summary['ratio']:.3f}")
    for r in summary.get("c", []):
        say(f"(c) commit at {r['snapshots']:>5,} snapshots   execute {r['exec_s']:>6.2f} s  publish {r['publish_s']:>5.2f} s  "
            f"metadata.json {r['meta_bytes']:>10,} B")
    if "d" in summary:
        d = summary["d"]
        say(f"(d) upsert, 10% upd / 2% del   {d['changes_per_s']:>10,} changes/s  ({d['changes']:,} changes to a "
            f"{d['rows']:,}-row table in {d['change_s']:.2f} s)")
    say(f"machine                        nproc {os.cpu_count()}, python {sys.version.split()[0]}, "
        f"Spark master {settings.spark_master if settings else '?'}, load average now {_load()}")
    say(f"total runtime                  {time.perf_counter() - started:.0f} s")
    if "error" in summary:
        say(f"ERROR                          {summary['error'].splitlines()[0]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000, help="records for (a) and (b) (default 1,000,000)")
    ap.add_argument("--skip-snapshots", action="store_true", help="skip (c), commit time versus snapshot count")
    ap.add_argument("--snapshot-levels", default="10,100,1000",
                    help="snapshot counts for (c), comma-separated (default 10,100,1000)")
    ap.add_argument("--commit-batch", type=int, default=1_000, help="records per timed micro-batch in (c)")
    ap.add_argument("--keep", action="store_true", help="keep the /tmp/bench-* directory (broker data, lake)")
    args = ap.parse_args(argv)
    args.levels = sorted({int(x) for x in args.snapshot_levels.split(",") if x.strip()})
    if args.records <= 0 or args.commit_batch <= 0 or any(x <= 0 for x in args.levels):
        ap.error("--records, --commit-batch and --snapshot-levels must be positive")
    started = time.perf_counter()

    tmp = Path(tempfile.mkdtemp(prefix="bench-", dir="/tmp"))
    broker_dir = tmp / "kafka"
    # Spark's shuffle and spill files go to our own directory
    os.environ["SPARK_LOCAL_DIRS"] = str(tmp / "spark-local")
    say(f"kafka-iceberg-lake benchmark  {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC")
    say(f"records N={args.records:,}  snapshot levels={args.levels if not args.skip_snapshots else 'skipped'}  "
        f"work dir {tmp}")
    summary: dict = {}
    try:
        bootstrap = devbroker.start(broker_dir, devbroker.free_port())
        summary["settings"] = bench_settings(tmp / "lake", bootstrap)
        run(args, tmp, summary)
    except Exception as exc:
        import traceback

        say()
        say(f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        traceback.print_exc()
        summary["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        spark = summary.pop("spark", None)
        if spark is not None:
            try:
                spark.stop()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
        gc.collect()  # drop Kafka clients before their broker goes away
        devbroker.stop(broker_dir)
        if args.keep:
            say(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print_summary(args, summary, started)
    return 1 if "error" in summary else 0


if __name__ == "__main__":
    sys.exit(main())
