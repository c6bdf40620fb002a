"""Slack alerts of the asset checks, on a change of status only.

The decision is plain Python (:func:`kafka_iceberg.ops.alerts.check_change`); this module reads the
check's previous verdict from the Dagster instance (its latest completed evaluation in another run)
and posts through the ``slack`` resource, with a link to the run.
"""

from dagster import AssetCheckExecutionContext, AssetCheckKey, DagsterInstance

from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.dagster_internals import completed_check_executions
from kafka_iceberg.lake_assets.vocabulary import table_key
from kafka_iceberg.ops import checks
from kafka_iceberg.ops.alerts import Severity, alert_on_check, pick_measure
from kafka_iceberg.resources.slack import LakeSlackResource


def previous_check_passed(instance: DagsterInstance, check_key: AssetCheckKey, run_id: str) -> bool | None:
    """The verdict of the check's latest completed evaluation in a run other than ``run_id``;
    ``None`` when it has none (a first evaluation)."""
    for other_run, passed in completed_check_executions(instance, check_key):
        if other_run != run_id:
            return passed
    return None


def alert_check(
    context: AssetCheckExecutionContext,
    slack: LakeSlackResource,
    spec: TableSpec,
    check_name: str,
    outcome: checks.CheckOutcome,
    severity: Severity,
    in_run: bool | None = None,
) -> bool:
    """Post the check's alert when its status changed since its previous evaluation (failed: at
    ``severity``; passes again: ``OK``), linking to this run. ``in_run``: the verdict (passed) this run last
    reported for the check (a worker run reports many; None: none yet, then the latest evaluation of another
    run counts). Returns whether a message was posted."""
    key = table_key(spec)
    run_id = context.run.run_id
    if in_run is None:
        in_run = previous_check_passed(context.instance, AssetCheckKey(key, check_name), run_id)
    return alert_on_check(
        outcome.passed,
        spec.identifier,
        key.path,
        check_name,
        *pick_measure(check_name, outcome.figures),
        outcome.summary,
        sink=slack.sink(),
        severity=severity,
        previous_passed=in_run,
        run_id=run_id,
    )


__all__ = ["alert_check", "previous_check_passed"]
