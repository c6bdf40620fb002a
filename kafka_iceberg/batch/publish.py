"""The publish phase: the conditional commit of an attempt, then the follow-ups.

The target ref is fast-forwarded to the attempt branch with Iceberg's ``fast_forward``
procedure, which Iceberg refuses unless the ref is still an ancestor of the branch; the JDBC
catalog swaps the metadata pointer atomically, so of two attempts planned on the same base
exactly one publishes and the other gets :class:`CommitConflictError`. Then the dead-letter
snapshot is published, the attempt branches are dropped, and the committed offsets are
mirrored into the consumer group.
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
    """Fast-forward the target ref to the attempt's snapshot if it is still at the planned base.
    The commit point of the micro-batch. Uses the metadata the write phase loaded as its first
    check and loads it once more to confirm.

    A transient catalog error is retried only after re-reading the ref: at the new snapshot
    means the fast-forward landed; still at the base means retry; anything else is a conflict.

    Raises:
        CommitConflictError: the ref moved since the plan (nothing published).
        CatalogUnavailableError: the retries ran out.
    """
    target, ref = plan.target, plan.target.ref
    sql = f"CALL {lake.catalog_name}.system.fast_forward('{target.identifier}', '{ref}', '{attempt.branch}')"

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

    def fast_forward():
        try:
            lake.spark.sql(sql)
        except Exception as exc:
            text = str(exc)
            if any(marker in text for marker in _REFUSED):
                raise CommitConflictError(
                    f"table {target.identifier}: {ref} moved after this micro-batch was planned (Iceberg refused the "
                    f"fast-forward: {text.splitlines()[0][:300]}). Nothing was published; rerun to re-plan."
                ) from None
            raise

    check(attempt.history)
    lake.retry(f"table {target.identifier}: publish branch {attempt.branch} to {ref}", fast_forward, before_retry=check)
    view = lake.history(target.identifier)
    if view.refs.get(ref) != attempt.snapshot_id:
        raise CommitConflictError(f"table {target.identifier}: {ref} is not at snapshot {attempt.snapshot_id} "
                                  "after the fast-forward")
    summary = view.snapshots[attempt.snapshot_id].summary
    return PublishedCommit(attempt.snapshot_id, int(summary.get("added-data-files", 0)),
                           int(summary.get("added-files-size", 0)), attempt.dead_letter_snapshot_id,
                           int(summary["total-records"]) if "total-records" in summary else None)


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
