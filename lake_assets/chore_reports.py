"""How a worker run's chores reach the Dagster event log (:mod:`kafka_iceberg.lake_assets.worker_chores`):
a maintenance job as an ``AssetObservation`` of its table, a ``duplicate_free`` check (incremental, or the
scheduled full scan) as the table's check evaluation, each with a line in the run's log.

The routine ones follow the commit rate: a table past ``maintenance.max_snapshots`` is checked and expired
every minute or two at a few commits a second. They are reported through a
:class:`~kafka_iceberg.batch.coalesce.Throttle`, at most once per
:data:`~kafka_iceberg.batch.coalesce.REPORT_EVERY_S` per table and kind: the latest result, with ``jobs`` or
``checks`` saying how many it stands for. A failed check, and the next pass, are reported at once; what is
held is reported when the run stops serving (:meth:`ChoreReports.drain`). Scheduled maintenance (by cron)
and the scheduled full scan are always reported. Called from the op's main thread only.
"""

from __future__ import annotations

from dataclasses import replace

from dagster import AssetCheckEvaluation, AssetCheckSeverity, AssetObservation, OpExecutionContext

from kafka_iceberg.batch.coalesce import Throttle
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.check_alerts import alert_check
from kafka_iceberg.lake_assets.tables import check_result
from kafka_iceberg.lake_assets.vocabulary import table_key
from kafka_iceberg.ops import checks
from kafka_iceberg.ops.chore_state import CHECK
from kafka_iceberg.resources import LakeSlackResource


class ChoreReports:
    """The event-log reports of one worker op's chores. ``context``: the op's (its log and ``log_event``);
    ``slack``: the alerts' resource (None: no alerts); ``throttle``: the routine reports held back,
    keyed by (table identifier, kind)."""

    def __init__(self, context: OpExecutionContext, slack: LakeSlackResource | None, throttle: Throttle):
        self.context, self.slack, self.throttle = context, slack, throttle
        self.specs: dict[str, TableSpec] = {}
        self.failing: dict[str, bool] = {}  # identifier -> whether its last reported check failed
        self.full_failed: set[str] = set()  # identifiers whose last full scan in this run failed

    def maintenance(self, spec: TableSpec, result, routine: bool) -> None:
        """Report a maintenance job's ``MaintenanceResult`` on ``spec``'s table: ``routine`` (by count, not
        by cron) ones at most once per interval."""
        self.specs[spec.identifier] = spec
        due = self.throttle.add((spec.identifier, result.procedure), result) if routine else (result, 1)
        if due is not None:
            self.observe(spec, *due)

    def check(self, spec: TableSpec, outcome: checks.CheckOutcome) -> None:
        """Report an incremental ``duplicate_free`` outcome of ``spec``'s table: a pass at most once per
        interval, a failure at once, and the first pass after a failure at once. A pass while the table's last
        full scan in this run failed is not reported: it covers only the rows added since, so the check stays
        failed until a full scan passes."""
        self.specs[spec.identifier] = spec
        if outcome.passed and spec.identifier in self.full_failed:
            return
        urgent = not outcome.passed or self.failing.get(spec.identifier, False)
        due = self.throttle.add((spec.identifier, CHECK), outcome, urgent=urgent)
        if due is not None:
            self.evaluate(spec, *due)

    def full_check(self, spec: TableSpec, outcome: checks.CheckOutcome) -> None:
        """Report a scheduled full-scan ``duplicate_free`` outcome of ``spec``'s table at once; it supersedes
        an incremental pass held back."""
        self.specs[spec.identifier] = spec
        self.throttle.discard((spec.identifier, CHECK))
        (self.full_failed.discard if outcome.passed else self.full_failed.add)(spec.identifier)
        self.evaluate(spec, outcome)

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
        earlier ones passed); alert on a change of status (from the verdict this run reported last)."""
        failed_before = self.failing.get(spec.identifier)
        self.failing[spec.identifier] = not outcome.passed
        if self.slack is not None:
            in_run = None if failed_before is None else not failed_before
            alert_check(self.context, self.slack, spec, CHECK, outcome, "ERROR", in_run=in_run)
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
