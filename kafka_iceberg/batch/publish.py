"""The publish phase: the conditional commit of an attempt, then the follow-ups.

The target ref is fast-forwarded to the attempt branch, and the branch dropped, in one commit,
which Iceberg refuses unless the ref is still an ancestor of the branch; the JDBC catalog swaps
the metadata pointer atomically, so of two attempts planned on the same base exactly one
publishes and the other gets :class:`CommitConflictError`. Then the dead-letter snapshot is
published, the dead-letter branch dropped, and the committed offsets are mirrored into the
consumer group.
"""

from __future__ import annotations

import logging
from typing import Mapping

from kafka_iceberg.batch.context import Lake
from kafka_iceberg.batch.types import PublishedCommit, WritePlan, WrittenAttempt
from kafka_iceberg.errors import CommitConflictError, LakeError

log = logging.getLogger(__name__)

_REFUSED = ("not an ancestor", "CommitFailedException", "refresh is required")


def publish(lake: Lake, plan: WritePlan, attempt: WrittenAttempt) -> PublishedCommit:
    """Fast-forward the target ref to the attempt's snapshot and drop the attempt branch, in one
    catalog commit, if the ref is still at the planned base. The commit point of the micro-batch.

    The commit goes through Iceberg's Java API: ``ManageSnapshots.fastForwardBranch`` (what the
    ``fast_forward`` procedure calls) then ``removeBranch``. Iceberg refuses it unless the ref is
    an ancestor of the branch, and the catalog refuses it if the table changed since the load it
    starts from. The write phase's metadata is the first check, and the summary comes from it: no
    pyiceberg load. A transient catalog error is retried only after re-reading the ref: at the new
    snapshot means the commit landed; still at the base means retry; anything else is a conflict.

    Raises:
        CommitConflictError: the ref moved since the plan (nothing published).
        CatalogUnavailableError: the retries ran out.
    """
    target, ref = plan.target, plan.target.ref

    def check(view=None) -> int | None:
        head = (view or lake.history(target.identifier)).refs.get(ref)
        if head == attempt.snapshot_id:
            return head
        if head != plan.base_snapshot_id:
            raise CommitConflictError(
                f"table {target.identifier}: {ref} moved from snapshot {plan.base_snapshot_id} to {head} after this "
                "micro-batch was planned; another run committed first. Nothing was published; rerun to re-plan."
            )
        return None

    def fast_forward() -> int:
        table = lake.java_table(target.identifier)
        try:
            table.manageSnapshots().fastForwardBranch(ref, attempt.branch).removeBranch(attempt.branch).commit()
        except Exception as exc:
            text = str(exc)
            if any(marker in text for marker in _REFUSED):
                raise CommitConflictError(
                    f"table {target.identifier}: {ref} moved after this micro-batch was planned (Iceberg refused the "
                    f"fast-forward: {_java_message(text)}). Nothing was published; rerun to re-plan."
                ) from None
            raise
        return table.refs().get(ref).snapshotId()  # the table as committed, reloaded by Iceberg

    check(attempt.history)
    head = lake.retry(f"table {target.identifier}: publish branch {attempt.branch} to {ref}", fast_forward,
                      before_retry=check)
    if head != attempt.snapshot_id:
        raise CommitConflictError(f"table {target.identifier}: {ref} is at snapshot {head}, not "
                                  f"{attempt.snapshot_id}, after the fast-forward")
    summary = attempt.history.snapshots[attempt.snapshot_id].summary
    return PublishedCommit(attempt.snapshot_id, int(summary.get("added-data-files", 0)),
                           int(summary.get("added-files-size", 0)), attempt.dead_letter_snapshot_id,
                           int(summary["total-records"]) if "total-records" in summary else None)


def _java_message(text: str) -> str:
    """The line of a Py4J error's text that names the Java exception (else its first line), cut to 300 characters."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    named = [ln for ln in lines if any(marker in ln for marker in _REFUSED)]
    return (named or lines or [""])[0][:300]


def publish_dead_letter(lake: Lake, dead_letter_table: str, branch: str, snapshot_id: int) -> None:
    """Fast-forward the dead-letter table's ``main`` to ``snapshot_id`` on ``branch`` (after the
    table published the batch that points at it); a no-op when it is there already."""
    def done():
        return True if lake.history(dead_letter_table).main == snapshot_id else None

    if done() is None:
        lake.sql(f"table {dead_letter_table}: publish dead-letter branch {branch}",
                 f"CALL {lake.catalog_name}.system.fast_forward('{dead_letter_table}', 'main', '{branch}')",
                 before_retry=done)


def drop_branch(lake: Lake, identifier: str, branch: str) -> None:
    """Drop an attempt branch after its publish; a failure is logged (the next recovery drops it)."""
    try:
        lake.sql(f"table {identifier}: drop branch {branch}",
                 f"ALTER TABLE {lake.catalog_name}.{identifier} DROP BRANCH IF EXISTS `{branch}`")
    except Exception as exc:  # published already; the next recovery drops it
        log.warning("table %s: could not drop branch %s (%s); the next run drops it", identifier, branch, exc)


def mirror_group(lake: Lake, plan: WritePlan, offsets: Mapping[int, int], only_if_different: bool = False) -> str | None:
    """Mirror the committed ``offsets`` into the target's consumer group (none: nothing to do), so
    lag tools see them. The table is the source of truth: a group that disagrees is
    overwritten. Returns the error text of a failure (logged, never fatal), else None."""
    group, topic = plan.target.consumer_group, plan.offsets.topic
    if group is None or not offsets:
        return None
    try:
        if only_if_different and lake.kafka.group_offsets(group, topic, sorted(offsets)) == dict(offsets):
            return None
        lake.kafka.commit_group_offsets(group, topic, dict(offsets))
    except LakeError as exc:
        log.warning("table %s: consumer group %s not updated: %s", plan.target.identifier, group, exc)
        return str(exc)
    return None
