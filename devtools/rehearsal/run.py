"""Failure rehearsal: faults injected while producers write continuously, then a reconciliation of
every produced record against the table and its dead-letter table.

Run by ``make rehearse`` (``scripts/rehearse.py``, full size) and by the tests marked
``rehearsal`` (a smaller size, part of ``make test``). Each scenario gets its own topic and
table on a broker and catalog of its own, so faults never touch anything else.

The sink is a separate process (``python -m devtools.rehearsal.run sink ...``) running micro-batches
of one table with its own Spark, exactly like a materialization: it can be SIGKILLed as a
process group (driver, JVM and Python workers at once), stopped, and restarted.

The reconciliation (:func:`reconcile`) reads the table and the dead-letter table with DuckDB,
straight from their Iceberg metadata, and compares them with what the producers' delivery
reports say was written, by (partition, offset) and by value:

* ``lost``: a produced record (not in an aborted transaction, not in an accepted gap) that is
  in neither table;
* ``duplicates``: a (partition, offset) present more than once across both tables;
* ``mismatched``: a row whose values differ from the record produced at its offset;
* ``unexpected``: a row for an offset no producer wrote (or that belongs to an aborted
  transaction).

It also counts leaks (:func:`devtools.rehearsal.leaks.count_leaks`: unreachable snapshots, orphan files,
branches left, unpublished dead-letter rows) after the scenario's final catch-up, whose duration
is the ``recover s`` column. A scenario passes when all four are 0, no leak exceeds the bound
(0 once a micro-batch ran recovery after the last fault; see docs/operations.md) and its own
fault-specific expectations hold.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from devtools import duck
from devtools.demo.data import create_topic
from devtools.polling import wait_for
from devtools.progress import progress_bar
from devtools.rehearsal.leaks import Leaks, count_leaks
from devtools.services import cleanup, devbroker
from kafka_iceberg.batch.context import CRASH_POINTS
from kafka_iceberg.batch.planning import offset_lag
from kafka_iceberg.catalog.tables import load_catalog, load_table, metadata_view, read_state
from kafka_iceberg.config.models import DevHooks
from kafka_iceberg.config.settings import CHECKOUT, Settings, load_settings
from kafka_iceberg.declaration.spec import TableSpec, parse_table_spec
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata
from kafka_iceberg.ops.checks import freshness
from kafka_iceberg.state import ancestors, overlapping_batches

BASE_TS_MS = 1_700_000_000_000
SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "event_time", "type": "timestamp", "required": True},
]


def event_value(i: int) -> bytes:
    """The JSON value of rehearsal event ``i`` (``id`` = i)."""
    return json.dumps(
        {"id": i, "name": f"n{i}", "amount": i * 0.5, "event_time": f"2024-01-{1 + i % 28:02d}T{i % 24:02d}:00:00Z"}
    ).encode()


def table_declaration(name: str, topic: str, bound: int) -> dict:
    """A tables.yaml-style declaration of a rehearsal table (``rehearsal.<name>``)."""
    return {
        "name": name,
        "identifier": f"rehearsal.{name}",
        "topic": topic,
        "schema": SCHEMA,
        "partition_by": ["days(event_time)"],
        "max_records_per_partition": bound,
        "kafka_columns": ["partition", "offset", "timestamp"],
        "freshness": {"max_snapshot_age": "10m", "max_valid_through_age": "none"},
        "bad_records": {"policy": "quarantine", "max_quarantine_rate": 1},
    }


# -- producers ------------------------------------------------------------------------------------
class Traffic(threading.Thread):
    """A producer writing rehearsal events to ``topic`` continuously, ``rate`` records per second,
    until :meth:`stop`. Every ``bad_every``-th record is malformed JSON (it must be quarantined).
    With ``abort_every``, it writes in transactions and aborts every ``abort_every``-th one.

    ``delivered`` maps (partition, offset) -> value bytes from the delivery reports;
    ``aborted`` holds the (partition, offset) of records in aborted transactions, and
    ``aborted_transactions`` counts those transactions.
    """

    def __init__(
        self, config: KafkaConfig, topic: str, rate: float, bad_every: int = 0, abort_every: int = 0, start_id: int = 0
    ):
        super().__init__(daemon=True, name=f"traffic-{topic}")
        self.config, self.topic, self.rate = config, topic, rate
        self.bad_every, self.abort_every = bad_every, abort_every
        self.next_id = start_id
        self.delivered: dict[tuple[int, int], bytes] = {}
        self.aborted: set[tuple[int, int]] = set()
        self.aborted_transactions = 0
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def _producer(self):
        """A new idempotent producer; with ``abort_every``, a transactional one of a new transactional id (so a
        new producer id), its transactions initialised.

        A new one replaces each producer that aborted: the dev broker (noida-db 0.2.3) answers every fetch
        with all of a partition's aborted transactions, also those whose abort marker lies before the fetch
        offset (Kafka's broker sends only those overlapping the fetched range). librdkafka then takes the
        producer's later committed records for aborted ones, and a read_committed fetch that starts after its
        first abort returns nothing of it. Stale entries of a retired producer id match no later record; the
        reader still meets aborted records and markers mid-range."""
        from confluent_kafka import Producer

        conf = {"enable.idempotence": True, "linger.ms": 5, "message.timeout.ms": 300_000}
        if not self.abort_every:
            return Producer(self.config.client_conf(**conf))
        conf["transactional.id"] = f"rehearsal-{self.topic}-{uuid.uuid4().hex[:6]}"
        conf["message.timeout.ms"] = conf["transaction.timeout.ms"] = 120_000
        producer = Producer(self.config.client_conf(**conf))
        producer.init_transactions(60)
        return producer

    def run(self) -> None:
        try:
            self._produce()
        except Exception as exc:  # reported by the scenario as "producer delivered everything: no"
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _produce(self) -> None:
        producer = self._producer()
        txn = 0
        tick = 0.1
        while not self._halt.is_set():
            t0 = time.monotonic()
            batch: list[tuple[int, int]] = []

            def on_delivery(err, msg, batch=batch):
                if err is not None:
                    self.errors.append(str(err))
                    return
                with self._lock:
                    self.delivered[(msg.partition(), msg.offset())] = msg.value()
                batch.append((msg.partition(), msg.offset()))

            n = max(1, int(self.rate * tick))
            if self.abort_every:
                producer.begin_transaction()
            for _ in range(n):
                i = self.next_id
                self.next_id += 1
                value = (
                    b'{"id": ' + str(i).encode() + b', "broken'
                    if self.bad_every and i % self.bad_every == 0
                    else event_value(i)
                )
                producer.produce(
                    self.topic, key=str(i).encode(), value=value, timestamp=BASE_TS_MS + i, on_delivery=on_delivery
                )
            if self.abort_every:
                txn += 1
                producer.flush(120)
                if txn % self.abort_every == 0:
                    producer.abort_transaction(120)
                    with self._lock:
                        self.aborted.update(batch)
                        self.aborted_transactions += 1
                    producer = self._producer()  # see _producer: a new producer id after each abort
                else:
                    producer.commit_transaction(120)
            else:
                producer.poll(0)
            time.sleep(max(0.0, tick - (time.monotonic() - t0)))
        producer.flush(300)

    def stop(self) -> None:
        """Stop producing and wait until every record is delivered (or reported failed)."""
        self._halt.set()
        self.join(330)

    def expected(self) -> dict[tuple[int, int], bytes]:
        """Records that must end up in the table or the dead-letter table: delivered, not aborted."""
        with self._lock:
            return {k: v for k, v in self.delivered.items() if k not in self.aborted}


# -- the sink process -------------------------------------------------------------------------------
def _sink_main(declaration: str, mode: str, commit_prefix: str) -> int:
    """Entry point of the sink process: micro-batches until caught up (``mode=catch-up``: the
    committed offsets reached the high watermarks seen when the process started, so it ends
    even while producers keep writing) or forever (``mode=loop``). Prints one JSON line per
    micro-batch. Exit code 0 when caught up, 3 on a LakeError, 4 on anything else (the error
    on stderr)."""
    from devtools.rehearsal.faults import env_crash_hook
    from kafka_iceberg.batch.pipeline import run_micro_batch
    from kafka_iceberg.catalog.spark import get_spark
    from kafka_iceberg.errors import LakeError

    settings = load_settings()
    spec = parse_table_spec(json.loads(declaration))
    spark = get_spark(settings)
    n = 0
    try:
        kafka = KafkaMetadata(KafkaConfig.from_settings(settings))
        target = {p: w.high for p, w in kafka.watermarks(spec.topic).items()}
        while True:
            n += 1
            result = run_micro_batch(
                spark, settings, spec, commit_id=f"{commit_prefix}-{n}", kafka=kafka, crash_hook=env_crash_hook()
            )
            print(
                json.dumps(
                    {
                        "records": result.records,
                        "quarantined": result.quarantined,
                        "lag": result.total_lag,
                        "committed": result.committed,
                        "group_commit_error": result.group_commit_error,
                    }
                ),
                flush=True,
            )
            if mode == "catch-up" and all(result.offsets.get(p, 0) >= high for p, high in target.items()):
                return 0
            if mode == "loop" and result.total_lag == 0:
                time.sleep(0.5)
    except LakeError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        _alert_failure(spec.identifier, commit_prefix, exc)
        return 3
    except Exception as exc:  # not one of ours: reported as unclean
        text = str(exc).strip().splitlines()
        print(f"unexpected {type(exc).__name__}: {text[0][:500] if text else ''}", file=sys.stderr, flush=True)
        return 4


def _alert_failure(identifier: str, run_id: str, exc: Exception) -> None:
    """Post the alert a failed materialization gets (what Dagster's run-failure sensor sends, see
    ``kafka_iceberg.sensors.alerts``) through :class:`kafka_iceberg.ops.alerts.AlertSink`: to Slack
    when ``SLACK_BOT_TOKEN`` is set (a rehearsal points ``SLACK_API_BASE_URL`` at a recorder); nothing
    otherwise, so the error stays the sink's last stderr line."""
    from kafka_iceberg.ops.alerts import Alert, AlertSink

    sink = AlertSink.from_env()
    if not sink.configured:
        return
    line = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    sink.send(
        Alert(
            table=identifier,
            asset_key_path=["lake", *identifier.split(".")],
            measure="run_status",
            value="FAILURE",
            severity="ERROR",
            summary=f"micro-batch {run_id} of {identifier} failed: {line}",
            source="run failure",
            extra={"error": line},
        )
    )


@dataclass
class Lake:
    """Where a rehearsal runs: its own ``LAKE_HOME``, broker and catalog.

    ``env`` is what sink processes get on top of ``os.environ``.
    """

    home: Path
    broker_dir: Path
    bootstrap: str
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self, hooks: Mapping[str, float] | None = None, **more: str) -> dict[str, str]:
        """The environment of a sink process (strings only); ``hooks`` override keys of ``LAKE_DEV_HOOKS``
        (runs are sequential here: an attempt 5 s old is dead; a read task fails after 60 s without progress)."""
        dev_hooks = DevHooks(**{"attempt_timeout_s": 5, "read_timeout_s": 60, **(hooks or {})})
        return {
            **os.environ,
            "LAKE_HOME": str(self.home),
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "SPARK_MASTER": "local[1]",
            "LAKE_SPARK_CONF": json.dumps({"spark.driver.memory": "1g"}),
            "LAKE_DEV_HOOKS": dev_hooks.env_value(),
            "LAKE_KAFKA_TIMEOUT_S": "20",
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
            **more,
        }

    @property
    def settings(self) -> Settings:
        """Settings as the sink processes see them."""
        return load_settings(env=self.env())

    @property
    def kafka_config(self) -> KafkaConfig:
        return KafkaConfig(self.bootstrap, {}, 20.0)

    def sink(
        self,
        declaration: dict,
        mode: str = "catch-up",
        crash_at: str | None = None,
        hooks: Mapping[str, float] | None = None,
        **env: str,
    ) -> subprocess.Popen:
        """Start a sink process in its own process group (so it can be killed whole); ``hooks``: see :meth:`env`."""
        more = dict(env)
        if crash_at:
            more["LAKE_CRASH_AT"] = crash_at
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "devtools.rehearsal.run",
                "sink",
                json.dumps(declaration),
                mode,
                f"rehearsal-{uuid.uuid4().hex[:8]}",
            ],
            env=self.env(hooks, **more),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            cwd=str(CHECKOUT),
        )

    def catch_up(
        self, declaration: dict, timeout_s: float = 600, hooks: Mapping[str, float] | None = None, **env: str
    ) -> subprocess.CompletedProcess:
        """Run a sink until the table has no lag; returns the finished process (rc 0 = caught up)."""
        proc = self.sink(declaration, "catch-up", hooks=hooks, **env)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s whole process group (driver, Spark JVM, Python workers) and wait until no
    member is left.

    Raises:
        RuntimeError: a member of the group was still alive 30 s later.
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise RuntimeError(f"process group {proc.pid} did not exit after SIGKILL")


# -- reconciliation -------------------------------------------------------------------------------
@dataclass
class Tally:
    """Every produced record, accounted for (records)."""

    produced: int
    in_table: int
    quarantined: int
    lost: int
    duplicates: int
    mismatched: int
    unexpected: int
    examples: list = field(default_factory=list)
    leaks: Leaks | None = None  # counted after the reconciliation (None: the table does not exist)
    recover_s: float | None = None  # seconds the final catch-up took (None: the scenario ran none)

    @classmethod
    def total(cls, tallies: list[Tally]) -> Tally:
        """The sum of several tables' tallies (records), with their first 10 examples; no leaks counted."""
        counts = ("produced", "in_table", "quarantined", "lost", "duplicates", "mismatched", "unexpected")
        return cls(
            **{k: sum(getattr(t, k) for t in tallies) for k in counts},
            examples=[e for t in tallies for e in t.examples][:10],
        )

    @property
    def leaks_beyond_bound(self) -> int:
        """Leaks beyond the bound: all of them once a final catch-up ran recovery after the last
        fault (the bound is then 0); 0 while no catch-up followed (the window is still open)."""
        return self.leaks.beyond_bound(recovered=self.recover_s is not None) if self.leaks else 0

    @property
    def clean(self) -> bool:
        """Nothing lost, duplicated, altered or invented."""
        return not (self.lost or self.duplicates or self.mismatched or self.unexpected)


def _scan(catalog, identifier: str, columns: str) -> list[tuple]:
    table = load_table(catalog, identifier)
    if table is None or table.current_snapshot() is None:
        return []
    con = duck.connect(s3=dict(table.io.properties) if table.metadata_location.startswith("s3") else None)
    return con.execute(f"SELECT {columns} FROM {duck.scan_sql(table.metadata_location)}").fetchall()


def reconcile(
    catalog, spec: TableSpec, expected: dict[tuple[int, int], bytes], excluded: set[tuple[int, int]] = frozenset()
) -> Tally:
    """Compare ``expected`` ((partition, offset) -> produced value) with the table and its
    dead-letter table, read by DuckDB. ``excluded`` offsets (an accepted gap) must be in neither."""
    rows = _scan(catalog, spec.identifier, "_kafka_partition, _kafka_offset, id, name, amount")
    dead = _scan(catalog, spec.bad_records.dead_letter_identifier, '"partition", "offset", "value"')
    seen: dict[tuple[int, int], int] = {}
    mismatched, unexpected, examples = 0, 0, []
    for p, o, i, name, amount in rows:
        seen[(p, o)] = seen.get((p, o), 0) + 1
        value = expected.get((p, o))
        if value is None:
            unexpected += 1
            examples.append(("unexpected table row", p, o))
        elif value != event_value(i) or name != f"n{i}" or amount != i * 0.5:
            mismatched += 1
            examples.append(("mismatched", p, o))
    for p, o, value in dead:
        seen[(p, o)] = seen.get((p, o), 0) + 1
        if (p, o) not in expected:
            unexpected += 1
            examples.append(("unexpected dead letter", p, o))
        elif bytes(value) != expected[(p, o)]:
            mismatched += 1
            examples.append(("mismatched dead letter", p, o))
    want = set(expected) - set(excluded)
    lost = sorted(want - set(seen))
    leaks = _count_leaks(catalog, spec)
    in_gap = [k for k in excluded if k in seen]
    examples += [("lost", *k) for k in lost[:5]] + [("in accepted gap", *k) for k in in_gap[:5]]
    return Tally(
        produced=len(expected),
        in_table=len(rows),
        quarantined=len(dead),
        lost=len(lost),
        duplicates=sum(n - 1 for n in seen.values()),
        mismatched=mismatched,
        unexpected=unexpected + len(in_gap),
        examples=examples[:10],
        leaks=leaks,
        recover_s=_CATCH_UP_S.get(spec.identifier),
    )


_CATCH_UP_S: dict[str, float] = {}
"""Table identifier -> seconds its last successful final catch-up took (recorded by
:meth:`Rehearsal._final_catch_up`, read by :func:`reconcile`; one rehearsal process)."""


def _count_leaks(catalog, spec: TableSpec) -> Leaks | None:
    if load_table(catalog, spec.identifier) is None:
        return None
    return count_leaks(catalog, spec.identifier, spec.bad_records.dead_letter_identifier)


@dataclass
class ScenarioResult:
    """One row of the rehearsal table."""

    scenario: str
    faults: int
    tally: Tally
    checks: dict[str, bool] = field(default_factory=dict)  # scenario-specific expectations
    notes: str = ""
    seconds: float = 0.0

    @property
    def leaks(self) -> Leaks | None:
        """The leak counts after the reconciliation (see :class:`Tally`)."""
        return self.tally.leaks

    @property
    def recover_s(self) -> float | None:
        """Seconds the final catch-up took (None: the scenario ran none)."""
        return self.tally.recover_s

    @property
    def passed(self) -> bool:
        """Reconciled exactly, no leak beyond the bound, and every scenario-specific expectation held."""
        return self.tally.clean and not self.tally.leaks_beyond_bound and all(self.checks.values())


def format_table(results: list[ScenarioResult]) -> str:
    """The rehearsal results as a fixed-width text table."""
    head = (
        "scenario",
        "faults",
        "produced",
        "in table",
        "quarantined",
        "duplicates",
        "lost",
        "leaks",
        "recover s",
        "result",
        "s",
    )
    rows = [head] + [
        (
            r.scenario,
            str(r.faults),
            str(r.tally.produced),
            str(r.tally.in_table),
            str(r.tally.quarantined),
            str(r.tally.duplicates),
            str(r.tally.lost),
            _leak_cell(r.tally),
            "-" if r.tally.recover_s is None else f"{r.tally.recover_s:.0f}",
            "PASS" if r.passed else "FAIL",
            f"{r.seconds:.0f}",
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in results:
        failed = [k for k, ok in r.checks.items() if not ok]
        leaked = r.tally.leaks is not None and r.tally.leaks.total
        if failed or r.notes or r.tally.examples or leaked:
            lines.append(
                f"  {r.scenario}: {r.notes}"
                + (f" FAILED: {failed}" if failed else "")
                + (f" examples: {r.tally.examples}" if r.tally.examples else "")
                + (f" leaks: {r.tally.leaks.describe()}" if leaked else "")
            )
    return "\n".join(lines)


def _leak_cell(tally: Tally) -> str:
    """Leaks beyond the bound; ``n open`` when leaks remain but no catch-up closed the window."""
    if tally.leaks is None:
        return "-"
    if tally.recover_s is None and tally.leaks.total:
        return f"{tally.leaks.total} open"
    return str(tally.leaks_beyond_bound)


def _validation_words(report: dict) -> str:
    v = report.get("validation") or {}
    if not v:
        return "none"
    return (
        f"{'valid' if v.get('valid') else 'MISMATCH'}, {v.get('records_compared')} records compared, "
        f"missing {v.get('missing')}, extra {v.get('extra')}, differing {v.get('differing')}"
    )


# -- scenarios ------------------------------------------------------------------------------------
class Rehearsal:
    """The scenarios, on one :class:`Lake`. Each returns a :class:`ScenarioResult`."""

    def __init__(self, lake: Lake, log: Callable[[str], None] = print, seed: int | None = None):
        self.lake, self.log = lake, log
        self.rng = random.Random(seed)
        self.catalog = load_catalog(lake.settings.catalog)
        self.kafka = KafkaMetadata(lake.kafka_config)

    def _table(self, name: str, partitions: int, bound: int) -> tuple[dict, TableSpec]:
        topic = f"rehearsal.{name}"
        create_topic(self.lake.kafka_config, topic, partitions, {"retention.ms": "-1"})
        decl = table_declaration(name, topic, bound)
        return decl, parse_table_spec(decl)

    def _lag(self, spec: TableSpec) -> int:
        state = read_state(self.catalog, spec.identifier)
        return sum(offset_lag(self.kafka.watermarks(spec.topic), state.offsets).values())

    def _no_leftovers(self, spec: TableSpec) -> bool:
        """No attempt branches left on the table or its dead-letter table."""
        for ident in (spec.identifier, spec.bad_records.dead_letter_identifier):
            table = load_table(self.catalog, ident)
            if table is not None and [r for r in table.metadata.refs if r != "main"]:
                return False
        return True

    def _no_overlaps(self, spec: TableSpec) -> bool:
        view = metadata_view(load_table(self.catalog, spec.identifier))
        return not overlapping_batches(ancestors(view.snapshots, view.main))

    def _final_catch_up(self, decl: dict, checks: dict[str, bool], timeout_s: float = 3600) -> None:
        """Catch the table up after the faults (its seconds are the ``recover s`` column). The budget is
        wide: after 20 kills on a loaded machine the backlog is 100k+ records in bounded micro-batches."""
        time.sleep(5.5)  # older than attempt_timeout_s (Lake.env): any attempt left is dead now
        t0 = time.monotonic()
        done = self.lake.catch_up(decl, timeout_s=timeout_s)
        if done.returncode == 0:
            _CATCH_UP_S[decl["identifier"]] = time.monotonic() - t0
        checks["caught up"] = done.returncode == 0
        if done.returncode != 0:
            self.log(
                f"final catch-up of {decl['identifier']} failed after {time.monotonic() - t0:.0f} s "
                f"(rc {done.returncode}{'; killed at the time limit' if done.returncode == -9 else ''}): "
                + done.stderr[-2000:]
            )

    def kills(self, n: int = 20, rate: float = 150.0) -> ScenarioResult:
        """SIGKILL the sink ``n`` times while a producer writes: the first kills at each crash point in
        turn (after the branch, after the read, between the write and the publish, after the publish
        before the consumer-group commit), the rest either at a random crash point or from outside
        at a random moment (startup, reading, writing data files, committing). Then catch up."""
        t0 = time.monotonic()
        decl, spec = self._table(f"kills_{uuid.uuid4().hex[:6]}", 3, 2000)
        traffic = Traffic(self.lake.kafka_config, spec.topic, rate, bad_every=97)
        traffic.start()
        time.sleep(2)
        kinds: dict[str, int] = {}
        for i in range(n):
            if i < len(CRASH_POINTS):
                point = CRASH_POINTS[i]
            else:
                point = self.rng.choice([*CRASH_POINTS, "external", "external", "external"])
            if point == "external":
                proc = self.lake.sink(decl, "loop")
                time.sleep(self.rng.uniform(3.0, 25.0))
                kill_group(proc)
            else:
                proc = self.lake.sink(decl, "loop", crash_at=point)
                try:
                    proc.wait(timeout=240)
                except subprocess.TimeoutExpired:
                    pass
                kill_group(proc)  # the JVM and workers of a self-killed driver go too
            kinds[point] = kinds.get(point, 0) + 1
            self.log(f"  kill {i + 1}/{n}: {point} (rc {proc.returncode})")
        traffic.stop()
        checks = {"producer delivered everything": not traffic.errors}
        self._final_catch_up(decl, checks)
        checks["no attempt branches left"] = self._no_leftovers(spec)
        checks["no overlapping snapshot ranges"] = self._no_overlaps(spec)
        tally = reconcile(self.catalog, spec, traffic.expected())
        checks["bad records quarantined"] = tally.quarantined > 0
        return ScenarioResult("repeated kills", n, tally, checks, f"kill points {kinds}", time.monotonic() - t0)

    def sink_outage(self, produce_s: float = 12.0, rate: float = 200.0) -> ScenarioResult:
        """Stop the sink, let lag build across several micro-batches while the producer writes,
        restart it: it catches up in bounded batches, freshness recovers, no duplicates."""
        t0 = time.monotonic()
        bound = 150
        decl, spec = self._table(f"sink_{uuid.uuid4().hex[:6]}", 2, bound)
        decl["freshness"] = {"max_snapshot_age": "5s", "max_valid_through_age": "none"}
        spec = parse_table_spec(decl)
        traffic = Traffic(self.lake.kafka_config, spec.topic, rate)
        traffic.start()
        time.sleep(1)
        first = self.lake.catch_up(decl)  # the sink runs, then stops
        time.sleep(produce_s)  # the sink is down; lag builds
        lag_built = self._lag(spec)
        view = metadata_view(load_table(self.catalog, spec.identifier))
        stale = freshness(
            spec, view, offset_lag(self.kafka.watermarks(spec.topic), read_state(self.catalog, spec.identifier).offsets)
        )
        restarted = self.lake.sink(decl, "loop")
        time.sleep(5)
        traffic.stop()
        # the restarted sink keeps going until it has nothing left (generous: on a loaded machine the
        # first catch-up takes longer, so the backlog built meanwhile is larger)
        deadline = time.monotonic() + 1800
        while self._lag(spec) > 0 and time.monotonic() < deadline:
            time.sleep(1)
        kill_group(restarted)
        out = restarted.stdout.read().decode().splitlines()
        batches = [json.loads(line) for line in out if line.startswith("{")]
        view = metadata_view(load_table(self.catalog, spec.identifier))
        fresh = freshness(
            spec, view, offset_lag(self.kafka.watermarks(spec.topic), read_state(self.catalog, spec.identifier).offsets)
        )
        checks = {
            "first sink caught up": first.returncode == 0,
            "lag built beyond one micro-batch": lag_built > 2 * bound * 2,
            "freshness check failed while the sink was down": not stale.passed,
            "caught up after restart": self._lag(spec) == 0,
            "several bounded micro-batches": sum(1 for b in batches if b["records"]) >= 3,
            "freshness check passes again": fresh.passed,
            "no overlapping snapshot ranges": self._no_overlaps(spec),
        }
        tally = reconcile(self.catalog, spec, traffic.expected())
        return ScenarioResult(
            "sink stop and restart",
            1,
            tally,
            checks,
            f"lag built {lag_built} records; {len(batches)} micro-batches after restart",
            time.monotonic() - t0,
        )

    def broker_outage(self, down_s: float = 8.0, rate: float = 150.0) -> ScenarioResult:
        """Stop the Kafka service (noida-db) while a micro-batch runs and producers write, start it
        again: the run retries and succeeds or fails cleanly, and the next run catches up."""
        t0 = time.monotonic()
        decl, spec = self._table(f"broker_{uuid.uuid4().hex[:6]}", 2, 100_000)
        traffic = Traffic(self.lake.kafka_config, spec.topic, rate)
        traffic.start()
        time.sleep(3)
        proc = self.lake.sink(decl, "catch-up", hooks={"read_timeout_s": 30})
        time.sleep(self.rng.uniform(4.0, 9.0))
        devbroker.stop_kafka(self.lake.broker_dir)
        time.sleep(down_s)
        devbroker.start_kafka(self.lake.broker_dir)
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
        time.sleep(3)
        traffic.stop()
        rc = proc.returncode
        err_text = err.decode()
        clean = rc in (0, 3)  # caught up, or failed with one of the write path's own errors
        if not clean:
            self.log(err_text[-3000:])
        checks = {
            "the run retried and succeeded or failed cleanly": clean,
            "producer delivered everything": not traffic.errors,
        }
        self._final_catch_up(decl, checks)
        checks["no overlapping snapshot ranges"] = self._no_overlaps(spec)
        tally = reconcile(self.catalog, spec, traffic.expected())
        outcome = (
            "succeeded after the outage"
            if rc == 0
            else f"failed cleanly ({err_text.strip().splitlines()[-1][:120] if err_text.strip() else rc})"
        )
        return ScenarioResult("broker outage mid-run", 1, tally, checks, f"the run {outcome}", time.monotonic() - t0)

    def catalog_lock(self, short_s: float = 10.0, long_s: float = 40.0, rate: float = 150.0) -> ScenarioResult:
        """SQLite catalog locked by another process mid-run: held shorter than the retry budget, the run
        waits and commits; held longer, it fails with CatalogUnavailableError and commits nothing;
        the next run catches up. (Only on a SQLite catalog.)"""
        import sqlite3
        from contextlib import closing

        t0 = time.monotonic()
        decl, spec = self._table(f"lock_{uuid.uuid4().hex[:6]}", 2, 100_000)
        db = self.lake.settings.catalog.sqlalchemy_uri[len("sqlite:///") :]
        traffic = Traffic(self.lake.kafka_config, spec.topic, rate)
        traffic.start()
        time.sleep(2)
        first = self.lake.catch_up(decl)

        locked_mid_run: dict[float, bool] = {}
        namespace, name = spec.identifier.rsplit(".", 1)

        def metadata_location() -> str | None:
            with closing(sqlite3.connect(db, timeout=30)) as conn:
                row = conn.execute(
                    "SELECT metadata_location FROM iceberg_tables WHERE table_namespace = ? AND table_name = ?",
                    (namespace, name),
                ).fetchone()
            return row[0] if row else None

        def hold(seconds: float, before: str | None):
            # lock as soon as the run has made its first commit (its attempt branch; the catalog row's
            # metadata location moves): mid-run, between its catalog calls. Polled every 10 ms in the
            # catalog row itself, so a short attempt is not missed between two table loads.
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                if metadata_location() != before:
                    locked_mid_run[seconds] = True
                    break
                time.sleep(0.01)
            conn = sqlite3.connect(db, timeout=120, isolation_level=None)
            conn.execute("BEGIN EXCLUSIVE")
            time.sleep(seconds)
            conn.execute("COMMIT")
            conn.close()

        results = {}
        for label, hold_s, budget in (("short lock", short_s, 60), ("long lock", long_s, 4)):
            locker = threading.Thread(target=hold, args=(hold_s, metadata_location()), daemon=True)
            locker.start()
            done = self.lake.catch_up(decl, hooks={"catalog_retry_s": budget})
            locker.join(240)
            results[label] = done
        traffic.stop()
        short, long_ = results["short lock"], results["long lock"]
        checks = {
            "first run caught up": first.returncode == 0,
            # the lock was taken while the run's attempt branch existed; the run committed anyway. The
            # Python-side retry logs "transient catalog error"; no retry is logged when the lock ends
            # before the run's next catalog call (a read phase longer than the lock) or meets only Spark's
            # own JDBC calls, which wait on SQLite's busy timeout
            "short lock taken mid-run, run committed": short.returncode == 0 and locked_mid_run.get(short_s, False),
            "long lock: failed clearly": long_.returncode == 3 and "CatalogUnavailableError" in long_.stderr,
        }
        retried = "transient catalog error" in short.stderr
        notes = (
            f"short lock: rc {short.returncode}, taken mid-run {locked_mid_run.get(short_s, False)}, "
            f"retry logged {'yes' if retried else 'no'}; "
            f"long lock: rc {long_.returncode}, taken mid-run {locked_mid_run.get(long_s, False)}"
        )
        if not all(checks.values()):
            self.log(short.stderr[-1500:] + "\n" + long_.stderr[-1500:])
        self._final_catch_up(decl, checks)
        checks["no attempt branches left"] = self._no_leftovers(spec)
        tally = reconcile(self.catalog, spec, traffic.expected())
        return ScenarioResult("catalog locked (SQLite)", 2, tally, checks, notes, time.monotonic() - t0)

    def postgres_outage(self, down_s: float = 8.0, long_s: float = 30.0, rate: float = 150.0) -> ScenarioResult:
        """The same lake on a PostgreSQL catalog (a private server from :mod:`devtools.services.devpostgres`),
        stopped mid-run: down shorter than the retry budget, the run reconnects and commits; down
        longer, it fails with CatalogUnavailableError and publishes nothing; the next run catches up."""
        from devtools.services import devpostgres

        t0 = time.monotonic()
        server = devpostgres.create(Path(tempfile.mkdtemp(prefix="pg-outage-", dir=self.lake.home)))
        try:
            pg_lake = Lake(
                self.lake.home,
                self.lake.broker_dir,
                self.lake.bootstrap,
                extra_env={
                    "LAKE_CATALOG_NAME": "pg",
                    "LAKE_CATALOG_URI": server.uri,
                    "LAKE_WAREHOUSE": f"file://{self.lake.home / 'pg-warehouse'}",
                },
            )
            pg = Rehearsal(pg_lake, self.log)
            decl, spec = pg._table(f"pg_{uuid.uuid4().hex[:6]}", 2, 100_000)
            traffic = Traffic(pg_lake.kafka_config, spec.topic, rate)
            traffic.start()
            time.sleep(2)
            first = pg_lake.catch_up(decl)

            def outage(after_s: float, seconds: float):
                time.sleep(after_s)
                server.stop()
                time.sleep(seconds)
                server.start()

            results = {}
            for label, down, budget in (("short outage", down_s, 90), ("long outage", long_s, 4)):
                downer = threading.Thread(target=outage, args=(7.0, down), daemon=True)
                downer.start()
                results[label] = pg_lake.catch_up(decl, hooks={"catalog_retry_s": budget})
                downer.join(120)
            traffic.stop()
            short, long_ = results["short outage"], results["long outage"]
            checks = {
                "first run caught up": first.returncode == 0,
                "short outage: retried, then committed": short.returncode == 0,
                "long outage: failed clearly": long_.returncode == 3 and "CatalogUnavailableError" in long_.stderr,
            }
            if not all(checks.values()):
                self.log(short.stderr[-1500:] + "\n" + long_.stderr[-1500:])
            pg.catalog = load_catalog(pg_lake.settings.catalog)  # this process's pooled connections died too
            pg._final_catch_up(decl, checks)
            checks["no attempt branches left"] = pg._no_leftovers(spec)
            checks["no overlapping snapshot ranges"] = pg._no_overlaps(spec)
            tally = reconcile(pg.catalog, spec, traffic.expected())
            retried = "transient catalog error" in short.stderr
            return ScenarioResult(
                "catalog down (PostgreSQL)",
                2,
                tally,
                checks,
                f"short outage {'retried' if retried else 'did not hit a catalog call'}",
                time.monotonic() - t0,
            )
        finally:
            server.destroy()

    def transactions(self, seconds: float = 8.0, rate: float = 200.0) -> ScenarioResult:
        """Transactional producers, every 3rd transaction aborted, while the sink runs; the sink is stopped
        after its first commit while they go on, so the final catch-up reads from mid-log, past earlier
        aborts: the table holds exactly the committed records (read_committed); markers and aborted
        records leave offset gaps that are never counted as loss."""
        t0 = time.monotonic()
        decl, spec = self._table(f"txn_{uuid.uuid4().hex[:6]}", 2, 100_000)
        traffic = Traffic(self.lake.kafka_config, spec.topic, rate, abort_every=3)
        traffic.start()
        sink = self.lake.sink(decl, "loop")
        committed = wait_for(lambda: read_state(self.catalog, spec.identifier).offsets, 120, 0.5)
        time.sleep(seconds)
        kill_group(sink)
        time.sleep(3)
        traffic.stop()
        checks = {
            "producer delivered everything": not traffic.errors,
            "the sink committed before its stop": bool(committed),
        }
        self._final_catch_up(decl, checks)
        tally = reconcile(self.catalog, spec, traffic.expected())
        checks["aborted transactions happened"] = bool(traffic.aborted)
        return ScenarioResult(
            "offset gaps (transactions)",
            traffic.aborted_transactions,
            tally,
            checks,
            f"{traffic.aborted_transactions} aborted transactions holding {len(traffic.aborted)} "
            "records, which must not appear; the last read from mid-log",
            time.monotonic() - t0,
        )

    def retention_loss(self, rate: float = 150.0) -> ScenarioResult:
        """Records deleted (as retention would) before the table read them: the run fails with
        DataLossError, nothing is skipped silently; ``accept-gap`` records the gap in the snapshot
        summary and the table continues after it, holding everything but the accepted gap."""
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import AdminClient

        t0 = time.monotonic()
        decl, spec = self._table(f"retention_{uuid.uuid4().hex[:6]}", 2, 100_000)
        traffic = Traffic(self.lake.kafka_config, spec.topic, rate)
        traffic.start()
        time.sleep(2)
        first = self.lake.catch_up(decl)
        time.sleep(3)
        state = read_state(self.catalog, spec.identifier)
        high = self.kafka.watermarks(spec.topic)[0].high
        cut = state.offsets[0] + (high - state.offsets[0]) // 2
        admin = AdminClient(self.lake.kafka_config.client_conf())
        for fut in admin.delete_records([TopicPartition(spec.topic, 0, cut)]).values():
            fut.result(timeout=30)
        gap = {(0, o) for o in range(state.offsets[0], cut)}
        failed = self.lake.catch_up(decl)
        accept = self._cli(
            decl, "accept-gap", "--table", spec.identifier, "--reason", "rehearsal: retention expired", "--yes"
        )
        time.sleep(2)
        traffic.stop()
        checks = {
            "first run caught up": first.returncode == 0,
            "the run failed with DataLossError": failed.returncode == 3 and "DataLossError" in failed.stderr,
            "accept-gap succeeded": accept.returncode == 0,
        }
        if accept.returncode != 0:
            self.log(accept.stderr[-2000:])
        self._final_catch_up(decl, checks)
        state = read_state(self.catalog, spec.identifier)
        checks["the gap is in the snapshot summary"] = any(
            g["partition"] == 0 and g["end"] == cut for g in state.accepted_gaps
        )
        tally = reconcile(self.catalog, spec, traffic.expected(), excluded=gap)
        checks["in table + quarantined + accepted gap = produced"] = (
            tally.in_table + tally.quarantined + len(gap) == tally.produced
        )
        return ScenarioResult(
            "retention loss + accept-gap",
            1,
            tally,
            checks,
            f"{len(gap)} records deleted before ingest and accepted as a gap",
            time.monotonic() - t0,
        )

    def backfill_from_offset(self, rate: float = 200.0) -> ScenarioResult:
        """Backfill from a known offset into a new table (``make replay``) while producers keep writing:
        the replay table holds exactly the original's records from those offsets up to the original's
        committed offsets, and the replay's own validation (Spark, EXCEPT ALL both ways) agrees."""
        t0 = time.monotonic()
        decl, spec = self._table(f"backfill_{uuid.uuid4().hex[:6]}", 3, 100_000)
        traffic = Traffic(self.lake.kafka_config, spec.topic, rate, bad_every=53)
        traffic.start()
        time.sleep(4)
        first = self.lake.catch_up(decl)
        committed = read_state(self.catalog, spec.identifier).offsets
        start = {p: o // 3 for p, o in committed.items()}
        target = f"rehearsal.{decl['name']}_backfill"
        replay = self._cli(
            decl,
            "replay",
            "--table",
            spec.identifier,
            "--from",
            ",".join(f"{p}:{o}" for p, o in sorted(start.items())),
            "--to",
            ",".join(f"{p}:{o}" for p, o in sorted(committed.items())),
            "--into",
            target,
            "--validate",
            "--json",
        )
        traffic.stop()
        report = json.loads(replay.stdout.strip().splitlines()[-1]) if replay.stdout.strip() else {}
        if replay.returncode != 0:
            self.log(replay.stderr[-2000:])
        expected = {k: v for k, v in traffic.expected().items() if start[k[0]] <= k[1] < committed[k[0]]}
        replay_spec = parse_table_spec(
            {**decl, "name": f"{decl['name']}_backfill", "identifier": target, "topic": spec.topic}
        )
        checks = {
            "original caught up": first.returncode == 0,
            "replay validated against the original": replay.returncode == 0,
            "original untouched": read_state(self.catalog, spec.identifier).offsets == committed,
        }
        tally = reconcile(self.catalog, replay_spec, expected)
        return ScenarioResult(
            "backfill from a known offset",
            0,
            tally,
            checks,
            f"replayed {sorted(start.items())} .. {sorted(committed.items())} into {target}; "
            f"validation: {_validation_words(report)}",
            time.monotonic() - t0,
        )

    def _cli(self, decl: dict, *args: str) -> subprocess.CompletedProcess:
        """Run an operator command (``python -m kafka_iceberg.lake_assets.cli ...``) on this lake, with ``decl`` as
        the only declared table; returns the finished process (text output)."""
        return subprocess.run(
            [sys.executable, "-m", "kafka_iceberg.lake_assets.cli", *args],
            env=self.lake.env(LAKE_TABLES_FILE=str(self._tables_file(decl))),
            capture_output=True,
            text=True,
            cwd=str(CHECKOUT),
        )

    def _tables_file(self, decl: dict) -> Path:
        import yaml

        path = self.lake.home / f"tables-{decl['name']}.yaml"
        path.write_text(yaml.safe_dump({"tables": [decl]}))
        return path


Scenario = Callable[[Rehearsal, argparse.Namespace], ScenarioResult]
KILLS = 20
"""SIGKILLs of the ``kills`` and ``dagster_cli_kills`` scenarios without ``--kills``; the CDC scenarios, whose
kills take a minute or more each (a Debezium workload to catch up), keep their own defaults (their ``KILLS``)."""


def kills_or(args: argparse.Namespace, default: int) -> int:
    """``--kills`` when given (0 included), else the scenario's ``default``."""
    return default if args.kills is None else args.kills


# name -> scenario, in the order ``make rehearse`` runs them. Scenarios that live in other devtools
# modules register here through :data:`SCENARIO_MODULES` (each module's ``register(SCENARIOS)``).
SCENARIOS: dict[str, Scenario] = {
    "kills": lambda r, args: r.kills(kills_or(args, KILLS)),
    **{
        name: (lambda r, args, name=name: getattr(r, name)())
        for name in (
            "sink_outage",
            "broker_outage",
            "catalog_lock",
            "postgres_outage",
            "transactions",
            "retention_loss",
            "backfill_from_offset",
        )
    },
}
SCENARIO_MODULES: tuple[str, ...] = (
    "devtools.rehearsal.dagster_runs",
    "devtools.rehearsal.mock",
    "devtools.rehearsal.cdc",
    "devtools.rehearsal.consistent_cdc",
    "devtools.rehearsal.storage",
    "devtools.rehearsal.acl",
    "devtools.rehearsal.workers",
    "devtools.rehearsal.maintenance_loop",
    "devtools.rehearsal.deploy",
    "devtools.rehearsal.soak",
)


def _load_scenarios() -> dict[str, Scenario]:
    """:data:`SCENARIOS` plus those registered by :data:`SCENARIO_MODULES`."""
    import importlib

    scenarios = dict(SCENARIOS)
    for module in SCENARIO_MODULES:
        importlib.import_module(module).register(scenarios)
    return scenarios


def _kill_defaults() -> dict[str, int]:
    """Scenario -> its SIGKILLs without ``--kills``, for the scenarios of :data:`SCENARIO_MODULES` that keep their
    own (a module's ``KILL_DEFAULTS``)."""
    import importlib

    return {k: n for m in SCENARIO_MODULES for k, n in getattr(importlib.import_module(m), "KILL_DEFAULTS", {}).items()}


def main(argv: list[str] | None = None) -> int:
    """``python -m devtools.rehearsal.run [--kills N] [--only a,b] [--seed S]``: run the rehearsal on a
    fresh lake under ``$LAKE_HOME/rehearsal`` with a broker of its own; print the table; exit 1 on
    any failure. ``python -m devtools.rehearsal.run sink DECLARATION MODE COMMIT_PREFIX`` is the
    sink process."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sink":
        return _sink_main(*argv[1:4])
    scenarios = _load_scenarios()
    parser = argparse.ArgumentParser(prog="make rehearse")
    parser.add_argument(
        "--kills",
        type=int,
        default=None,
        help=f"SIGKILLs in each kill scenario (default: kills and dagster_cli_kills {KILLS}, dagster_sensor_kills a "
        f"fifth of it and at least 3, {', '.join(f'{k} {n}' for k, n in _kill_defaults().items())})",
    )
    parser.add_argument("--only", default=",".join(scenarios), help=f"comma-separated subset of {list(scenarios)}")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    import shutil

    base = load_settings()
    home = base.lake_home / "rehearsal"
    if home.exists():  # a killed rehearsal's PostgreSQL servers and Debezium captures are stopped first
        cleanup.clean(home)
        devbroker.stop(home / "kafka")
        shutil.rmtree(home)
    home.mkdir(parents=True)
    bootstrap = devbroker.start(home / "kafka", devbroker.free_port())
    lake = Lake(home, home / "kafka", bootstrap)
    rehearsal = Rehearsal(lake, seed=args.seed)
    results = []
    names = [s.strip() for s in args.only.split(",") if s.strip()]
    try:
        with progress_bar(transient=False) as bar:  # one line per scenario, on a terminal only (devtools.progress)
            task = bar.add_task("rehearsal", total=len(names))
            for name in names:
                if name not in scenarios:
                    parser.error(f"unknown scenario {name!r}")
                bar.update(task, description=f"rehearsal: {name}")
                print(f"== {name}", flush=True)
                result = scenarios[name](rehearsal, args)
                print(f"   {'PASS' if result.passed else 'FAIL'} in {result.seconds:.0f} s: {result.notes}", flush=True)
                print("\n".join("   " + line for line in format_table([result]).splitlines()), flush=True)
                results.append(result)
                bar.advance(task)
            bar.update(task, description="rehearsal: done")
    finally:
        devbroker.stop(home / "kafka")
    print()
    print(format_table(results))
    total_lost = sum(r.tally.lost for r in results)
    total_dup = sum(r.tally.duplicates for r in results)
    faults = sum(r.faults for r in results)
    print(
        f"\n{len(results)} scenarios, {faults} faults injected: {total_lost} records lost, {total_dup} duplicates; "
        f"{'all passed' if all(r.passed for r in results) else 'FAILED'}"
    )
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
