"""What a worker run does between micro-batches (:mod:`kafka_iceberg.lake_assets.worker`): the due
maintenance jobs and full-scan ``duplicate_free`` checks of its tables (:mod:`kafka_iceberg.ops.rota`), and
the incremental ``duplicate_free`` check of each table it committed to.
:class:`kafka_iceberg.batch.worker.Worker` calls :class:`WorkerChores` one chore at a time, while no table
has records waiting or within its share of the run's time.

A maintenance job is logged as an ``AssetObservation`` of its table (files and bytes before and after,
:meth:`~kafka_iceberg.ops.maintenance.MaintenanceResult.as_metadata`) and its time kept in the table
property; one that fails is logged, alerted once per failure episode
(:mod:`kafka_iceberg.lake_assets.chore_alerts`), and not tried again before its cron's next tick (its attempt
is recorded too). A check is logged as the table's ``duplicate_free`` check evaluation over the rows this
run's commits added since its previous check (the run id is their commit id): a table that committed is
checked at most every :data:`CHECK_EVERY_S` while the run serves, and once more at its end, so each check
reads a bounded number of rows. The
evaluations and the observations of jobs by count reach the event log at most once per table and
:data:`~kafka_iceberg.batch.coalesce.REPORT_EVERY_S` (:mod:`kafka_iceberg.lake_assets.chore_reports`).

While the run serves, a check reads in a background thread (one at a time; pyiceberg reads the rows a check
covers, the full scan of an upsert table is a Spark job of the run's session) and the worker goes on
committing; its evaluation is logged by the next chore call after it ends. A check starts while no table has
records waiting, or once it has been pending :data:`CHECK_EVERY_S` while some table always has (then at most
one every :data:`CHECK_SPACING_S`): a backlog is drained before its checks compete with it for the cores.
Scheduled maintenance runs inline (it commits, and a commit is the pool's to serialize), never on a table whose
micro-batch runs meanwhile in another thread of the worker. A due full-scan check runs in the background thread
(Spark jobs on the run's session, :mod:`kafka_iceberg.lake_assets.chore_jobs`) and is reported at once.

A table past ``maintenance.max_snapshots`` snapshots is expired by count, and one whose commits added
``maintenance.compact_after_data_files`` data files is compacted, as the next chore
(:mod:`kafka_iceberg.ops.chore_state` says which chore goes next, and why). A compaction rewrites data files
(seconds to tens of seconds) and an expiry reads manifests and deletes files, so they run in the background
thread while the worker
goes on committing, to that table too: its micro-batches commit on ``main`` (conditional, on the latest
metadata, and on top of a compaction: :func:`kafka_iceberg.batch.publish.only_compactions_since`), and
Iceberg retries a commit that conflicts with one of them. The expiry keeps the newest snapshots of
the metadata it commits on, :data:`~kafka_iceberg.ops.maintenance.CONCURRENT_COMMITS` more than needed, and
waits while another run of the worker's job is in progress (at a hand-over, the predecessor's last checks
read its newest snapshots; :data:`~kafka_iceberg.ops.chore_state.EXPIRY_HOLD_S`). At most one of each per
table per :data:`TRIM_CHECK_S`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from dagster import OpExecutionContext

from kafka_iceberg.batch.coalesce import Throttle
from kafka_iceberg.batch.worker import Clock
from kafka_iceberg.declaration.groups import group_of, member_identifiers
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.chore_alerts import ChoreAlerts, worker_alert
from kafka_iceberg.lake_assets.chore_jobs import (
    CONCURRENT_COMMIT_RETRIES,
    ChoreEnv,
    full_check,
    incremental_check,
    maintenance_job,
)
from kafka_iceberg.lake_assets.chore_reports import ChoreReports
from kafka_iceberg.ops import checks
from kafka_iceberg.ops.chore_state import (
    CHECK,
    CHECK_EVERY_S,
    CHECK_SPACING_S,
    EXPIRY_HOLD_S,
    TRIM_CHECK_S,
    Chore,
    TableChores,
    after_commit,
    next_chore,
    pending_checks,
)
from kafka_iceberg.ops.rota import FULL_CHECK, MaintenanceRota


class WorkerChores:
    """The chores of one worker run over ``specs``; call it for one chore (returns whether it ran or
    started one; False while a check or an expiry runs in the background), :meth:`committed` after each
    commit, and :meth:`finish` at the end of the run (the checks still pending). ``rota``: from
    :func:`kafka_iceberg.ops.rota.rota_for`; ``env``: the op's connections; ``clock``: monotonic seconds and
    ms since epoch; ``another_run``: whether another run of the worker's job is in progress (a query of the
    Dagster instance, throttled by the caller): its expiries then wait,
    :data:`~kafka_iceberg.ops.chore_state.EXPIRY_HOLD_S` at most.

    Thread contract: every method is called from the op's main thread, which alone reads and replaces
    :attr:`tables` (one :class:`~kafka_iceberg.ops.chore_state.TableChores` per table), :attr:`running`
    and the rota. The background thread runs :meth:`job` or :meth:`evaluate` with the values it needs as
    arguments and reads only ``env`` and :attr:`members` (never changed). Use it as a context manager (or call :meth:`close`): its thread is
    shut down at the end."""

    def __init__(
        self,
        context: OpExecutionContext,
        specs: list[TableSpec],
        rota: MaintenanceRota,
        env: ChoreEnv,
        clock: Clock = Clock(),
        another_run: Callable[[], bool] = lambda: False,
    ):
        self.context, self.rota, self.env, self.clock = context, rota, env, clock
        self.another_run, self._held_since = another_run, None  # since when expiries wait for it (monotonic s)
        self.tables: dict[str, TableChores] = {s.identifier: TableChores(s) for s in specs}
        self.members = member_identifiers(specs)  # group -> identifiers
        self.running: Chore | None = None
        self._tickets = 0  # commits noted so far: they order the tables (see chore_state)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lake-chore")
        self.alerts = ChoreAlerts(context, env.catalog, env.slack)  # one post per failure episode
        self.reports = ChoreReports(context, env.slack, Throttle(clock=clock.now))

    def __enter__(self) -> WorkerChores:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def close(self) -> None:
        """Shut the background thread down: at once when no chore runs; a chore still running (the
        serving op does not wait for it, :meth:`pending`) ends in its thread, which then exits."""
        self._thread.shutdown(wait=self.running is None, cancel_futures=True)

    def _ticket(self) -> int:
        self._tickets += 1
        return self._tickets

    def committed(self, spec: TableSpec, snapshots: int | None = None, data_files_added: int = 0) -> None:
        """Note that ``spec``'s table got a commit of this run (:func:`~kafka_iceberg.ops.chore_state.after_commit`):
        ``snapshots``: the table's snapshots the commit planned on (``BatchResult.snapshots``; None:
        unknown); ``data_files_added``: the data files it added (``BatchResult.data_files_added``)."""
        state = self.tables[spec.identifier]
        now = self.clock.now()
        self.tables[spec.identifier] = after_commit(state, self._ticket(), now, snapshots, data_files_added)

    def __call__(self, idle: bool = True, busy: frozenset = frozenset()) -> bool:
        """One chore (:func:`~kafka_iceberg.ops.chore_state.next_chore`); ``idle``: no table has records
        waiting; ``busy``: tables whose micro-batch runs meanwhile (their maintenance waits)."""
        if self.running is not None:
            if not self.running.future.done():
                return False  # one chore at a time; the worker goes on serving
            self._collect()
        now = self.clock.now()
        held = self._held(now)
        due = self.rota.next_due(self.clock.epoch_ms(), skip=busy, held=held)
        chore = next_chore(self.tables, due, now, idle, busy, held)
        if chore is None:
            return False
        what, identifier, kind = chore
        if what == "maintain" and kind == FULL_CHECK:
            self._start_full_check(identifier)
        elif what == "maintain":
            self.maintain(self.tables[identifier].spec, kind)
        elif what == "trim":
            self._trim(identifier, kind)
        else:
            self._start_check(identifier)
        return True

    def _held(self, now: float) -> tuple[str, ...]:
        """The jobs that wait at ``now`` (monotonic s): ``expire_snapshots`` while :attr:`another_run` is in
        progress, since at most :data:`~kafka_iceberg.ops.chore_state.EXPIRY_HOLD_S`; else none."""
        if not self.another_run():
            self._held_since = None
            return ()
        self._held_since = now if self._held_since is None else self._held_since
        return ("expire_snapshots",) if now - self._held_since < EXPIRY_HOLD_S else ()

    @classmethod
    def resume(
        cls, context: OpExecutionContext, specs: list[TableSpec], pending: dict, env: ChoreEnv, clock: Clock = Clock()
    ) -> WorkerChores:
        """The chores of a later op of the run with the checks ``pending`` (:meth:`pending`) and no maintenance."""
        chores = cls(context, specs, MaintenanceRota({}), env, clock)
        for identifier, after in pending.items():
            state = chores.tables[identifier]
            chores.tables[identifier] = replace(
                state, pending_since=0.0, last_commit=chores._ticket(), checked_s=0.0, checked_after=after
            )
        return chores

    def pending(self) -> dict[str, int | None]:
        """The tables whose check is pending (oldest first), each with the snapshot its last check
        covered. A check that already ended is logged first; one still running in the background is
        not awaited (the serving op holds the pool, which a successor may wait for): its table is
        pending again, from the snapshot that check started after, and its outcome is dropped. An expiry or
        a compaction still running is not awaited either: it ends in its thread, and only its observation is lost."""
        if self.running is not None and not self.running.future.done():
            identifier, started, after, _, what = self.running
            if what == CHECK:
                state = self.tables[identifier]
                if state.pending_since is None:
                    state = replace(state, pending_since=started, last_commit=self._ticket())
                self.tables[identifier] = replace(state, checked_s=started, checked_after=after)
            else:
                self.context.log.info(f"{identifier}: {what} still running at the end of serving, not awaited")
            self.running = None
        self._collect()
        self.reports.drain()
        return {t.spec.identifier: t.checked_after for t in pending_checks(self.tables)}

    def finish(self) -> None:
        """Run every pending check (the run's last commits), one after the other."""
        self._collect()
        while pending := pending_checks(self.tables):
            self._start_check(pending[0].spec.identifier)
            self._collect()
        self.reports.drain()

    def paused(self) -> frozenset:
        """The tables whose micro-batches wait (``WorkerPorts.paused``): an upsert table while it is compacted
        in the background. Its micro-batch publishes by fast-forward, which a compaction's commit refuses,
        while an append rebases onto the compaction."""
        chore = self.running
        if chore is None or chore.what != "compact" or chore.future.done():
            return frozenset()
        return frozenset({chore.identifier}) if self.tables[chore.identifier].spec.upsert is not None else frozenset()

    def working(self) -> bool:
        """Whether a chore runs in the background, or ended and is not collected yet (the next call collects it)."""
        return self.running is not None

    def _trim(self, identifier: str, kind: str) -> None:
        """Start the maintenance job ``kind`` on ``identifier``'s table, past its ceiling, in the background thread."""
        now = self.clock.now()
        self.tables[identifier] = self.tables[identifier].with_ceiling(kind, passed=None, started_s=now)
        started_ms = self._mark(identifier, kind)
        state = self.tables[identifier]
        future = self._thread.submit(
            self.job,
            state.spec,
            kind,
            started_ms,
            concurrent=True,
            after=state.checked_after,
            run_id=self.context.run_id,
        )
        self.running = Chore(identifier, now, state.checked_after, future, kind)

    def _start_check(self, identifier: str) -> None:
        """Start the check of ``identifier`` in the background thread (:meth:`evaluate`)."""
        state = self.tables[identifier] = replace(self.tables[identifier], pending_since=None)
        future = self._thread.submit(self.evaluate, state.spec, state.checked_after, self.context.run_id)
        self.running = Chore(identifier, self.clock.now(), state.checked_after, future, CHECK)

    def _start_full_check(self, identifier: str) -> None:
        """Start the scheduled full-scan check of ``identifier`` in the background thread (:meth:`full_check`)."""
        started_ms, state = self._mark(identifier, FULL_CHECK), self.tables[identifier]
        future = self._thread.submit(self.full_check, state.spec, started_ms)
        self.running = Chore(identifier, self.clock.now(), state.checked_after, future, FULL_CHECK)

    def _collect(self) -> None:
        """Wait for the running check or expiry, if any, and log its evaluation or observation. One that
        raised (the catalog unreachable) is logged and alerted, never raised: the worker goes on. A failed
        check's table is pending again from the same snapshot at its next commit (after
        :data:`CHECK_EVERY_S`); a failed expiry is tried again by the next commit past the ceiling, a
        failed compaction once the table's commits added ``compact_after_data_files`` more data files."""
        if self.running is None:
            return
        identifier, started, after, future, what = self.running
        self.running, spec = None, self.tables[identifier].spec
        if what != CHECK:  # a full scan (by cron), or an expiry or compaction by count
            try:
                if what == FULL_CHECK:
                    self.reports.full_check(spec, future.result())
                else:
                    self.observe(spec, future.result(), routine=True)
            except Exception as exc:  # noqa: BLE001 - the next tick, or commit past the ceiling, tries again
                self._alert(spec, what, exc)
                return
            self.alerts.ok(spec, what, self.clock.epoch_ms())
            return
        try:
            main, outcome = future.result()
        except Exception as exc:  # noqa: BLE001 - a chore must not stop the worker
            self.tables[identifier] = replace(self.tables[identifier], checked_s=started, checked_after=after)
            self._alert(spec, CHECK, exc)
            return
        self.tables[identifier] = replace(self.tables[identifier], checked_s=started, checked_after=main)
        self.alerts.ok(spec, CHECK, self.clock.epoch_ms())
        self.report(spec, outcome)

    def _alert(self, spec: TableSpec, what: str, exc: BaseException) -> None:
        """Log the failure; alert when it starts an episode of ``what`` on the table (:class:`ChoreAlerts`)."""
        self.alerts.failed(spec, what, exc, self.clock.epoch_ms())

    def maintain(self, spec: TableSpec, kind: str) -> None:
        """Run the maintenance job ``kind`` on ``spec``'s table here (:meth:`job`) and observe it; a
        failure is logged and alerted (never raised), and the job waits for its next tick."""
        started_ms = self._mark(spec.identifier, kind)
        try:
            result = self.job(
                spec, kind, started_ms, after=self.tables[spec.identifier].checked_after, run_id=self.context.run_id
            )
        except Exception as exc:  # noqa: BLE001 - maintenance of one table must not stop the worker
            self._alert(spec, kind, exc)
            return
        self.alerts.ok(spec, kind, self.clock.epoch_ms())
        self.observe(spec, result)

    def _mark(self, identifier: str, kind: str) -> int:
        """Note that the maintenance job ``kind`` starts on ``identifier``'s table now: not due again before
        its cron's next tick, and a compaction starts the count of data files added again. Returns now
        (ms since epoch)."""
        started_ms = self.clock.epoch_ms()
        self.rota.mark(identifier, kind, started_ms)
        if kind == "compact":
            self.tables[identifier] = replace(self.tables[identifier], files_added=0)
        return started_ms

    def job(
        self,
        spec: TableSpec,
        kind: str,
        started_ms: int,
        *,
        concurrent: bool = False,
        after: int | None,
        run_id: str,
    ):
        """Run the maintenance job ``kind`` on ``spec``'s table and record it
        (:func:`~kafka_iceberg.lake_assets.chore_jobs.maintenance_job`, with the group's :attr:`members`).
        Returns its ``MaintenanceResult``; raises what Spark or the catalog raise. May run in the background
        thread: it reads only its arguments, ``env`` and :attr:`members`."""
        members = self.members.get(group_of(spec), ())
        return maintenance_job(
            self.env, spec, kind, started_ms, members=members, concurrent=concurrent, after=after, run_id=run_id
        )

    def observe(self, spec: TableSpec, result, routine: bool = False) -> None:
        """Report a maintenance job's ``MaintenanceResult`` as an ``AssetObservation`` of ``spec``'s table;
        a ``routine`` one (by count) at most once per interval (:class:`ChoreReports`)."""
        self.reports.maintenance(spec, result, routine)

    def evaluate(self, spec: TableSpec, after: int | None, run_id: str) -> tuple[int | None, checks.CheckOutcome]:
        """(main's snapshot id, the ``duplicate_free`` outcome) of ``spec``'s table over the rows run
        ``run_id``'s commits added after snapshot ``after``
        (:func:`~kafka_iceberg.lake_assets.chore_jobs.incremental_check`); raises what it raises. Runs in the
        background thread: it reads only its arguments and ``env``."""
        return incremental_check(self.env, spec, after, run_id)

    def full_check(self, spec: TableSpec, started_ms: int) -> checks.CheckOutcome:
        """The scheduled full-scan ``duplicate_free`` outcome of ``spec``'s table, its run recorded at
        ``started_ms`` (:func:`~kafka_iceberg.lake_assets.chore_jobs.full_check`); raises what it raises. Runs
        in the background thread: it reads only its arguments and ``env``."""
        return full_check(self.env, spec, started_ms)

    def report(self, spec: TableSpec, outcome: checks.CheckOutcome) -> None:
        """Report ``outcome`` as ``spec``'s ``duplicate_free`` check evaluation (a pass at most once per
        interval, :class:`ChoreReports`); alert on a change of status."""
        self.reports.check(spec, outcome)


__all__ = [
    "CHECK_EVERY_S",
    "CHECK_SPACING_S",
    "CONCURRENT_COMMIT_RETRIES",
    "TRIM_CHECK_S",
    "Chore",
    "ChoreEnv",
    "WorkerChores",
    "worker_alert",
]
