"""The publish phase: the conditional commit of an attempt, then the follow-ups.

The attempt becomes the target ref's head, and the attempt branch is dropped, in one commit:
the arrow writer's data files are committed as the new snapshot under requirements on both
refs; a snapshot on the attempt branch is fast-forwarded to, which Iceberg refuses unless the
ref is still an ancestor of the branch. The JDBC catalog swaps the metadata pointer atomically,
so of two attempts planned on the same base exactly one publishes and the other gets
:class:`CommitConflictError`. Then the dead-letter snapshot is
published, the dead-letter branch dropped, and the committed offsets are mirrored into the
consumer group.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pyiceberg.exceptions import CommitFailedException

from kafka_iceberg.batch.commit import stage_publish
from kafka_iceberg.batch.commit_retry import CommitRetry
from kafka_iceberg.batch.context import Lake
from kafka_iceberg.batch.files import discard
from kafka_iceberg.batch.types import PublishedCommit, WritePlan, WrittenAttempt
from kafka_iceberg.catalog.tables import TableMetadataView, metadata_view
from kafka_iceberg.errors import CommitConflictError, LakeError
from kafka_iceberg.state import ancestors

log = logging.getLogger(__name__)

_REFUSED = ("not an ancestor", "CommitFailedException", "refresh is required")


def publish(lake: Lake, plan: WritePlan, attempt: WrittenAttempt) -> PublishedCommit:
    """Make the attempt visible on the target ref, and drop the attempt branch, in one catalog
    commit, if the ref is still at the planned base. The commit point of the micro-batch.

    Data files (the arrow writer) are committed as the ref's new snapshot by :func:`_publish_files`.
    A snapshot on the attempt branch is fast-forwarded to by :func:`_fast_forward`.

    Raises:
        CommitConflictError: the ref moved since the plan (nothing published).
        LakeError: the attempt branch moved or vanished (recovery judged the attempt dead).
        CatalogUnavailableError: the retries ran out.
    """
    if attempt.files is not None:
        snapshot_id, summary = _publish_files(lake, plan, attempt)
    else:
        snapshot_id = _fast_forward(lake, plan, attempt)
        summary = attempt.history.snapshots[snapshot_id].summary
    return PublishedCommit(
        snapshot_id,
        int(summary.get("added-data-files", 0)),
        int(summary.get("added-files-size", 0)),
        attempt.dead_letter_snapshot_id,
        int(summary["total-records"]) if "total-records" in summary else None,
    )


def _moved(plan: WritePlan, head: object, how: str = "") -> CommitConflictError:
    target = plan.target
    return CommitConflictError(
        f"table {target.identifier}: {target.ref} moved from snapshot {plan.base_snapshot_id} to {head} after this "
        f"micro-batch was planned; another run committed first{how}. Nothing was published; rerun to re-plan."
    )


def _fast_forward(lake: Lake, plan: WritePlan, attempt: WrittenAttempt) -> int:
    """Fast-forward the target ref to the attempt's snapshot and drop the branch, through Iceberg's
    Java API: ``ManageSnapshots.fastForwardBranch`` (what the ``fast_forward`` procedure calls) then
    ``removeBranch``, one commit. Iceberg refuses it unless the ref is an ancestor of the branch, and
    the catalog if the table changed since the load it starts from. The write phase's metadata is
    the first check. A transient catalog error is retried only after re-reading the ref: at the new
    snapshot means the commit landed; still at the base means retry; anything else is a conflict."""
    target, ref = plan.target, plan.target.ref

    def check(view=None) -> int | None:
        head = (view or lake.history(target.identifier)).refs.get(ref)
        if head == attempt.snapshot_id:
            return head
        if head != plan.base_snapshot_id:
            raise _moved(plan, head)
        return None

    def fast_forward() -> int:
        table = lake.java_table(target.identifier)
        try:
            table.manageSnapshots().fastForwardBranch(ref, attempt.branch).removeBranch(attempt.branch).commit()
        except Exception as exc:
            text = str(exc)
            if any(marker in text for marker in _REFUSED):
                raise _moved(
                    plan, "another snapshot", f" (Iceberg refused the fast-forward: {_java_message(text)})"
                ) from None
            raise
        return table.refs().get(ref).snapshotId()  # the table as committed, reloaded by Iceberg

    check(attempt.history)
    head = lake.retry(
        f"table {target.identifier}: publish branch {attempt.branch} to {ref}", fast_forward, before_retry=check
    )
    if head != attempt.snapshot_id:
        raise CommitConflictError(
            f"table {target.identifier}: {ref} is at snapshot {head}, not {attempt.snapshot_id}, after the fast-forward"
        )
    return head


def _publish_files(lake: Lake, plan: WritePlan, attempt: WrittenAttempt) -> tuple[int, Mapping[str, str]]:
    """Commit the attempt's data files as the target ref's new snapshot (parent: the attempt branch's
    head) and drop the branch, in one catalog commit (:func:`~kafka_iceberg.batch.commit.stage_publish`)
    requiring the ref at the planned base, the branch at its head and the default partition spec the
    files were written for. Returns the snapshot id and its summary.

    The first try commits on ``attempt.table`` (the table as the branch commit returned it). A try
    refused while the table moved (another commit landed: a compaction, an expiry, another branch) is
    made again on a fresh load, with backoff, as the table's ``commit.retry.*`` properties say
    (:class:`~kafka_iceberg.batch.commit_retry.CommitRetry`), each after checking that both refs are still
    where the commit needs them; a transient catalog error is retried likewise after re-reading the
    refs. A refused try deletes the manifests and manifest list it wrote; a publish that did not land
    deletes the data files too.

    Raises:
        CommitConflictError: the ref moved, or the default spec or format version changed (nothing published).
        LakeError, CatalogUnavailableError: as :func:`publish`.
    """
    files = _FilesPublish(lake, plan, attempt)
    try:
        published = lake.retry(
            f"table {plan.target.identifier}: publish the files of {attempt.branch} to {plan.target.ref}",
            files.commit,
            before_retry=files.landed,
        )
    except Exception:
        _discard_unless_committed(lake, plan.target.identifier, attempt.files, files.tries)
        raise
    for staged in files.tries:
        if staged.snapshot_id != published[0]:
            staged.discard()  # a try whose outcome a transient error hid, and that did not land
    return published


class _FilesPublish:
    """The tries of one publish of data files; ``tries``: the staged commits whose outcome is unknown
    (a transient error hid it) or that landed."""

    def __init__(self, lake: Lake, plan: WritePlan, attempt: WrittenAttempt):
        self.lake, self.plan, self.attempt, self.tries = lake, plan, attempt, []
        self.rebased_on: int | None = None  # the ref's head, when compactions moved it since the plan
        self.layout = (attempt.table.metadata.default_spec_id, attempt.table.metadata.format_version)

    def check(self, view: TableMetadataView) -> int | None:
        """Our snapshot id when a try landed; None when both refs are where the commit needs them.

        Raises:
            CommitConflictError: the ref moved. LakeError: the attempt branch moved or vanished.
        """
        plan, attempt = self.plan, self.attempt
        head = view.refs.get(plan.target.ref)
        if head in [t.snapshot_id for t in self.tries]:
            return head
        if head != plan.base_snapshot_id:
            if not only_compactions_since(view, head, plan.base_snapshot_id):
                raise _moved(plan, head)
            self.rebased_on = head
        if view.refs.get(attempt.branch) != attempt.branch_base:
            raise LakeError(
                f"table {plan.target.identifier}: attempt branch {attempt.branch} moved or vanished before its "
                "publish (recovery judged the attempt dead); nothing was published"
            )
        return None

    def landed(self, table=None) -> tuple[int, Mapping[str, str]] | None:
        """The snapshot id and summary of a try that landed, from ``table`` (default: a fresh load); None
        when none did and both refs are where the commit needs them."""
        view = metadata_view(table or self.lake.load(self.plan.target.identifier))
        head = self.check(view)
        return None if head is None else (head, view.snapshots[head].summary)

    def commit(self) -> tuple[int, Mapping[str, str]]:
        """Try on ``attempt.table`` (after a transient error: on a fresh load), then on fresh loads
        while tries are refused, within the table's retry policy."""
        table = self.attempt.table if not self.tries else None
        for tried in CommitRetry.of(self.attempt.table.metadata.properties).retrying(CommitFailedException):
            with tried:
                if table is None:
                    table = self.lake.load(self.plan.target.identifier)
                    done = self.landed(table)
                    if done is not None:
                        return done
                base, table = table, None
                return self.once(base)
        raise AssertionError("unreachable: the retries re-raise")

    def once(self, table) -> tuple[int, Mapping[str, str]]:
        """Stage and commit on ``table``; a refused try deletes what it wrote and re-raises."""
        plan, attempt = self.plan, self.attempt
        staged = stage_publish(
            table,
            attempt.files,
            attempt.summary,
            branch=attempt.branch,
            branch_base=attempt.branch_base,
            ref=plan.target.ref,
            ref_base=self.rebased_on or plan.base_snapshot_id,
            layout=self.layout,
            rebased=self.rebased_on is not None,
        )
        self.tries.append(staged)
        try:
            committed = staged.commit().metadata.snapshot_by_id(staged.snapshot_id)
        except (CommitFailedException, ValueError):
            self.tries.remove(staged)
            staged.discard()  # refused: it did not land
            raise
        return staged.snapshot_id, dict(committed.summary.additional_properties)


def only_compactions_since(view: TableMetadataView, head: int | None, base: int | None) -> bool:
    """Whether every snapshot from ``head`` back to ``base`` (exclusive) only rewrote files
    (operation ``replace``: ``rewrite_data_files``, ``rewrite_position_delete_files``): the data and
    the ingest state at ``head`` are those at ``base``, so a micro-batch planned on ``base`` may append
    on ``head``, as Iceberg's own appends commute with a compaction. Any other commit (an append, an
    overwrite, a delete, another micro-batch) or an unknown ancestry is a conflict."""
    if head is None or base is None:
        return False
    for snap in ancestors(view.snapshots, head):
        if snap.snapshot_id == base:
            return True
        if snap.summary.get("operation") != "replace" or snap.is_ingest:
            return False
    return False


def _discard_unless_committed(lake: Lake, identifier: str, files, tries: list) -> None:
    """After a failed publish: delete ``files`` and the manifests and manifest lists of ``tries`` (the
    :class:`~kafka_iceberg.batch.commit.StagedPublish` es whose outcome is unknown) unless one of them
    is in the table (a snapshot that landed keeps them). Best effort: left, they are orphans for
    recovery and maintenance to delete."""
    try:
        table = lake.load(identifier)
        if not any(table.snapshot_by_id(t.snapshot_id) for t in tries):
            discard(table.io, files)
            for staged in tries:
                staged.discard()
    except Exception as exc:  # noqa: BLE001 - the original error matters more; orphan removal remains
        log.warning("table %s: files of a failed publish were not checked for deletion (%s)", identifier, exc)


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
        lake.sql(
            f"table {dead_letter_table}: publish dead-letter branch {branch}",
            f"CALL {lake.catalog_name}.system.fast_forward('{dead_letter_table}', 'main', '{branch}')",
            before_retry=done,
        )


def drop_branch(lake: Lake, identifier: str, branch: str) -> None:
    """Drop an attempt branch after its publish; a failure is logged (the next recovery drops it)."""
    try:
        lake.sql(
            f"table {identifier}: drop branch {branch}",
            f"ALTER TABLE {lake.catalog_name}.{identifier} DROP BRANCH IF EXISTS `{branch}`",
        )
    except Exception as exc:  # published already; the next recovery drops it
        log.warning("table %s: could not drop branch %s (%s); the next run drops it", identifier, branch, exc)


def mirror_group(
    lake: Lake, plan: WritePlan, offsets: Mapping[int, int], only_if_different: bool = False
) -> str | None:
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
