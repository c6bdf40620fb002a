"""The soak: a hundred streaming tables on the default deployment for hours; everything it holds must stay flat.

``make soak [SOAK_MINUTES=120] [SOAK_SAMPLE_S=60] [SOAK_TABLES=100] [SOAK_RATE=200]`` (``python -m
devtools.bench.soak --minutes M --sample-s S --tables N --rate R``) starts a dev broker of its own and a fresh
lake under ``$LAKE_HOME/soak`` (removed first), declares N tables (the flights declaration on N topics of 2
partitions, as ``make bench BENCH_ARGS="--many N"``), and runs the default deployment on this checkout:
``dagster-daemon`` with the ``lake_workers`` sensor launching the worker runs, ``LAKE_WORKERS`` unset
(:mod:`devtools.bench.deployment`). After 10 records per table have been committed (the tables exist, the
workers serve), R records/s in total are produced round-robin over the N topics for M minutes.

Every S seconds it samples (:mod:`devtools.bench.probe`) and appends one JSON line to
``$LAKE_HOME/soak/samples.jsonl`` (written as it goes: an unattended run can be read while it runs):
threads and open file descriptors summed over the deployment's long-lived processes (daemon, code server,
worker runs, their JVMs; the processes of other runs, found by the runs' ``lake/worker-pid`` tags, are
recorded apart: ``other_runs``, ``other_runs_rss_mib``), then, after a full collection of each Spark driver JVM (``jcmd GC.run``), their live heap (old
generation used) and committed heap, the resident memory summed over the processes (read after the collection)
and that memory apart from the Java heap's resident pages (``rss_native_mib``; the collector sizes the heap from
the live set, so its size is noise, not a leak), the worker runs' ages, snapshots and metadata files per table (max, mean), rows
of the catalog's ``iceberg_tables``, bytes of ``DAGSTER_HOME`` and its events.

The tables keep their snapshots under ``maintenance.max_snapshots`` = ``--max-snapshots`` (default 60,
``retain_last`` a third of it; :func:`declare`), so the worker runs' expiry cuts them back several times
within the run; metadata files are bounded by ``write.metadata.previous-versions-max``.

At the end it stops the producer, waits until every table caught up, stops the deployment, and prints,
over the second half of the run, each figure's Theil-Sen slope (per hour, with its 95% interval)
against its bound (:data:`BOUNDS`, each with the reason for it; :func:`verdicts`: the worker runs' figures
over warm samples only, :func:`steady`; the daemon and code server apart, :data:`SERVERS`), the Dagster events per
table per hour against the goal (<= 200), and whether every table holds each produced record exactly once
(DuckDB: count = distinct (partition, offset) = produced). It exits 1 unless all pass.
``$LAKE_HOME/soak/summary.json`` keeps the verdicts; ``make soak SOAK_ARGS=--rejudge`` judges the last soak's
samples again by this checkout's rules (:func:`rejudge`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from devtools import duck
from devtools.bench import probe
from devtools.bench.common import CHECKOUT, bench_settings, flights_records
from devtools.bench.freshness import daemon_env, start_daemon, stop_daemon
from devtools.bench.many import PARTITIONS, Spread, names, wait_caught_up, write_tables_file
from devtools.demo import data as demo_data
from devtools.services import devbroker
from kafka_iceberg.batch.assign import worker_count
from kafka_iceberg.catalog.tables import load_catalog
from kafka_iceberg.config.settings import Settings
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata

WORKER_JOB_PREFIX = "lake_worker_"
"""The worker runs' jobs (``lake_worker_<k>``, :func:`kafka_iceberg.lake_assets.worker.worker_job_name`)."""
EVENTS_GOAL = 200
"""Dagster events per table per hour the event log may grow by (issue 43)."""
MIB = 2**20


@dataclass(frozen=True)
class Bound:
    """The largest slope (``unit`` per hour) a figure may have over the second half, and why."""

    figure: str
    unit: str
    limit: float | None  # None: computed from the run (the event goal)
    why: str


BOUNDS = (
    Bound(
        "rss_native_mib", "MiB", 64.0, "resident memory apart from the Java heap the collector sizes: a 1 GiB/16 h leak"
    ),
    Bound("python_rss_mib", "MiB", 32.0, "the worker runs' Python processes (not the JVMs): 512 MiB/16 h"),
    Bound("heap_mib", "MiB", 64.0, "the JVMs' live set after a full GC, its 5-minute floor: 1 GiB/16 h"),
    Bound("threads", "threads", 10.0, "thread pools are sized at start; Spark's and gRPC's vary by ~20"),
    Bound("fds", "fds", 20.0, "sockets and shuffle files vary by a few tens between samples"),
    Bound("server_rss_mib", "MiB", 16.0, "daemon and code server, which live for months: 16 MiB/h"),
    Bound("server_threads", "threads", 10.0, "daemon and code server; one leaked per sensor tick is 120/h"),
    Bound("server_fds", "fds", 20.0, "daemon and code server: their sockets come and go by ~15 between samples"),
    Bound(
        "snapshots_max",
        "snapshots",
        5.0,
        "expiry keeps max_snapshots, the <= 5 min a pending check reads, or a hand-over's hold (EXPIRY_HOLD_S)",
    ),
    Bound("snapshots_mean", "snapshots", 5.0, "each table saws between retain_last and max_snapshots"),
    Bound("metadata_files_max", "files", 5.0, "write.metadata.previous-versions-max keeps 50 + 1"),
    Bound("metadata_files_mean", "files", 2.0, "as for the max, averaged over the tables"),
    Bound("catalog_rows", "rows", 0.5, "one row per table: any growth is a leak"),
    Bound("events", "events", None, f"goal: {EVENTS_GOAL} events per table per hour"),
    Bound("dagster_mib", "MiB", None, "the event goal at this run's bytes per event (storage grows with events)"),
)
SERVERS = ("dagster-daemon", "dagster api")
"""The deployment's processes that live as long as it does (:func:`probe.processes` names): the daemon and the
code server, which evaluates the sensors. Worker runs are replaced every ``BUDGET_S`` (30 min)."""


def figure(s: dict, name: str) -> float | None:
    """Figure ``name`` of sample ``s``: a sampled number, ``server_rss_mib`` / ``server_threads`` / ``server_fds``
    summed over the :data:`SERVERS` processes, or ``python_rss_mib`` over the others but the JVMs (``by_name``);
    None when the sample lacks it."""
    if name.startswith("server_"):
        column = {"server_rss_mib": 1, "server_threads": 2, "server_fds": 3}[name]
        return float(sum(v[column] for k, v in (s.get("by_name") or {}).items() if k in SERVERS))
    if name == "python_rss_mib":
        return float(sum(v[1] for k, v in (s.get("by_name") or {}).items() if k not in (*SERVERS, "java")))
    value = s.get(name)
    return None if value is None else float(value)


TREND_Z = 1.96
"""The normal quantile of :func:`trend`'s two-sided 95% interval."""


def trend(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """The Theil-Sen slope of ``points`` (x, y): the median of the slopes between every two points, with Sen's
    95% interval (the ranks of those slopes that Kendall's statistic bounds); (slope, low, high), all 0 for fewer
    than 3 points. A median, so a sample taken while a Spark job's Python workers were up, or a burst was in
    flight, moves it little, while a leak moves every sample and so every slope."""
    n = len(points)
    slopes = sorted(
        (y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1 :] if x2 != x1
    )
    if n < 3 or not slopes:
        return 0.0, 0.0, 0.0
    spread = TREND_Z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    low = max(0, math.floor((len(slopes) - spread) / 2))
    high = min(len(slopes) - 1, math.ceil((len(slopes) + spread) / 2))
    return statistics.median(slopes), slopes[low], slopes[high]


def sample(sid: int, settings: Settings, home: Path, identifiers: list[str], t0: float) -> dict:
    """One sample of the deployment in session ``sid`` (module docstring); ``t0``: monotonic start of the load."""
    runs = probe.run_pids(home)
    procs, others = _split(
        probe.processes(sid, runs)
    )  # threads and fds before the full collections (which start cleanup threads)
    heaps = [probe.jvm_heap(p["pid"]) for p in procs if p["name"] == "java"]
    after = _split(probe.processes(sid, runs))[0] if heaps else procs  # RSS after them: the JVMs' heaps shrunk alike
    live = [h[0] for h in heaps if h is not None]
    committed = sum(h[1] for h in heaps if h is not None) / MIB
    resident = sum(h[2] if h[2] is not None else h[1] for h in heaps if h is not None) / MIB  # else: committed
    ages = [probe.age_s(pid) for pid, job in runs.items() if job.startswith(WORKER_JOB_PREFIX)]
    rss = sum(p["rss"] for p in after) / MIB
    files = probe.table_files(load_catalog(settings.catalog), identifiers)
    snaps = [s for s, _ in files.values()] or [0]
    metas = [m for _, m in files.values()] or [0]
    size, events = probe.dagster_storage(home)
    return {
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "minutes": (time.monotonic() - t0) / 60,
        "processes": len(procs),
        "by_name": _by_name(procs),
        "other_runs": sorted({p["job"] for p in others}),
        "other_runs_rss_mib": sum(p["rss"] for p in others) / MIB,
        "rss_mib": rss,
        "rss_native_mib": rss - resident,
        "heap_committed_mib": committed,
        "worker_ages_s": sorted(a for a in ages if a is not None),
        "threads": sum(p["threads"] for p in procs),
        "fds": sum(p["fds"] for p in procs),
        "jvms": len(heaps),
        "heap_mib": sum(live) / MIB if live else None,
        "tables": len(files),
        "snapshots_max": max(snaps),
        "snapshots_mean": sum(snaps) / len(snaps),
        "metadata_files_max": max(metas),
        "metadata_files_mean": sum(metas) / len(metas),
        "catalog_rows": probe.catalog_rows(settings.catalog.sqlalchemy_uri),
        "dagster_mib": size / MIB,
        "events": events,
    }


def _split(procs: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the deployment's long-lived processes: daemon, code server, worker runs and their JVMs; the processes of
    other runs: a scheduled ``duplicate_free`` full scan, which starts, reads one table and ends)."""
    mine = [p for p in procs if p["job"] is None or p["job"].startswith(WORKER_JOB_PREFIX)]
    return mine, [p for p in procs if p not in mine]


def _by_name(procs: list[dict]) -> dict[str, list[float]]:
    """Process name -> [count, RSS MiB, threads, fds] summed over the processes of that name."""
    out: dict[str, list[float]] = {}
    for p in procs:
        row = out.setdefault(p["name"], [0, 0.0, 0, 0])
        row[0] += 1
        row[1] += p["rss"] / MIB
        row[2] += p["threads"]
        row[3] += p["fds"]
    return out


COLUMNS = (
    ("min", "minutes", "{:.1f}"),
    ("procs", "processes", "{:d}"),
    ("RSS MiB", "rss_mib", "{:.0f}"),
    ("threads", "threads", "{:d}"),
    ("fds", "fds", "{:d}"),
    ("heap MiB", "heap_mib", "{:.0f}"),
    ("snap max", "snapshots_max", "{:d}"),
    ("snap mean", "snapshots_mean", "{:.1f}"),
    ("meta max", "metadata_files_max", "{:d}"),
    ("meta mean", "metadata_files_mean", "{:.1f}"),
    ("cat rows", "catalog_rows", "{:d}"),
    ("dagster MiB", "dagster_mib", "{:.1f}"),
    ("events", "events", "{:d}"),
)
"""The table's columns: heading, sample key, format (each cell right-aligned to the wider of both)."""
WIDTH = 9


def header() -> str:
    """The headings of :data:`COLUMNS`, aligned as :func:`row` aligns the cells."""
    return "  ".join(h.rjust(max(WIDTH, len(h))) for h, _, _ in COLUMNS)


def row(s: dict) -> str:
    """One sample as a line of the table (:data:`COLUMNS`)."""
    cells = []
    for head, key, fmt in COLUMNS:
        value = s.get(key)
        cells.append((fmt.format(value) if value is not None else "-").rjust(max(WIDTH, len(head))))
    return "  ".join(cells)


HANDOVER_RATIO = 1.5
"""A sample whose process count or open file descriptors exceed this multiple of the run's steady level is
taken during a worker run's handover (:func:`steady`, samples without ``worker_ages_s``)."""
WARM_S = 600.0
"""Seconds a worker run takes to reach its working level: every table served, the JVM's thread pools and code
cache filled (on f8d7f5e a new run's JVM went from ~220 to ~325 threads in its first 10 minutes). The fits leave
its younger samples out, as a line through runs that each start low would read the sawtooth as a trend."""


def _lower_quartile(values: list[float]) -> float:
    """The value a quarter of the way up ``values`` (sorted): the low end, robust to a single low outlier."""
    return sorted(values)[len(values) // 4]


def steady(samples: list[dict], workers: int | None = None) -> list[dict]:
    """The ``samples`` taken while exactly the deployment's worker runs were alive, each warm: a sample with a
    second run (a successor up, or a predecessor still exiting) or with a run younger than :data:`WARM_S` is left
    out of the fits, as a line through the restarts would read each run's ramp of memory, threads and
    files as a leak. ``workers``: the deployment's worker count (None: the samples' most common count).

    Samples with ``worker_ages_s`` (the worker runs' ages, :func:`sample`) are judged by it and by their JVMs
    (one Spark driver per worker run; another is a run that has not tagged its pid yet). Older samples by
    two rules: (1) exactly ``workers`` JVMs (one Spark driver per worker run); (2) processes and open files at
    most :data:`HANDOVER_RATIO` times the lower quartile of those rule 1 keeps (a successor's Python process is
    up some seconds before its JVM). Other runs (a scheduled ``duplicate_free`` full scan) are never counted in
    the figures: :func:`_split`."""
    if not samples:
        return []
    counts = [s["jvms"] for s in samples]
    usual = workers if workers is not None else max(set(counts), key=counts.count)
    one_each = [s for s in samples if s["jvms"] == usual]  # a second JVM: a run not tagged with its pid yet
    if all("worker_ages_s" in s for s in samples):
        ages = [(s, s["worker_ages_s"]) for s in one_each]
        return [s for s, a in ages if len(a) == usual and min(a or [0]) >= WARM_S]
    if not one_each:
        return []
    procs, fds = (_lower_quartile([s[k] for s in one_each]) for k in ("processes", "fds"))
    return [s for s in one_each if s["processes"] <= HANDOVER_RATIO * procs and s["fds"] <= HANDOVER_RATIO * fds]


RUN_FIGURES = ("rss_native_mib", "python_rss_mib", "heap_mib", "threads", "fds")
"""The figures that sum the worker runs' processes: over the :func:`steady` samples only, and across runs
(:func:`across_runs`)."""


FLOOR_S = 300.0
"""Seconds of a worker run's warm samples whose least value stands for a :data:`RUN_FIGURES` figure (:func:`floors`):
a micro-batch in flight, a Spark job's Python workers or a burst of reader threads raise single samples, a leak raises
them all. Shorter than :data:`WARM_S`, so the window of a warm sample holds samples of the same runs only."""


def floors(points: list[tuple[float, float]], window_h: float) -> list[tuple[float, float]]:
    """Each point (hours, value) with the least value of ``points`` within ``window_h`` hours before it, itself
    included: the level a figure comes back to between transients, which a leak raises."""
    return [(x, min(v for t, v in points if x - window_h <= t <= x)) for x, _ in points]


def run_period_h(samples: list[dict]) -> float | None:
    """Hours between two successive worker runs' starts (the median; a start is a sample's time less a run's
    ``worker_ages_s``, starts within a minute are one); None with fewer than two starts."""
    starts = sorted(s["minutes"] - a / 60 for s in samples for a in s.get("worker_ages_s", ()))
    distinct = [t for i, t in enumerate(starts) if i == 0 or t - starts[i - 1] > 1.0]
    gaps = [b - a for a, b in zip(distinct, distinct[1:])]
    return statistics.median(gaps) / 60 if gaps else None


def across_runs(points: list[tuple[float, float]], period_h: float) -> tuple[float, float, float, int]:
    """The change per hour of a worker runs' figure from one run to the next, at the same age: each point
    (hours, value) against the point one ``period_h`` before it (the nearest, within a 40th of the period or half
    the sampling interval), as a slope; (the median slope, its 95% interval by order statistics, the pairs). A run that grows
    while it serves and is then replaced draws a sawtooth; the difference at one period removes it, and what is
    left is what the next run inherits: the growth that would last for weeks."""
    xs = sorted(x for x, _ in points)
    within = max(period_h / 40, statistics.median([b - a for a, b in zip(xs, xs[1:])] or [0]) / 2)
    slopes = []
    for x, y in points:
        earlier = min(points, key=lambda p: abs(x - p[0] - period_h))
        if abs(x - earlier[0] - period_h) <= within:
            slopes.append((y - earlier[1]) / (x - earlier[0]))
    n = len(slopes)
    if n < 3:
        return 0.0, 0.0, 0.0, n
    slopes.sort()
    k = max(0, math.floor((n - TREND_Z * math.sqrt(n)) / 2))
    return statistics.median(slopes), slopes[k], slopes[min(n - 1, n - 1 - k)], n


def verdicts(samples: list[dict], tables: int, workers: int | None = None) -> list[dict]:
    """Each :data:`BOUNDS` figure's slope per hour over the second half of ``samples`` (by ``minutes``) with its
    95% interval: :func:`trend`, or for the :data:`RUN_FIGURES` the change from one worker run to the next of their
    :func:`floors` over the :func:`steady` samples (:func:`across_runs`; ``workers``: the deployment's worker runs); its bound and the
    verdict: ``pass`` when the interval's upper end is within the bound (shown flat), ``FAIL`` when its lower end
    is above it (shown growing), else ``noisy`` (neither shown: a longer run decides); only ``pass`` passes. Fewer
    than 3 samples (or pairs): ``too few samples``."""
    end = samples[-1]["minutes"]
    half = [s for s in samples if s["minutes"] >= end / 2]
    warm = steady(half, workers)
    first, last = (half[0], half[-1]) if half else ({"events": 0, "dagster_mib": 0.0},) * 2
    events_per_mib = (last["events"] - first["events"]) / max(1e-9, last["dagster_mib"] - first["dagster_mib"])
    period = run_period_h(samples)
    out = []
    for b in BOUNDS:
        run_figure = b.figure in RUN_FIGURES
        pts = [(s["minutes"] / 60, y) for s in (warm if run_figure else half) if (y := figure(s, b.figure)) is not None]
        if run_figure and period is not None:
            k, low, high, paired = across_runs(floors(pts, FLOOR_S / 3600), period)
        else:
            (k, low, high), paired = trend(pts), len(pts)
        limit = b.limit
        if b.figure == "events":
            limit = EVENTS_GOAL * tables
        elif b.figure == "dagster_mib":
            limit = EVENTS_GOAL * tables / events_per_mib if events_per_mib > 0 else 0.0
        verdict = "pass" if high <= limit else "FAIL" if low > limit else "noisy"
        out.append({"figure": b.figure, "unit": b.unit, "slope_h": k, "low_h": low, "high_h": high, "limit_h": limit})
        out[-1].update(verdict=verdict if paired >= 3 else "too few samples", points=paired, why=b.why)
        out[-1]["ok"] = out[-1]["verdict"] == "pass"
    return out


def exactly_once(settings: Settings, produced: dict[str, int]) -> dict[str, tuple[int, int, int]]:
    """Identifier -> (rows, distinct (partition, offset), produced) of each table, read by DuckDB."""
    catalog, out = load_catalog(settings.catalog), {}
    con = duck.connect()
    for identifier, expected in produced.items():
        table = catalog.load_table(identifier)
        total, distinct = con.execute(
            "SELECT count(*), count(DISTINCT (_kafka_partition, _kafka_offset)) "
            f"FROM {duck.scan_sql(table.metadata_location)}"
        ).fetchone()
        out[identifier] = (total, distinct, expected)
    return out


def say(text: str = "") -> None:
    print(text, flush=True)


def declare(path: Path, n: int, max_snapshots: int) -> None:
    """The N tables of ``make bench --many N`` (:func:`devtools.bench.many.write_tables_file`), each with
    ``maintenance.max_snapshots`` = ``max_snapshots`` and ``retain_last`` a third of it: the ceiling that
    bounds a streaming table's snapshots is then crossed within the soak's first half (at the default
    1,000 a table committing every half minute reaches it after about 8 hours)."""
    write_tables_file(path, n)
    doc = yaml.safe_load(path.read_text())
    for t in doc["tables"]:
        t["maintenance"] = {**(t.get("maintenance") or {}), "max_snapshots": max_snapshots}
        t["maintenance"]["retain_last"] = max(1, max_snapshots // 3)
    path.write_text(yaml.safe_dump(doc))


def _prepare(work: Path, n: int, max_snapshots: int) -> tuple[Settings, Path, dict[str, str]]:
    """A fresh ``work`` directory with a broker, the N tables' topics and declarations (:func:`declare`), and a
    Dagster home; returns the settings, the Dagster home and the deployment's environment."""
    if work.exists():
        devbroker.stop(work / "kafka")
        shutil.rmtree(work)
    work.mkdir(parents=True)
    bootstrap = devbroker.start(work / "kafka", devbroker.free_port())
    settings = bench_settings(work / "lake", bootstrap)
    config = KafkaConfig.from_settings(settings)
    for name in names(n):
        demo_data.create_topic(config, f"many.{name}", PARTITIONS, {"retention.ms": "-1"})
    home = work / "dagster_home"
    home.mkdir()
    shutil.copy(CHECKOUT / "dagster.yaml", home / "dagster.yaml")
    declare(work / "tables.yaml", n, max_snapshots)
    return settings, home, daemon_env(settings, home, work / "tables.yaml", work)


def _stream(args, settings: Settings, home: Path, env: dict[str, str], work: Path) -> tuple[list[dict], dict]:
    """Run the deployment under the load for ``args.minutes``, sampling every ``args.sample_s`` seconds into
    ``work/samples.jsonl``; returns the samples and the records produced per table (identifier -> count)."""
    config, kafka = KafkaConfig.from_settings(settings), KafkaMetadata(KafkaConfig.from_settings(settings))
    topics, df = [f"many.{x}" for x in names(args.tables)], demo_data.load_frame("flights")
    for t in topics:  # priming: creates the tables, starts the workers
        demo_data.produce(config, t, flights_records(df, 0, 10))
    daemon = start_daemon(home, env, work / "daemon.log")
    samples, out = [], (work / "samples.jsonl").open("a")
    try:
        say(
            f"priming: 10 records per table committed {wait_caught_up(settings, kafka, args.tables, 1800):.0f} s after start"
        )
        spread = Spread(config, df, topics, args.rate)
        spread.start()
        t0, sid = time.monotonic(), os.getsid(daemon.pid)
        say(header())
        while True:
            s = sample(sid, settings, home, topics, t0)
            samples.append(s)
            out.write(json.dumps(s) + "\n")
            out.flush()
            say(row(s))
            left = args.minutes * 60 - (time.monotonic() - t0)
            if left <= 1:
                break
            time.sleep(min(args.sample_s, left))
        spread.stop_event.set()
        spread.join(120)
        try:
            say(
                f"producer stopped; every table caught up {wait_caught_up(settings, kafka, args.tables, 3600):.0f} s later"
            )
        except TimeoutError as exc:  # the report still runs: the exactly-once check names what is missing
            say(f"producer stopped; {exc}")
    finally:
        out.close()
        stop_daemon(daemon)
    produced = {t: 10 + len(spread.delivered[t]) for t in topics}
    if spread.errors:
        say(f"producer errors: {len(spread.errors)}, first: {spread.errors[0]}")
    return samples, produced


def report(args, samples: list[dict], tallies: dict[str, tuple[int, int, int]], workers: int, work: Path) -> dict:
    """Print the slopes, the events per table per hour and the exactly-once check (``tallies``:
    :func:`exactly_once`); write ``summary.json``; return the summary (``ok``: whether all hold; ``checks``:
    :func:`verdicts`; ``tallies``; ``samples``)."""
    checks = verdicts(samples, args.tables, workers)
    say()
    say(
        f"second half ({samples[-1]['minutes'] / 2:.0f} .. {samples[-1]['minutes']:.0f} min; the worker runs' figures "
        f"over {checks[0]['points']} samples, or pairs one run apart, with {workers} worker run(s) of at least "
        f"{WARM_S / 60:.0f} min, none during a handover): Theil-Sen slope per hour [its 95% interval]"
    )
    for c in checks:
        say(
            f"  {c['figure']:<20} {c['slope_h']:>+12.2f} {c['unit']}/h [{c['low_h']:+.2f}, {c['high_h']:+.2f}]  "
            f"|  bound <= {c['limit_h']:.2f} {c['unit']}/h ({c['why']})  {c['verdict']}"
        )
    per_table = next(c for c in checks if c["figure"] == "events")["slope_h"] / args.tables
    say(f"Dagster events per table per hour: {per_table:.1f}  |  goal <= {EVENTS_GOAL}")
    exact = sum(t == d == p for t, d, p in tallies.values())
    say(
        f"exactly once: {exact} of {args.tables} tables (count = distinct (partition, offset) = produced); "
        f"{sum(p for _, _, p in tallies.values()):,} records produced"
    )
    for identifier, (t, d, p) in sorted(tallies.items()):
        if not t == d == p:
            say(f"  {identifier}: rows {t:,}, distinct {d:,}, produced {p:,}")
    ok = all(c["ok"] for c in checks) and exact == args.tables and per_table <= EVENTS_GOAL
    summary = {"args": vars(args), "checks": checks, "events_per_table_h": per_table, "exact": exact, "ok": ok}
    summary.update(workers=workers, commit=args.commit, judged_by=_commit(), tallies=tallies)
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    say(
        f"soak {'PASSED' if ok else 'FAILED'} (commit {summary['commit']}, judged by {summary['judged_by']}, "
        f"{samples[-1]['minutes']:.0f} min of load)"
    )
    return {**summary, "samples": samples}


def rejudge(work: Path) -> dict:
    """Judge a finished soak in ``work`` again by this checkout's :func:`verdicts`: its ``samples.jsonl`` and the
    arguments, worker count and exactly-once tallies of its ``summary.json`` (raises FileNotFoundError without
    them); prints and rewrites the summary as :func:`report` does (``judged_by``: this checkout)."""
    samples = [json.loads(line) for line in (work / "samples.jsonl").read_text().splitlines() if line.strip()]
    old = json.loads((work / "summary.json").read_text())
    args = argparse.Namespace(**old["args"])
    tallies = {k: tuple(v) for k, v in old["tallies"].items()}
    return report(args, samples, tallies, old["workers"], work)


def _commit() -> str:
    """The checkout's short commit id, ``-dirty`` when tracked files differ from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=CHECKOUT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=CHECKOUT).returncode != 0
    return head.stdout.strip() + ("-dirty" if dirty else "")


def run_soak(args, work: Path) -> dict:
    """The soak (module docstring) in ``work``; returns :func:`report`'s summary. Stops its broker at the end."""
    args.commit = _commit()  # the checkout the deployment loads now (HEAD may move while it runs)
    say(
        f"soak: {args.tables} tables, {args.rate} records/s in total for {args.minutes:g} min, a sample every "
        f"{args.sample_s:g} s into {work / 'samples.jsonl'}  ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"commit {args.commit}, nproc {os.cpu_count()})"
    )
    try:
        settings, home, env = _prepare(work, args.tables, args.max_snapshots)
        samples, produced = _stream(args, settings, home, env, work)
        workers = worker_count(args.tables, settings.catalog.is_sqlite, os.cpu_count())  # LAKE_WORKERS unset
        return report(args, samples, exactly_once(settings, produced), workers, work)
    finally:
        devbroker.stop(work / "kafka")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """``--minutes``, ``--sample-s``, ``--tables``, ``--rate``, ``--max-snapshots`` (defaults: the ``SOAK_*``
    variables, else 120, 60, 100, 200, 60); ``--rejudge``: :func:`rejudge` the last soak instead."""
    env = os.environ
    ap = argparse.ArgumentParser(prog="make soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=float(env.get("SOAK_MINUTES") or 120))
    ap.add_argument("--sample-s", type=float, default=float(env.get("SOAK_SAMPLE_S") or 60))
    ap.add_argument("--tables", type=int, default=int(env.get("SOAK_TABLES") or 100))
    ap.add_argument("--rate", type=int, default=int(env.get("SOAK_RATE") or 200))
    ap.add_argument("--max-snapshots", type=int, default=int(env.get("SOAK_MAX_SNAPSHOTS") or 60))
    ap.add_argument("--rejudge", action="store_true", help="judge the last soak's samples again (rejudge)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("LAKE_DEV", "1")  # as under make: the development defaults where nothing is set
    lake_home = Path(os.environ.get("LAKE_HOME") or CHECKOUT / ".lake").resolve()
    if args.rejudge:
        return 0 if rejudge(lake_home / "soak")["ok"] else 1
    return 0 if run_soak(args, lake_home / "soak")["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
