"""How a worker run's chores reach the Dagster event log (:mod:`kafka_iceberg.lake_assets.worker_chores`):
a maintenance job as an ``AssetObservation`` of its table, a ``duplicate_free`` check (incremental, or the
scheduled full scan) as the table's check evaluation, each with a line in the run's log.

The routine ones follow the commit rate: a table past ``maintenance.max_snapshots`` is checked and expired
every minute or two at a few commits a second. They are reported through a
:class:`~kafka_iceberg.batch.coalesce.Throttle`, at most once per
:data:`~kafka_iceberg.batch.coalesce.REPORT_EVERY_S` per table and kind: the latest result, with ``jobs`` or
``checks`` saying how many it stands for. A failed check, and the next full-scan pass, are reported at once;
what is held is reported when the run stops serving (:meth:`ChoreReports.drain`). Scheduled maintenance (by cron)
and the scheduled full scan are always reported. Called from the op's main thread only.

Duplicates found stay in the table until someone removes them, so a table's check stays failed until a full
scan passes: after a failed evaluation (of either scope, in this run or, for a table's first report in the
run, the latest one of another run), an incremental pass, which covers only the rows added since, is not
reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from dagster import AssetCheckEvaluation, AssetCheckKey, AssetCheckSeverity, AssetObservation, OpExecutionContext

from kafka_iceberg.batch.coalesce import Throttle
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.check_alerts import alert_check, previous_check_passed
from kafka_iceberg.lake_assets.tables import check_result
from kafka_iceberg.lake_assets.vocabulary import table_key
from kafka_iceberg.ops import checks
from kafka_iceberg.ops.chore_state import CHECK
from kafka_iceberg.resources import LakeSlackResource


class ChoreReports:
    """The event-log reports of one worker op's chores. ``context``: the op's (its log and ``log_event``);
    ``slack``: the alerts' resource (None: no alerts); ``throttle``: the routine reports held back,
    keyed by (table identifier, kind); ``previous``: the verdict (passed) of a table's latest completed
    ``duplicate_free`` evaluation in another run, None for none (default: read from the context's Dagster
    instance, :func:`~kafka_iceberg.lake_assets.check_alerts.previous_check_passed`)."""

    def __init__(
        self,
        context: OpExecutionContext,
        slack: LakeSlackResource | None,
        throttle: Throttle,
        previous: Callable[[TableSpec], bool | None] | None = None,
    ):
        self.context, self.slack, self.throttle = context, slack, throttle
        self.previous = previous or self._previous_in_instance
        self.specs: dict[str, TableSpec] = {}
        self.failing: dict[str, bool] = {}  # identifier -> whether its check stands failed (until a full pass)

    def maintenance(self, spec: TableSpec, result, routine: bool) -> None:
        """Report a maintenance job's ``MaintenanceResult`` on ``spec``'s table: ``routine`` (by count, not
        by cron) ones at most once per interval."""
        self.specs[spec.identifier] = spec
        due = self.throttle.add((spec.identifier, result.procedure), result) if routine else (result, 1)
        if due is not None:
            self.observe(spec, *due)

    def check(self, spec: TableSpec, outcome: checks.CheckOutcome) -> None:
        """Report an incremental ``duplicate_free`` outcome of ``spec``'s table: a pass at most once per
        interval, a failure at once, and the first full-scan pass after a failure at once (an outcome is a full
        scan when the run committed nothing to check, or for an upsert table). An incremental pass while the
        check stands failed is not reported (see the module)."""
        self.specs[spec.identifier] = spec
        failed = self._stands_failed(spec)
        if outcome.passed and not outcome.full_scan and failed:
            return
        urgent = not outcome.passed or failed
        due = self.throttle.add((spec.identifier, CHECK), outcome, urgent=urgent)
        if due is not None:
            self.evaluate(spec, *due)

    def full_check(self, spec: TableSpec, outcome: checks.CheckOutcome) -> None:
        """Report a scheduled full-scan ``duplicate_free`` outcome of ``spec``'s table at once; it supersedes
        an incremental pass held back."""
        self.throttle.discard((spec.identifier, CHECK))
        self.evaluate(spec, outcome)

    def _stands_failed(self, spec: TableSpec) -> bool:
        """Whether ``spec``'s check stands failed: its last evaluation in this run failed, or, before its first
        one, the latest evaluation of another run did (:attr:`previous`, asked once per table and run)."""
        if spec.identifier not in self.failing:
            self.failing[spec.identifier] = self.previous(spec) is False
        return self.failing[spec.identifier]

    def _previous_in_instance(self, spec: TableSpec) -> bool | None:
        check_key = AssetCheckKey(table_key(spec), CHECK)
        return previous_check_passed(self.context.instance, check_key, self.context.run.run_id)

    def drain(self) -> None:
        """Report every result held back (the run stops serving)."""
        for (identifier, kind), (item, n) in self.throttle.drain().items():
            if kind == CHECK:
                self.evaluate(self.specs[identifier], item, n)
            else:
                self.observe(self.specs[identifier], item, n)

    def observe(self, spec: TableSpec, result, jobs: int = 1) -> None:
        """Log ``result`` as an ``AssetObservation`` of ``spec``'s table, standing for ``jobs`` jobs of its kind."""
        self.context.log.info(
            f"{spec.identifier} {result.procedure}: files {result.files_before} -> {result.files_after} "
            f"in {result.seconds:.1f} s" + (f" (the last of {jobs} since the last observation)" if jobs > 1 else "")
        )
        metadata = {**result.as_metadata(), "jobs": jobs}
        self.context.log_event(AssetObservation(asset_key=table_key(spec), metadata=metadata))

    def evaluate(self, spec: TableSpec, outcome: checks.CheckOutcome, n: int = 1) -> None:
        """Log ``outcome`` as ``spec``'s ``duplicate_free`` check evaluation, standing for ``n`` checks (the
        earlier ones passed); alert on a change of status (from the verdict the check stood at)."""
        failed_before = self._stands_failed(spec)
        self.failing[spec.identifier] = not outcome.passed
        if self.slack is not None:
            alert_check(self.context, self.slack, spec, CHECK, outcome, "ERROR", in_run=not failed_before)
        result = check_result(replace(outcome, figures={**outcome.figures, "checks": n}), AssetCheckSeverity.ERROR)
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


__all__ = ["ChoreReports"]
