"""Repeated measurement of one micro-batch's phases next to its same-run references, for
before/after comparisons of a change to the read or write path on a shared machine.

    PYTHONPATH=. .venv/bin/python -m devtools.bench.phases [--records 200000] [--repeats 3] [--small 5]

One broker, one topic of N flights records (as ``scripts/bench.py``), then ``--repeats`` rounds of:
(a) the raw consume of the N records by one plain Consumer, (c) the one-core consume + parse + Parquet
reference (``goals.single_core_reference``, also with pyarrow's threads), (b) one micro-batch of all N records into a fresh table, timed from ``plan()`` to ``execute()``; then ``--small`` 1,000-record
micro-batches on the warm session (goal 2). Each round's (b)/(a) uses the (a) of the same round,
so a change in the machine's load moves both. Prints figures; asserts nothing. Dev tooling.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from devtools.bench.common import (
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
    rate,
    raw_consume,
    say,
    section,
    settle,
    timed_batch,
    warm_up,
)
from devtools.demo import data as demo_data
from devtools.services import devbroker


def _round(spark, settings, config, kafka, catalog, n: int, i: int) -> dict:
    from devtools.bench.goals import single_core_reference
    from kafka_iceberg.batch.pipeline import TableWriter

    settle()
    load = _load()
    a = raw_consume(config, TOPIC, list(range(PARTITIONS)))
    spec = flights_spec(f"bench_phases_{i}", f"bench.phases_{i}", TOPIC, n)
    settle()
    c = single_core_reference(config, TOPIC, list(range(PARTITIONS)), spec, Path(settings.lake_home) / "reference")
    settle()
    ct = single_core_reference(
        config, TOPIC, list(range(PARTITIONS)), spec, Path(settings.lake_home) / "reference", one_core=False
    )
    writer = TableWriter(spark, settings, spec, kafka, catalog)
    writer.ensure_table()
    writer.recover()
    settle()
    plan_s, exec_s, result, _ = timed_batch(writer)
    out = {
        "a_rps": rate(a["records"], a["seconds"]),
        "b_rps": rate(result.records, plan_s + exec_s),
        "b_s": plan_s + exec_s,
        "phases": dict(result.phase_seconds, plan=round(plan_s, 3)),
        "load": load,
        "records": result.records,
    }
    out["ratio"] = rate(out["b_rps"], out["a_rps"])
    out["ratio_c"] = rate(out["b_rps"], c["rps"])
    out["ratio_ct"] = rate(out["b_rps"], ct["rps"])
    say(
        f"round {i}: load {load}; (a) {out['a_rps']:,.0f} records/s; (c) {c['rps']:,.0f} records/s; (b) "
        f"{result.records:,} records in {out['b_s']:.2f} s = {out['b_rps']:,.0f} records/s; (b)/(a) "
        f"{out['ratio']:.3f}, (b)/(c) {out['ratio_c']:.3f} (one core; {out['ratio_ct']:.3f} against (c) with pyarrow's threads)  [{fmt_phases(out['phases'])}]"
    )
    return out


def spark_jobs_since(spark, after: int) -> list[tuple[int, str, float]]:
    """(job id, call site, seconds) of the Spark jobs with an id above ``after``, from Spark's
    monitoring REST API (the driver's UI port); [] when the UI is off or does not answer."""
    import json
    import urllib.request
    from datetime import datetime

    sc = spark.sparkContext
    if not sc.uiWebUrl:
        return []
    try:
        with urllib.request.urlopen(f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/jobs", timeout=60) as resp:
            jobs = json.loads(resp.read())
    except OSError as exc:  # a busy driver may not answer: the figures do not depend on it
        say(f"    (Spark jobs not listed: {exc})")
        return []

    def ts(text: str) -> float:
        return datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()

    return sorted(
        (j["jobId"], j["name"], ts(j["completionTime"]) - ts(j["submissionTime"]))
        for j in jobs
        if j["jobId"] > after and "completionTime" in j
    )


def _print_jobs(spark, last: list) -> None:
    jobs = spark_jobs_since(spark, last[0])
    if jobs:
        last[0] = jobs[-1][0]
        say("    Spark jobs: " + "; ".join(f"{name} {sec:.2f} s" for _, name, sec in jobs))


def _small(spark, settings, config, kafka, catalog, df, count: int) -> list[dict]:
    from devtools.bench.goals import _timed_run

    spec = flights_spec("bench_warmup", "bench.warmup", WARMUP_TOPIC, WARMUP_RECORDS)
    out, last = [], [max([j for j, _, _ in spark_jobs_since(spark, -1)], default=-1)]
    for i in range(count):
        demo_data.produce(config, spec.topic, flights_records(df, WARMUP_RECORDS + i * 1000, 1000))
        wall, jobs, result = _timed_run(spark, settings, spec, kafka, catalog, "small")
        out.append({"wall": wall, "jobs": jobs, "phases": dict(result.phase_seconds)})
        say(
            f"1,000 records #{i + 1}: {wall:.2f} s wall, {jobs} Spark jobs, "
            f"records {result.records}  [{fmt_phases(result.phase_seconds)}]"
        )
        _print_jobs(spark, last)
    return out


def run(args, tmp: Path) -> None:
    from kafka_iceberg.catalog.spark import get_spark
    from kafka_iceberg.catalog.tables import load_catalog
    from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata

    bootstrap = devbroker.start(tmp / "kafka", devbroker.free_port())
    spark = None
    try:
        settings = bench_settings(tmp / "lake", bootstrap)
        config = KafkaConfig.from_settings(settings)
        kafka = KafkaMetadata(config)
        df = demo_data.load_frame("flights")
        demo_data.create_topic(config, TOPIC, PARTITIONS, TOPIC_CONFIG)
        demo_data.produce(config, TOPIC, flights_records(df, 0, args.records))
        spark = get_spark(settings)
        catalog = load_catalog(settings.catalog)
        warm_up(spark, settings, config, kafka, catalog, df)
        section(f"{args.repeats} rounds of (a) raw consume and (b) one micro-batch of {args.records:,} records")
        rounds = [_round(spark, settings, config, kafka, catalog, args.records, i) for i in range(args.repeats)]
        section(f"{args.small} micro-batches of 1,000 records on the warm session")
        small = _small(spark, settings, config, kafka, catalog, df, args.small)
        section("summary (medians)")
        ratios = ", ".join(f"{r['ratio']:.3f}" for r in rounds)
        say(f"(b)/(a) per round: {ratios}; median {statistics.median(r['ratio'] for r in rounds):.3f}")
        ratios_c = ", ".join(f"{r['ratio_c']:.3f}" for r in rounds)
        say(f"(b)/(c) per round: {ratios_c}; median {statistics.median(r['ratio_c'] for r in rounds):.3f}")
        ratios_ct = ", ".join(f"{r['ratio_ct']:.3f}" for r in rounds)
        say(
            f"(b)/(c with pyarrow's threads): {ratios_ct}; median {statistics.median(r['ratio_ct'] for r in rounds):.3f}"
        )
        for key in sorted({k for r in rounds for k in r["phases"]}):
            say(f"  N-record {key:<16} {statistics.median(r['phases'].get(key, 0.0) for r in rounds):7.2f} s")
        if small:
            say(
                f"1,000-record micro-batch: median {statistics.median(s['wall'] for s in small):.2f} s, "
                f"{statistics.median(s['jobs'] for s in small):.0f} Spark jobs (goal <= 1.5 s)"
            )
            for key in sorted({k for s in small for k in s["phases"]}):
                say(f"  small {key:<16} {statistics.median(s['phases'].get(key, 0.0) for s in small):7.2f} s")
        say(f"load average at the end: {_load()}")
    finally:
        if spark is not None:
            spark.stop()
        devbroker.stop(tmp / "kafka")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--small", type=int, default=5)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-phases-", dir="/tmp"))
    os.environ["SPARK_LOCAL_DIRS"] = str(tmp / "spark-local")
    try:
        run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
