"""What a worker run does between micro-batches (:mod:`kafka_iceberg.lake_assets.worker`): the due
maintenance jobs of its tables (:mod:`kafka_iceberg.ops.rota`) and the ``duplicate_free`` check of
each table it committed to. :class:`kafka_iceberg.batch.worker.Worker` calls :class:`WorkerChores`
one chore at a time, while no table has records waiting or within its share of the run's time.

A maintenance job is logged as an ``AssetObservation`` of its table (the same metadata as a
scheduled maintenance run) and its time kept in the table property; one that fails is logged and
alerted, and not tried again before its cron's next tick. A check is logged as the table's
``duplicate_free`` check evaluation over the rows this run's commits added since its previous check
(the run id is their commit id): a table that committed is checked at most every :data:`CHECK_EVERY_S`
while the run serves, and once more at its end, so each check reads a bounded number of rows.

While the run serves, a check reads in a background thread (one at a time, on the same Spark session)
and the worker goes on committing; its evaluation is logged by the next chore call after it ends. A
check starts while no table has records waiting, or once it has been pending :data:`CHECK_EVERY_S`
while some table always has: a backlog is drained before its checks compete with it for the cores.
Scheduled maintenance runs inline (it commits, and a commit is the pool's to serialize), never on a table whose
micro-batch runs meanwhile in another thread of the worker.

A table whose last commit left it more than ``maintenance.max_snapshots`` snapshots has them expired
by count as the next chore, down to ``retain_last`` (:func:`kafka_iceberg.ops.maintenance.expire`):
a streaming table commits up to a few times a second, and each snapshot makes every later commit
slower. Its pending check runs first, unless one started within :data:`TRIM_CHECK_S`, and the expiry
keeps the snapshots that check will read from, so the check stays incremental. Likewise a table whose
commits in this run added ``maintenance.compact_after_data_files`` data files since its last compaction
is compacted as the next chore: each micro-batch adds at least one data file, and each commit that
merges manifests (about one in a hundred) rewrites an entry per data file, so the table's tail latency
grows with them. Those two jobs read every manifest list or data file of the table (seconds to tens of
seconds), so they run in the background thread, like a check, while the worker goes on committing, to
that table too: its micro-batches commit on ``main`` (conditional, each on the latest metadata, and on
top of a compaction: :func:`kafka_iceberg.batch.publish.only_compactions_since`), and Iceberg's procedures
retry a commit that conflicts with one of them. The expiry keeps the newest snapshots of the metadata it
commits on, :data:`~kafka_iceberg.ops.maintenance.CONCURRENT_COMMITS` more than needed. At most one of each per table per :data:`TRIM_CHECK_S`.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

from dagster import AssetCheckEvaluation, AssetCheckSeverity, AssetObservation, OpExecutionContext
from pyiceberg.exceptions import CommitFailedException

from kafka_iceberg.catalog.tables import load_table, metadata_view, qualified
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.check_alerts import alert_check
from kafka_iceberg.lake_assets.tables import check_result
from kafka_iceberg.lake_assets.vocabulary import table_alert, table_key
from kafka_iceberg.ops import checks
from kafka_iceberg.ops.alerts import Alert
from kafka_iceberg.ops.incremental_check import snapshots_to_keep
from kafka_iceberg.ops.maintenance import CONCURRENT_COMMITS
from kafka_iceberg.ops.rota import MaintenanceRota, last_runs, record_run, run_job, set_table_property

CHECK_EVERY_S = 300.0
"""Seconds between two ``duplicate_free`` checks of one table within a worker run: each reads a bounded
number of rows, and the table's event log gets at most 12 evaluations an hour."""


TRIM_CHECK_S = 30.0
"""Seconds within which a started ``duplicate_free`` check lets a table past its ``max_snapshots`` be
expired without another one first (the expiry keeps the snapshots committed after its start); and the
least time between two expiries by count of one table."""


CONCURRENT_COMMIT_RETRIES = 20
"""``commit.retry.num-retries`` a worker sets on a table it compacts in the background (unless the table
has its own; Iceberg's default is 4): ``rewrite_data_files`` then commits beside micro-batches that
commit several times a second, each of which makes its commit try again."""


class Chore(NamedTuple):
    """A chore running in the background thread: ``what`` (``duplicate_free``, or the maintenance job
    ``expire_snapshots`` or ``compact``) on table ``identifier``, started at ``started`` (monotonic s);
    ``after``: the snapshot the table's check reads after; ``future``: its outcome."""

    identifier: str
    started: float
    after: int | None
    future: Future
    what: str


def rota_for(tables: dict[str, object], crons: dict[str, dict[str, str]]) -> MaintenanceRota:
    """The :class:`MaintenanceRota` of the loaded pyiceberg ``tables`` (identifier -> table, None
    for a table not created yet) under their spread ``crons`` (identifier -> kind -> cron, UTC)."""
    last = {}
    for identifier, table in tables.items():
        if table is None:
            continue
        first = min((s.timestamp_ms for s in table.metadata.snapshots), default=None)
        last.update({(identifier, k): ms for k, ms in last_runs(table.properties, first).items()})
    return MaintenanceRota({i: crons[i] for i in tables if i in crons}, last)


def worker_alert(spec: TableSpec, what: str, error: BaseException, run_id: str, severity: str) -> Alert:
    """The alert (``severity`` WARN or ERROR, linked to the table's asset and run ``run_id``) of a worker
    run's ``what`` that failed on ``spec``'s table: ``micro_batch``, ``duplicate_free`` or a maintenance job."""
    return table_alert(
        spec,
        measure=what,
        value=type(error).__name__,
        severity=severity,
        summary=f"{spec.identifier}: {what} failed in worker run {run_id}: {error}",
        source="worker",
        run_id=run_id,
    )


class WorkerChores:
    """The chores of one worker run over ``specs``; call it for one chore (returns whether it ran or
    started one; False while a check or an expiry runs in the background), :meth:`committed` after each commit,
    and :meth:`finish` at the end of the run (the checks still pending). ``rota``: from
    :func:`rota_for`; the rest are the op's context and resources."""

    def __init__(self, context: OpExecutionContext, specs: list[TableSpec], rota: MaintenanceRota, env: dict):
        self.context, self.rota = context, rota
        self.by_id = {s.identifier: s for s in specs}
        self.spark, self.settings, self.catalog = env["spark"], env["settings"], env["catalog"]
        self.slack = env["slack"]
        self.unchecked: dict[str, float] = {}  # committed to since their last check -> since (monotonic s)
        self.over: dict[tuple[str, str], None] = {}  # (identifier, job) past its ceiling, in order
        self.files_added: dict[str, int] = {}  # identifier -> data files its commits added since its last compaction
        self.trimmed: dict[tuple[str, str], float] = {}  # (identifier, job) -> its last start by count (monotonic s)
        self.checked: dict[str, tuple[float, int | None]] = {}  # identifier -> (monotonic s, main snapshot)
        self.running: Chore | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lake-chore")

    def committed(self, spec: TableSpec, snapshots: int | None = None, data_files_added: int = 0) -> None:
        """Note that ``spec``'s table got a commit of this run: its check is pending (since its first
        commit after its last check; the least recently committed table comes first). ``snapshots``:
        the table's snapshots the commit planned on (``BatchResult.snapshots``; None: unknown);
        ``data_files_added``: the data files it added (``BatchResult.data_files_added``)."""
        identifier, policy = spec.identifier, spec.maintenance
        since = self.unchecked.pop(identifier, None)
        self.unchecked[identifier] = time.monotonic() if since is None else since
        if policy.past_max_snapshots(snapshots):
            self.over[(identifier, "expire_snapshots")] = None
        elif snapshots is not None:  # the latest count: one reported by a commit planned before an expiry is stale
            self.over.pop((identifier, "expire_snapshots"), None)
        self.files_added[identifier] = self.files_added.get(identifier, 0) + data_files_added
        if self.files_added[identifier] >= policy.compact_after_data_files:
            self.over[(identifier, "compact")] = None

    def __call__(self, idle: bool = True, busy: frozenset = frozenset()) -> bool:
        """One chore (see the class docstring); ``idle``: no table has records waiting; ``busy``: tables
        whose micro-batch runs meanwhile (their maintenance waits)."""
        if self.running is not None:
            if not self.running.future.done():
                return False  # one chore at a time; the worker goes on serving
            self._collect()
        due = self.rota.next_due(int(time.time() * 1000), skip=busy)
        if due is not None:
            self.maintain(self.by_id[due[0]], due[1])
            return True
        over = self._over_ceiling(busy)
        if over is not None:
            self._trim(*over)
            return True
        now = time.monotonic()
        ready = [
            i
            for i, since in self.unchecked.items()
            if now - self.checked.get(i, (-CHECK_EVERY_S, None))[0] >= CHECK_EVERY_S
            and (idle or now - since >= CHECK_EVERY_S)
        ]
        if ready:
            self._start_check(ready[0])
            return True
        return False

    @classmethod
    def resume(cls, context: OpExecutionContext, specs: list[TableSpec], pending: dict, env: dict) -> WorkerChores:
        """The chores of a later op of the run with the checks ``pending`` (:meth:`pending`) and no maintenance."""
        chores = cls(context, specs, MaintenanceRota({}), env)
        for identifier, after in pending.items():
            chores.unchecked[identifier], chores.checked[identifier] = 0.0, (0.0, after)
        return chores

    def pending(self) -> dict[str, int | None]:
        """The tables whose check is pending (oldest first), each with the snapshot its last check
        covered. A check that already ended is logged first; one still running in the background is
        not awaited (the serving op holds the pool, which a successor may wait for): its table is
        pending again, from the snapshot that check started after, and its outcome is dropped. An expiry or
        a compaction still running is not awaited either: it ends in its thread, and only its observation is lost."""
        if self.running is not None and not self.running.future.done():
            identifier, started, after, _, what = self.running
            self.running = None
            if what == "duplicate_free":
                self.unchecked.setdefault(identifier, started)
                self.checked[identifier] = (started, after)
            else:
                self.context.log.info(f"{identifier}: {what} still running at the end of serving, not awaited")
        self._collect()
        return {i: self.checked.get(i, (0.0, None))[1] for i in self.unchecked}

    def finish(self) -> None:
        """Run every pending check (the run's last commits), one after the other."""
        self._collect()
        while self.unchecked:
            self._start_check(next(iter(self.unchecked)))
            self._collect()

    def paused(self) -> frozenset:
        """The tables whose micro-batches wait (``Worker.paused``): an upsert table while it is compacted
        in the background. Its micro-batch publishes by fast-forward, which a compaction's commit refuses,
        while an append rebases onto the compaction."""
        chore = self.running
        if chore is None or chore.what != "compact" or chore.future.done():
            return frozenset()
        return frozenset({chore.identifier}) if self.by_id[chore.identifier].upsert is not None else frozenset()

    def _over_ceiling(self, busy: frozenset) -> tuple[str, str] | None:
        """(identifier, job) of a table whose commits passed a ceiling (``max_snapshots``: ``expire_snapshots``;
        ``compact_after_data_files``: ``compact``), not in ``busy``, and whose job did not start by count
        within :data:`TRIM_CHECK_S` (a commit planned before an expiry reports the count before it)."""
        now = time.monotonic()
        for identifier, kind in self.over:
            recent = now - self.trimmed.get((identifier, kind), -TRIM_CHECK_S) < TRIM_CHECK_S
            if identifier not in busy and not recent:
                return identifier, kind
        return None

    def _trim(self, identifier: str, kind: str) -> None:
        """Start the maintenance job ``kind`` on ``identifier``'s table, past its ceiling, in the background
        thread; before an expiry, first its pending check, unless one started within :data:`TRIM_CHECK_S`."""
        last_check = self.checked.get(identifier, (None, None))[0]
        stale = last_check is None or time.monotonic() - last_check > TRIM_CHECK_S
        if kind == "expire_snapshots" and identifier in self.unchecked and stale:
            self._start_check(identifier)
            return
        del self.over[(identifier, kind)]
        self.trimmed[(identifier, kind)] = time.monotonic()
        started_ms = self._mark(identifier, kind)
        future = self._thread.submit(self.job, self.by_id[identifier], kind, started_ms, concurrent=True)
        self.running = Chore(identifier, time.monotonic(), self.checked.get(identifier, (0.0, None))[1], future, kind)

    def _start_check(self, identifier: str) -> None:
        """Start the check of ``identifier`` in the background thread (:meth:`evaluate`)."""
        del self.unchecked[identifier]
        after = self.checked.get(identifier, (0.0, None))[1]
        future = self._thread.submit(self.evaluate, self.by_id[identifier], after, self.context.run_id)
        self.running = Chore(identifier, time.monotonic(), after, future, "duplicate_free")

    def _collect(self) -> None:
        """Wait for the running check or expiry, if any, and log its evaluation or observation. One that
        raised (the catalog unreachable) is logged and alerted, never raised: the worker goes on. A failed
        check's table is pending again from the same snapshot at its next commit (after
        :data:`CHECK_EVERY_S`); a failed expiry is tried again by the next commit past the ceiling, a
        failed compaction once the table's commits added ``compact_after_data_files`` more data files."""
        if self.running is None:
            return
        identifier, started, after, future, what = self.running
        self.running, spec = None, self.by_id[identifier]
        if what != "duplicate_free":
            try:
                self.observe(spec, future.result())
            except Exception as exc:  # noqa: BLE001 - the next commit past the ceiling tries again
                self._alert(spec, what, exc)
            return
        try:
            main, outcome = future.result()
        except Exception as exc:  # noqa: BLE001 - a chore must not stop the worker
            self.checked[identifier] = (started, after)
            self._alert(spec, "duplicate_free", exc)
            return
        self.checked[identifier] = (started, main)
        self.report(spec, outcome)

    def _alert(self, spec: TableSpec, what: str, exc: BaseException) -> None:
        self.context.log.error(f"{spec.identifier}: {what} failed in worker run: {exc}")
        self.slack.sink().send(worker_alert(spec, what, exc, self.context.run_id, "WARN"))

    def maintain(self, spec: TableSpec, kind: str) -> None:
        """Run the maintenance job ``kind`` on ``spec``'s table here (:meth:`job`) and observe it; a
        failure is logged and alerted (never raised), and the job waits for its next tick."""
        started_ms = self._mark(spec.identifier, kind)
        try:
            result = self.job(spec, kind, started_ms)
        except Exception as exc:  # noqa: BLE001 - maintenance of one table must not stop the worker
            self._alert(spec, kind, exc)
            return
        self.observe(spec, result)

    def _mark(self, identifier: str, kind: str) -> int:
        """Note that the maintenance job ``kind`` starts on ``identifier``'s table now: not due again before
        its cron's next tick, and a compaction starts the count of data files added again. Returns now
        (ms since epoch)."""
        started_ms = int(time.time() * 1000)
        self.rota.mark(identifier, kind, started_ms)
        if kind == "compact":
            self.files_added[identifier] = 0
        return started_ms

    def job(self, spec: TableSpec, kind: str, started_ms: int, concurrent: bool = False):
        """Run the maintenance job ``kind`` on ``spec``'s table (:func:`kafka_iceberg.ops.rota.run_job`;
        an expiry keeps what its next check reads and :data:`~kafka_iceberg.ops.maintenance.CONCURRENT_COMMITS`) and record that it ran
        at ``started_ms`` (ms since epoch; when the table's own commits refuse that record three times,
        the result's output says ``last_run_not_recorded``, and the rota of a later run may run the job
        again at its next tick). ``concurrent``: the table's micro-batches commit meanwhile (a compaction
        first sets :data:`CONCURRENT_COMMIT_RETRIES`). Returns its ``MaintenanceResult``; raises what Spark
        or the catalog raise."""

        def keep(view) -> int:
            after = self.checked.get(spec.identifier, (0.0, None))[1]
            return (snapshots_to_keep(view, self.context.run_id, after) or 1) + CONCURRENT_COMMITS

        def view():
            return metadata_view(load_table(self.catalog, spec.identifier))

        if concurrent and kind == "compact":
            set_table_property(
                self.catalog,
                spec.identifier,
                "commit.retry.num-retries",
                str(CONCURRENT_COMMIT_RETRIES),
                unless_set=True,
            )
        result = run_job(self.spark, self.settings.catalog.name, spec, kind, view, keep=keep)
        try:
            record_run(self.catalog, spec.identifier, kind, started_ms)
        except CommitFailedException as exc:  # the job committed; only its time is not recorded
            result.output["last_run_not_recorded"] = str(exc)
        return result

    def observe(self, spec: TableSpec, result) -> None:
        """Log a maintenance job's ``MaintenanceResult`` as an ``AssetObservation`` of ``spec``'s table."""
        self.context.log.info(
            f"{spec.identifier} {result.procedure}: files {result.files_before} -> {result.files_after} "
            f"in {result.seconds:.1f} s"
        )
        self.context.log_event(AssetObservation(asset_key=table_key(spec), metadata=result.as_metadata()))

    def evaluate(self, spec: TableSpec, after: int | None, run_id: str) -> tuple[int | None, checks.CheckOutcome]:
        """(main's snapshot id, the ``duplicate_free`` outcome) of ``spec``'s table over the rows run
        ``run_id``'s commits added after snapshot ``after``. Reads the catalog and Spark; raises what they raise."""
        view = metadata_view(load_table(self.catalog, spec.identifier))
        outcome = checks.duplicate_free(
            self.spark, qualified(self.settings, spec), spec, view, commit_id=run_id, after=after
        )
        return view.main, outcome

    def report(self, spec: TableSpec, outcome: checks.CheckOutcome) -> None:
        """Log ``outcome`` as ``spec``'s ``duplicate_free`` check evaluation; alert on a change of status."""
        alert_check(self.context, self.slack, spec, "duplicate_free", outcome, "ERROR")
        result = check_result(outcome, AssetCheckSeverity.ERROR)
        self.context.log_event(
            AssetCheckEvaluation(
                asset_key=table_key(spec),
                check_name="duplicate_free",
                passed=result.passed,
                metadata=result.metadata,
                severity=result.severity,
                description=result.description,
            )
        )


__all__ = [
    "CHECK_EVERY_S",
    "CONCURRENT_COMMIT_RETRIES",
    "TRIM_CHECK_S",
    "Chore",
    "WorkerChores",
    "rota_for",
    "worker_alert",
]
