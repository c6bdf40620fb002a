"""Goals 1c, 2, 4b and 5 of the benchmark: the single-core reference, the fixed cost of a
micro-batch, ``duplicate_free`` versus table size, and peak memory. See docs/benchmark.md.

Every function prints figures and returns them; none asserts. Dev tooling, not installed.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from devtools.bench.common import RECEIVE_MAX_BYTES, flights_records, flights_spec, fmt_phases, rate, say, section
from devtools.demo import data as demo_data
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.catalog.tables import qualified
from kafka_iceberg.config.settings import Settings
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata
from kafka_iceberg.ops import checks
from kafka_iceberg.state import KEY_BATCH, KEY_COMMIT_ID

_ARROW = {
    "long": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "float": pa.float32(),
    "string": pa.string(),
    "boolean": pa.bool_(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}
PARSE_BLOCK = 50_000  # records joined into one newline-delimited JSON buffer per pyarrow parse


def arrow_schema(spec: TableSpec) -> pa.Schema:
    """The declared value columns of ``spec`` as an Arrow schema (for pyarrow's JSON reader)."""
    return pa.schema([pa.field(c.name, _ARROW.get(c.type, pa.string())) for c in spec.columns])  # JSON: all nullable


# -- goal 1c: consume + parse + write in one process -----------------------------------------
def single_core_reference(
    config: KafkaConfig, topic: str, partitions: list[int], spec: TableSpec, out_dir: Path, one_core: bool = True
) -> dict:
    """Reference (c): one process consumes every record of ``topic`` (offset 0 to the high
    watermarks), parses the values with ``pyarrow.json.read_json`` in blocks of
    :data:`PARSE_BLOCK` records against the declared schema, and writes them to one zstd Parquet
    file. With ``one_core`` (goal 1's reference) the thread, and the librdkafka threads its consumer
    starts, run on one CPU (``sched_setaffinity``) and pyarrow parses without its thread pool; without,
    pyarrow's pool parses on every core (goal 1's reference up to 2b90840). Returns records, seconds
    (total, parse, write) and Parquet bytes."""
    where = "one core" if one_core else "one process, pyarrow's threads"
    section(f"(1c) reference: consume + pyarrow JSON parse + zstd Parquet, {where}")
    cpus = os.sched_getaffinity(0)
    if one_core:
        os.sched_setaffinity(0, {min(cpus)})  # this thread; the consumer's threads inherit it
    try:
        return _reference(config, topic, partitions, spec, out_dir, one_core)
    finally:
        os.sched_setaffinity(0, cpus)


def _reference(config: KafkaConfig, topic: str, partitions: list[int], spec: TableSpec, out_dir: Path, one_core: bool):
    consumer = Consumer(
        config.client_conf(
            **{
                "group.id": f"bench-ref-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "receive.message.max.bytes": RECEIVE_MAX_BYTES,
            }
        )
    )
    schema = arrow_schema(spec)
    opts = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "reference.parquet"
    parse_s = write_s = 0.0
    records = 0
    try:
        high = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
        pending, remaining = {p for p in partitions if high[p] > 0}, sum(high.values())
        block: list[bytes] = []
        t0 = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        with pq.ParquetWriter(path, schema, compression="zstd") as writer:

            def flush():
                nonlocal parse_s, write_s
                t = time.perf_counter()
                table = pajson.read_json(
                    io.BytesIO(b"\n".join(block)),
                    read_options=pajson.ReadOptions(use_threads=not one_core),
                    parse_options=opts,
                )
                t2 = time.perf_counter()
                writer.write_table(table)
                parse_s, write_s = parse_s + t2 - t, write_s + time.perf_counter() - t2
                block.clear()

            while pending:
                msgs = consumer.consume(num_messages=max(1, min(10_000, remaining - records)), timeout=1.0)
                for m in msgs:
                    if m.error() is not None:
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            continue
                        raise KafkaException(m.error())
                    block.append(m.value())
                    records += 1
                    if m.offset() + 1 >= high[m.partition()]:
                        pending.discard(m.partition())
                if len(block) >= PARSE_BLOCK:
                    flush()
            if block:
                flush()
        seconds = time.perf_counter() - t0
    finally:
        consumer.close()
    size = path.stat().st_size
    rps = rate(records, seconds)
    say(
        f"{records:,} records consumed, parsed ({PARSE_BLOCK:,}-record blocks, explicit schema) and written "
        f"({size / 1e6:.1f} MB zstd Parquet) in {seconds:.2f} s: parse {parse_s:.2f} s, write {write_s:.2f} s, "
        f"consume {seconds - parse_s - write_s:.2f} s"
    )
    say(
        f"  => {rps:,.0f} records/s  (parse alone {rate(records, parse_s):,.0f}/s, write alone {rate(records, write_s):,.0f}/s)"
    )
    path.unlink(missing_ok=True)
    return {"records": records, "seconds": seconds, "parse_s": parse_s, "write_s": write_s, "bytes": size, "rps": rps}


# -- goal 2: fixed cost ----------------------------------------------------------------------
@contextmanager
def spark_jobs(spark, label: str):
    """Count the Spark jobs started by this thread inside the block (a job group and the
    SparkContext status tracker). Yields a one-element list that holds the count afterwards."""
    sc = spark.sparkContext
    group = f"bench-{label}-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, label)
    out = [0]
    try:
        yield out
    finally:
        out[0] = len(sc.statusTracker().getJobIdsForGroup(group))
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)


def _timed_run(spark, settings, spec, kafka, catalog, label):
    with spark_jobs(spark, label) as jobs:
        t0 = time.perf_counter()
        result = run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
        wall = time.perf_counter() - t0
    return wall, jobs[0], result


def fixed_cost(
    spark,
    settings: Settings,
    config: KafkaConfig,
    kafka: KafkaMetadata,
    catalog,
    df,
    spec: TableSpec,
    first_row: int,
    repeats: int = 3,
) -> dict:
    """Goal 2 on a warm session: ``repeats`` no-op micro-batches (nothing new on the topic), then
    ``repeats`` micro-batches of 1,000 freshly produced records, each the whole
    ``run_micro_batch`` (ensure table, recover, plan, execute). Prints wall seconds, Spark jobs
    started and phases; returns the medians."""
    section("(2) fixed cost of a micro-batch on a warm session (run_micro_batch: ensure, recover, plan, execute)")
    noop, small = [], []
    for i in range(repeats):
        wall, jobs, result = _timed_run(spark, settings, spec, kafka, catalog, "noop")
        noop.append((wall, jobs))
        say(
            f"no-op #{i + 1}: {wall:.2f} s wall, {jobs} Spark jobs, records {result.records}, "
            f"committed={result.committed}  [{fmt_phases(result.phase_seconds)}]"
        )
    for i in range(repeats):
        demo_data.produce(config, spec.topic, flights_records(df, first_row + i * 1000, 1000))
        wall, jobs, result = _timed_run(spark, settings, spec, kafka, catalog, "small")
        small.append((wall, jobs))
        say(
            f"1,000 records #{i + 1}: {wall:.2f} s wall, {jobs} Spark jobs, records {result.records}  "
            f"[{fmt_phases(result.phase_seconds)}]"
        )
    out = {
        "noop_s": statistics.median(w for w, _ in noop),
        "noop_jobs": max(j for _, j in noop),
        "small_s": statistics.median(w for w, _ in small),
        "small_jobs": statistics.median(j for _, j in small),
    }
    say(
        f"median: no-op {out['noop_s']:.2f} s ({out['noop_jobs']} Spark jobs at most; goal <= 3 s and 0 jobs); "
        f"1,000 records {out['small_s']:.2f} s (goal <= 1.5 s)"
    )
    return out


# -- goal 4b: duplicate_free at 1x and (factor)x rows ---------------------------------------
def _time_check(spark, settings, spec, catalog, commit_id=None) -> tuple[float, checks.CheckOutcome]:
    """Seconds of ``checks.duplicate_free`` (the fastest of two full scans, or of five incremental
    checks, which read with pyiceberg, no Spark job) and its outcome."""
    best, outcome = float("inf"), None
    for _ in range(2 if commit_id is None else 5):  # the first run also loads classes and caches
        t0 = time.perf_counter()
        outcome = checks.duplicate_free(
            spark,
            qualified(settings, spec),
            spec,
            catalog.load_table(spec.identifier),
            commit_id=commit_id,
        )
        best = min(best, time.perf_counter() - t0)
    return best, outcome


def _shifted(spark, target: str, src: str, off: str, shift: str) -> str:
    cols = ", ".join(f"`{c}` + {shift} AS `{c}`" if c == off else f"`{c}`" for c in spark.table(target).columns)
    return f"SELECT {cols} FROM {src}"


def _append_commit(spark, target: str, src: str, part: str, off: str, shift: int, commit_id: str) -> None:
    """Append 1,000 rows of ``src`` with offsets shifted by ``shift`` as one snapshot carrying
    ``kafka.commit-id`` and the ``kafka.batch`` ranges that cover them (a stand-in for one run's commit)."""
    sample = spark.sql(_shifted(spark, target, src, off, str(shift)) + " LIMIT 1000")
    rows = spark.createDataFrame(sample.collect(), sample.schema)  # fixed rows: LIMIT is not deterministic
    ranges = {
        str(r[0]): [int(r[1]), int(r[2]) + 1]
        for r in rows.groupBy(part).agg({off: "min"}).join(rows.groupBy(part).agg({off: "max"}), part).collect()
    }
    (
        rows.writeTo(target)
        .option(f"snapshot-property.{KEY_COMMIT_ID}", commit_id)
        .option(f"snapshot-property.{KEY_BATCH}", json.dumps(ranges))
        .append()
    )


def dup_free_scaling(spark, settings: Settings, catalog, source: TableSpec, n: int, factor: int) -> dict:
    """Goal 4b: ``checks.duplicate_free`` on a copy of ``source`` (``n`` rows), then on the copy
    grown to ``factor * n`` rows by appending ``factor - 1`` copies with shifted offsets (distinct
    ``(partition, offset)``, so the check still passes): the full scan, and the incremental check
    after a 1,000-row commit on top. Seconds are the fastest of two runs (five for the incremental check)."""
    section(f"(4b) duplicate_free at {n:,} rows versus {factor * n:,} rows (full scan, and after a 1,000-row commit)")
    spec = flights_spec("bench_dupcheck", "bench.dupcheck", source.topic, source.max_records_per_partition)
    target, src = qualified(settings, spec), qualified(settings, source)
    part, off = spec.kafka_column("partition"), spec.kafka_column("offset")
    spark.sql(f"CREATE TABLE {target} USING iceberg AS SELECT * FROM {src}")
    small_s, small = _time_check(spark, settings, spec, catalog)
    _append_commit(spark, target, src, part, off, factor * n, "bench-commit-small")
    inc_small_s, inc_small = _time_check(spark, settings, spec, catalog, "bench-commit-small")
    say(
        f"{n:,} rows: full {small_s:.2f} s (passed={small.passed}); incremental {inc_small_s:.2f} s "
        f"(passed={inc_small.passed}: {inc_small.summary})"
    )
    t0 = time.perf_counter()
    spark.sql(
        f"INSERT INTO {target} {_shifted(spark, target, src, off, f'k * {n}')} "
        f"CROSS JOIN (SELECT id AS k FROM range(1, {factor}))"
    )
    grow_s = time.perf_counter() - t0
    big_s, big = _time_check(spark, settings, spec, catalog)
    _append_commit(spark, target, src, part, off, (factor + 1) * n, "bench-commit-big")
    inc_big_s, inc_big = _time_check(spark, settings, spec, catalog, "bench-commit-big")
    rows = spark.table(target).count()
    say(
        f"{rows:,} rows (grown in {grow_s:.1f} s): full {big_s:.2f} s (passed={big.passed}); incremental "
        f"{inc_big_s:.2f} s (passed={inc_big.passed}: {inc_big.summary})"
    )
    ratio, inc_ratio = rate(big_s, small_s), rate(inc_big_s, inc_small_s)
    say(f"ratio full scan {ratio:.2f}; incremental {inc_ratio:.2f} (goal <= 1.2)")
    spark.sql(f"DROP TABLE {target} PURGE")
    return {
        "small_rows": n,
        "big_rows": rows,
        "small_s": small_s,
        "big_s": big_s,
        "ratio": ratio,
        "inc_small_s": inc_small_s,
        "inc_big_s": inc_big_s,
        "inc_ratio": inc_ratio,
    }


# -- goal 5: peak RSS of the driver JVM and the Python workers ------------------------------
class RssSampler:
    """Peak RSS (bytes) of this process's tree, sampled every 0.1 s by :mod:`devtools.bench.rss` in a
    process of its own: ``java`` (the Spark driver JVM, which in local mode also runs the executor) and
    ``python*`` (the PySpark worker daemon and its forked workers), summed with this process's own (the
    driver reads micro-batches on a local master). Keeps the peaks."""

    def __init__(self, interval_s: float = 0.1):
        self.interval_s, self.jvm_peak, self.workers_peak, self.workers_max_count = interval_s, 0, 0, 0
        self._proc = None

    def __enter__(self):
        import subprocess
        import sys

        self._proc = subprocess.Popen(
            [sys.executable, "-m", "devtools.bench.rss", str(os.getpid()), str(self.interval_s)],
            cwd=Path(__file__).resolve().parents[2],  # the checkout, from wherever the benchmark runs
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        return self

    def __exit__(self, *exc):
        out, _ = self._proc.communicate("stop\n", timeout=60)
        peaks = json.loads(out)
        self.jvm_peak, self.workers_peak = peaks["jvm_peak"], peaks["workers_peak"]
        self.workers_max_count = peaks["workers_max_count"]

    def line(self) -> str:
        return (
            f"driver JVM peak RSS {self.jvm_peak / 2**20:,.0f} MiB; Python driver and workers peak RSS "
            f"{self.workers_peak / 2**20:,.0f} MiB (sum over up to {self.workers_max_count} processes)"
        )


__all__ = ["RssSampler", "arrow_schema", "dup_free_scaling", "fixed_cost", "single_core_reference", "spark_jobs"]
