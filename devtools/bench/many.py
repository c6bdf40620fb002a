"""Many tables on one deployment: N tables under a steady total load, a burst and a backlog of N x R records.

``scripts/bench.py --many N [--workers W] [--minutes M] [--rate R] [--backlog B]`` declares N tables
(the flights declaration on N fresh topics of 2 partitions), runs ``dagster-daemon run`` on this
checkout's code location (``LAKE_WORKERS=W`` when ``--workers`` is given; else the count the catalog derives) on
the SQLite catalog, then on a dev PostgreSQL one (``--catalog`` picks one), and measures:

- steady load: ``--rate`` records/s in total, spread round-robin over the N topics (record
  timestamp = produce time) for ``--minutes``; per table, freshness = commit time of the first
  ``main`` snapshot holding a record's offset minus its timestamp (p50, p90, max), and exactly once
  (DuckDB: count = distinct (partition, offset) = records produced);
- burst: once the steady load caught up, ``--backlog`` records more per table produced at once into the
  running deployment (its worker still serving): the seconds from the first record produced to the
  last commit, against the same raw consume rate;
- the runs the daemon launched, peak resident memory (the sum over the daemon's process group:
  daemon, code server, run workers, their JVMs) and CPU seconds per wall second;
- backlog: ``--backlog`` records more per table produced while nothing ingests, then the seconds
  from the daemon's start to the commit of the last micro-batch, once every table caught up, against
  the raw consume rate of the same topics in the same run.

The tables keep the flights declaration's ``max_records_per_partition`` (50,000), as a team would.
"""

from __future__ import annotations

import itertools
import os
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import yaml
from confluent_kafka import Producer

from devtools import duck
from devtools.bench.common import CHECKOUT, flights_records, raw_consume, say, section
from devtools.bench.freshness import daemon_env, pct, start_daemon, stop_daemon
from devtools.demo import data as demo_data
from kafka_iceberg.catalog.tables import load_catalog, metadata_view
from kafka_iceberg.config.settings import Settings
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata
from kafka_iceberg.state import ancestors, batch_ranges, state_at

PARTITIONS = 2
LAG = {"max_offset_lag": 1, "max_interval": "1s", "interval": "1s", "window": 10}


def names(n: int) -> list[str]:
    return [f"t{i:03d}" for i in range(n)]


def write_tables_file(path: Path, n: int) -> None:
    """N tables: the flights declaration on topics ``many.t000`` ... as ``many.t000`` ..."""
    doc = yaml.safe_load((CHECKOUT / "kafka_iceberg" / "defs" / "nyc" / "defs.yaml").read_text())["attributes"]
    flights = next(t for t in doc["tables"] if t["name"] == "flights")
    tables = []
    for name in names(n):
        t = dict(flights)
        t.update(
            name=f"many_{name}",
            identifier=f"many.{name}",
            topic=f"many.{name}",
            lag=LAG,
            description="many-tables benchmark",
        )
        tables.append(t)
    path.write_text(yaml.safe_dump({"defaults": doc.get("defaults") or {}, "tables": tables}))


class Spread(threading.Thread):
    """Produces ``rate`` records/s in total round-robin over ``topics`` (timestamp = now, ms);
    ``delivered[topic]`` maps (partition, offset) -> timestamp ms."""

    def __init__(self, config: KafkaConfig, df, topics: list[str], rate: int):
        super().__init__(daemon=True)
        self.config, self.df, self.topics, self.rate = config, df, topics, rate
        self.delivered: dict[str, dict[tuple[int, int], int]] = {t: {} for t in topics}
        self.errors: list[str] = []
        self.stop_event = threading.Event()

    def _report(self, err, msg) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.delivered[msg.topic()][(msg.partition(), msg.offset())] = msg.timestamp()[1]

    def _records(self):
        """(key, value) of rows 0, 1, .. of the flights frame (cycling every 300,000), rendered 5,000 at a time:
        one pandas call per tick of a few records took a third of a core from the deployment it measures."""
        start = 0
        while True:
            yield from ((key, value) for key, value, _ in flights_records(self.df, start, 5_000))
            start = (start + 5_000) % 300_000

    def run(self) -> None:
        producer = Producer(self.config.client_conf(**{"enable.idempotence": True, "linger.ms": 5}))
        t0, sent, records = time.monotonic(), 0, self._records()
        while not self.stop_event.is_set():
            due = int((time.monotonic() - t0) * self.rate) - sent
            for key, value in itertools.islice(records, max(0, due)):
                topic = self.topics[sent % len(self.topics)]
                producer.produce(
                    topic,
                    key=key,
                    value=value,
                    timestamp=int(time.time() * 1000),
                    partition=(sent // len(self.topics)) % PARTITIONS,
                    on_delivery=self._report,
                )
                sent += 1
            producer.poll(0.02)
        producer.flush(60)


class GroupSampler(threading.Thread):
    """Samples the resident memory (bytes) and CPU time (seconds) of every process in session ``sid``."""

    def __init__(self, sid: int):
        super().__init__(daemon=True)
        self.sid, self.peak_rss, self.cpu_s = sid, 0, {}
        self.at_peak: list[tuple[int, str]] = []  # (bytes, command) of each process at the peak
        self.stop_event = threading.Event()
        self.tick = os.sysconf("SC_CLK_TCK")

    def run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self.stop_event.wait(1.0):
            rss, procs = 0, []
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text()
                except OSError:
                    continue
                fields = stat[stat.rindex(")") + 2 :].split()
                if int(fields[3]) != self.sid:  # field 6 of stat: the session id
                    continue
                rss += int(fields[21]) * page
                procs.append((int(fields[21]) * page, _command(pid)))
                self.cpu_s[pid] = (int(fields[11]) + int(fields[12])) / self.tick
            if rss > self.peak_rss:
                self.peak_rss, self.at_peak = rss, sorted(procs, reverse=True)


def _command(pid: str) -> str:
    """A short name of process ``pid``: java, or the Dagster command (daemon, code server, a run's job)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    if argv and argv[0].endswith("java"):
        return "java"
    words = [a for a in argv[1:] if a and not a.startswith("-")]
    return " ".join(Path(w).name if "/" in w else w for w in words[:4])[:60] or "?"


def behind(settings: Settings, kafka: KafkaMetadata, tables: set[str]) -> set[str]:
    """The ``tables`` (names) whose committed offsets have not reached their topic's high watermarks."""
    catalog = load_catalog(settings.catalog)
    marks = kafka.watermarks_many(sorted(f"many.{x}" for x in tables))
    out = set()
    for name in tables:
        try:
            view = metadata_view(catalog.load_table(f"many.{name}"))
        except Exception:  # noqa: BLE001 - not created yet
            out.add(name)
            continue
        offsets = state_at(view.snapshots, view.main).offsets
        if any(offsets.get(p, w.low) < w.high for p, w in (marks[f"many.{name}"] or {}).items()):
            out.add(name)
    return out


def wait_caught_up(settings: Settings, kafka: KafkaMetadata, n: int, timeout_s: float, poll_s: float = 1.0) -> float:
    """Seconds until all ``n`` tables caught up with their topics, whose records must no longer grow,
    looking every ``poll_s`` seconds. A table that caught up is not read again, so the polling takes
    little of the machine."""
    t0, pending = time.monotonic(), set(names(n))
    while time.monotonic() - t0 < timeout_s:
        pending = behind(settings, kafka, pending)
        if not pending:
            return time.monotonic() - t0
        time.sleep(poll_s)
    raise TimeoutError(f"{len(pending)} of the {n} tables did not catch up within {timeout_s:.0f} s")


def logged_commits(home: Path) -> dict[str, dict[tuple[int, int], int]]:
    """Per table name (the asset key's last part), (partition, offset) -> when the first materialization
    whose ``offset_ranges`` hold it was logged (ms since epoch, just after its commit): the commit times
    of the snapshots that ``maintenance.max_snapshots`` expired before the report reads the table."""
    from dagster import DagsterEventType, DagsterInstance

    os.environ["DAGSTER_HOME"] = str(home)
    out: dict[str, dict[tuple[int, int], int]] = {}
    with DagsterInstance.get() as instance:
        for run in instance.get_runs():
            for event in instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION):
                mat = event.dagster_event.event_specific_data.materialization
                ranges = mat.metadata.get("offset_ranges")
                first = out.setdefault(mat.asset_key.path[-1], {})
                for p, r in (ranges.value if ranges is not None else {}).items():
                    for off in range(r["start"], r["end"]):
                        first.setdefault((int(p), off), int(event.timestamp * 1000))
    return out


def table_report(
    settings: Settings, name: str, delivered: dict[tuple[int, int], int], expected: int, logged: dict
) -> dict:
    """Freshness (s) of the records ``delivered`` and the exactly-once figures of table ``name``: a record
    lands with the first ``main`` snapshot whose ``kafka.batch`` holds it, or, if that snapshot was
    expired, when its materialization was logged (``logged``: :func:`logged_commits` of the table)."""
    table = load_catalog(settings.catalog).load_table(f"many.{name}")
    view = metadata_view(table)
    first: dict[tuple[int, int], int] = {}
    for snap in reversed(ancestors(view.snapshots, view.main)):
        for p, (start, end) in batch_ranges(snap).items():
            for off in range(start, end):
                first.setdefault((p, off), snap.timestamp_ms)
    for key, ms in logged.items():
        first[key] = min(ms, first.get(key, ms))
    timed = [(ts, (first[k] - ts) / 1000) for k, ts in delivered.items() if k in first]
    fresh = [f for _, f in timed]
    total, distinct = (
        duck.connect()
        .execute(
            "SELECT count(*), count(DISTINCT (_kafka_partition, _kafka_offset)) "
            f"FROM {duck.scan_sql(table.metadata_location)}"
        )
        .fetchone()
    )
    return {
        "p50": pct(fresh, 0.5),
        "p90": pct(fresh, 0.9),
        "p99": pct(fresh, 0.99),
        "max": max(fresh, default=float("nan")),
        "rows": total,
        "distinct": distinct,
        "expected": expected,
        "missing": len(delivered) - len(fresh),
        "timed": timed,
    }


WINDOW_S = 30
"""Seconds of produce time per window of :func:`by_window`."""


def by_window(steady: dict) -> list[float]:
    """p90 freshness (s) over every table's records produced in each :data:`WINDOW_S`-second window of the
    steady load, in order: where a tail comes from (a hand-over, a burst of reports, a run starting beside)."""
    timed = [pair for r in steady.values() for pair in r["timed"]]
    if not timed:
        return []
    t0 = min(ts for ts, _ in timed)
    windows: dict[int, list[float]] = {}
    for ts, fresh in timed:
        windows.setdefault(int((ts - t0) / 1000 // WINDOW_S), []).append(fresh)
    return [pct(windows[w], 0.9) for w in sorted(windows)]


def _env(settings: Settings, home: Path, tables: Path, tmp: Path, workers: int | None) -> dict[str, str]:
    """The deployment's environment: the defaults, with ``LAKE_WORKERS`` only when ``workers`` is given."""
    return daemon_env(settings, home, tables, tmp, **({"LAKE_WORKERS": str(workers)} if workers else {}))


def _produce_backlog(config: KafkaConfig, df, topics: list[str], per_topic: int, offset: int) -> None:
    for t in topics:
        demo_data.produce(config, t, flights_records(df, offset, per_topic))


def _burst(
    settings: Settings, config: KafkaConfig, kafka: KafkaMetadata, df, topics: list[str], per_topic: int
) -> dict:
    """A burst into the running deployment: ``per_topic`` records more per topic, built first, then produced at
    once by one idempotent producer (:func:`devtools.demo.data.produce_topics`) while the worker serves; timed
    from the first record handed to the producer to the last commit of the tables once every one caught up."""
    records = {t: list(flights_records(df, 2000, per_topic)) for t in topics}
    started_ms = time.time() * 1000
    demo_data.produce_topics(config, records)
    produced_s = time.time() - started_ms / 1000
    wait_caught_up(settings, kafka, len(topics), 900, poll_s=5.0)
    commit_ms = _commits_after(settings, topics, started_ms)
    return {
        "records": per_topic * len(topics),
        "produced_s": produced_s,
        "drain_s": (max(commit_ms) - started_ms) / 1000,
        "first_commit_s": (min(commit_ms) - started_ms) / 1000,
    }


def _commits_after(settings: Settings, topics: list[str], started_ms: float) -> list[int]:
    """Commit times (ms since epoch) of the ingest snapshots on ``main`` of the topics' tables after ``started_ms``."""
    catalog = load_catalog(settings.catalog)
    out = []
    for t in topics:
        view = metadata_view(catalog.load_table(t))
        out += [
            s.timestamp_ms
            for s in ancestors(view.snapshots, view.main)
            if s.timestamp_ms > started_ms and batch_ranges(s)
        ]
    return out


def _runs(home: Path) -> dict[str, int]:
    """Runs of the deployment at ``home``, counted by job name."""
    from dagster import DagsterInstance

    os.environ["DAGSTER_HOME"] = str(home)
    with DagsterInstance.get() as instance:
        return dict(Counter(r.job_name for r in instance.get_runs()))


def run_many(args, tmp: Path, settings: Settings) -> dict:
    """The many-tables benchmark (module docstring). Returns the figures it printed."""
    n, workers = args.many, args.workers
    section(
        f"(7) many tables: {n} tables, {workers or 'the default number of'} worker(s), {args.rate} records/s in total for "
        f"{args.minutes:g} min, then a backlog of {n} x {args.backlog:,} records; catalog on "
        f"{'SQLite' if settings.catalog.is_sqlite else 'PostgreSQL'}"
    )
    config = KafkaConfig.from_settings(settings)
    kafka = KafkaMetadata(config)
    topics = [f"many.{x}" for x in names(n)]
    for t in topics:
        demo_data.create_topic(config, t, PARTITIONS, {"retention.ms": "-1"})
    home = tmp / "dagster_home"
    home.mkdir(parents=True)
    shutil.copy(CHECKOUT / "dagster.yaml", home / "dagster.yaml")
    write_tables_file(tmp / "tables.yaml", n)
    env = _env(settings, home, tmp / "tables.yaml", tmp, workers)
    df = demo_data.load_frame("flights")
    _produce_backlog(config, df, topics, 10, 0)  # priming: creates the tables, starts the workers
    daemon = start_daemon(home, env, tmp / "daemon.log")
    sampler = GroupSampler(os.getsid(daemon.pid))
    sampler.start()
    t_start = time.monotonic()
    try:
        say(f"priming: 10 records per table committed {wait_caught_up(settings, kafka, n, 900):.1f} s after start")
        spread = Spread(config, df, topics, args.rate)
        spread.start()
        time.sleep(args.minutes * 60)
        spread.stop_event.set()
        spread.join(120)
        say(
            f"steady load: {sum(map(len, spread.delivered.values())):,} records, table caught up "
            f"{wait_caught_up(settings, kafka, n, 900):.1f} s after the producer stopped"
        )
        burst = _burst(settings, config, kafka, df, topics, args.backlog)
        say(
            f"burst: {burst['records']:,} records produced in {burst['produced_s']:.1f} s into the running "
            f"deployment, all committed {burst['drain_s']:.1f} s after the first was produced"
        )
    finally:
        stop_daemon(daemon)
    wall = time.monotonic() - t_start
    sampler.stop_event.set()
    logged = logged_commits(home)
    steady = {
        name: table_report(
            settings,
            name,
            spread.delivered[f"many.{name}"],
            10 + len(spread.delivered[f"many.{name}"]) + args.backlog,
            logged.get(name, {}),
        )
        for name in names(n)
    }
    backlog = _backlog(args, tmp, settings, config, kafka, df, topics, env, spread)
    backlog["burst"] = burst
    return _print_many(n, workers, steady, backlog, sampler, wall, _runs(home))


def _backlog(args, tmp, settings, config, kafka, df, topics, env, spread) -> dict:
    """Backlog of ``args.backlog`` records per table: raw consume of the same topics, then the drain."""
    _produce_backlog(config, df, topics, args.backlog, 1000)
    produced = {t: 10 + len(spread.delivered[t]) + 2 * args.backlog for t in topics}  # the burst's and the backlog's
    raw = [raw_consume(config, t, list(range(PARTITIONS))) for t in topics]
    raw_rate = sum(r["records"] for r in raw) / max(1e-9, sum(r["seconds"] for r in raw))
    started_ms = time.time() * 1000
    daemon = start_daemon(Path(env["DAGSTER_HOME"]), env, tmp / "daemon-backlog.log")
    try:
        # the drain is timed by its commits: a slow poll leaves the machine to the deployment
        polled_s = wait_caught_up(settings, kafka, len(topics), 3600, poll_s=5.0)
    finally:
        stop_daemon(daemon)
    catalog = load_catalog(settings.catalog)
    commit_ms, exact = _commits_after(settings, topics, started_ms), 0
    for t in topics:
        table = catalog.load_table(t)
        total, distinct = (
            duck.connect()
            .execute(
                "SELECT count(*), count(DISTINCT (_kafka_partition, _kafka_offset)) "
                f"FROM {duck.scan_sql(table.metadata_location)}"
            )
            .fetchone()
        )
        exact += total == distinct == produced[t]
    records = len(topics) * args.backlog
    startup_s = (min(commit_ms) - started_ms) / 1000 if commit_ms else 0.0
    # the drain ends at the last micro-batch's commit (the poll above sees it up to a second later)
    drain_s = (max(commit_ms) - started_ms) / 1000 if commit_ms else polled_s
    return {
        "records": records,
        "drain_s": drain_s,
        "startup_s": startup_s,
        # one commit (a backlog one micro-batch takes) has no span after the first commit
        "after_start_ratio": records / (drain_s - startup_s) / raw_rate if drain_s - startup_s > 0.001 else None,
        "rate": records / drain_s,
        "raw_rate": raw_rate,
        "ratio": records / drain_s / raw_rate,
        "exact_tables": exact,
    }


def _met(ratio: float) -> str:
    """The backlog goal next to a drain ratio: a deployment's drain from its first commit, and a burst into a
    running one (a cold start of the whole deployment is printed beside them, docs/benchmark.md#goal-7-many-tables)."""
    return f"goal >= 0.25: {'met' if ratio >= 0.25 else 'not met'}"


def _print_many(n, workers, steady, backlog, sampler, wall, runs) -> dict:
    exact = sum(r["rows"] == r["distinct"] == r["expected"] and r["missing"] == 0 for r in steady.values())
    p50s = sorted(r["p50"] for r in steady.values())
    worst = {k: max(r[k] for r in steady.values()) for k in ("p50", "p90", "p99", "max")}
    goal = "p99 <= 2 s" if n == 1 else "p50 <= 3 s, p90 <= 10 s"
    say(
        f"  per table freshness p50 {p50s[0]:.1f} .. {p50s[-1]:.1f} s (median {p50s[len(p50s) // 2]:.1f} s); "
        f"worst p90 {worst['p90']:.1f} s, p99 {worst['p99']:.1f} s; worst record {worst['max']:.1f} s  |  goal: every table {goal}"
    )
    say(
        f"  p90 freshness per {WINDOW_S} s of produce time, all tables: "
        + " ".join(f"{v:.1f}" for v in by_window(steady))
    )
    if n > 10:
        say("  the 3 tables of the highest p50:")
    for name, r in steady.items() if n <= 10 else sorted(steady.items(), key=lambda kv: -kv[1]["p50"])[:3]:
        say(
            f"    {name}  p50 {r['p50']:6.1f} s  p90 {r['p90']:6.1f} s  p99 {r['p99']:6.1f} s  max {r['max']:6.1f} s  "
            f"rows {r['rows']:,}"
        )
    say(f"  exactly once: {exact} of {n} tables (count = distinct (partition, offset) = produced)")
    say(
        f"  runs launched {sum(runs.values())} ({', '.join(f'{j} x{c}' for j, c in sorted(runs.items()))}); "
        f"peak resident memory {sampler.peak_rss / 2**30:.2f} GiB "
        f"(daemon, code server, runs, JVMs){'  |  goal <= 3 GiB' if n > 1 else ''}; "
        f"CPU {sum(sampler.cpu_s.values()) / wall:.2f} cores on average"
    )
    say("    at the peak: " + ", ".join(f"{cmd} {b / 2**20:,.0f} MiB" for b, cmd in sampler.at_peak[:8]))
    say(
        f"  backlog {backlog['records']:,} records drained in {backlog['drain_s']:.1f} s = {backlog['rate']:,.0f} "
        f"records/s against raw consume {backlog['raw_rate']:,.0f} records/s: ratio {backlog['ratio']:.3f} "
        f"counting the deployment's start; "
        f"exactly once {backlog['exact_tables']} of {n} tables"
    )
    after = backlog["after_start_ratio"]
    say(
        f"    of which {backlog['startup_s']:.1f} s before the first commit (daemon, sensor, run and Spark start); "
        "from it on: ratio " + (f"{after:.3f}  |  {_met(after)}" if after is not None else "- (one commit)")
    )
    burst = backlog["burst"]
    burst["ratio"] = burst["records"] / burst["drain_s"] / backlog["raw_rate"]
    say(
        f"  burst of {burst['records']:,} records into the running deployment (produced in {burst['produced_s']:.1f} s): "
        f"committed {burst['drain_s']:.1f} s after the first was produced (first commit at {burst['first_commit_s']:.1f} s) "
        f"= {burst['records'] / burst['drain_s']:,.0f} records/s: ratio {burst['ratio']:.3f} against the same raw consume"
        f"  |  {_met(burst['ratio'])}"
    )
    return {
        "tables": n,
        "workers": workers,
        "worst": worst,
        "median_p50": p50s[len(p50s) // 2],
        "exact": exact,
        "runs": runs,
        "peak_rss": sampler.peak_rss,
        "backlog": backlog,
    }
