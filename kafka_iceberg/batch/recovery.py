"""Write attempts and their recovery.

Every micro-batch is an *attempt*. Before it writes anything, it creates an Iceberg
branch named ``ingest_<start ms>_<commit id>`` at the ``main`` snapshot it planned on
(its base). It writes its data files and one snapshot to that branch, publishes by
fast-forwarding ``main`` to the branch, then drops the branch. So an attempt that dies
leaves its branch behind, and the branch tells the next run who it was and when it began.

Recovery, run at the start of every micro-batch, in an order that leaves a trail until
its last step (a crash during recovery is recovered by the next recovery):

1. Find *dead* attempts: attempt branches whose run is no longer alive (the Dagster run
   is not queued or running; outside Dagster, the attempt is older than
   ``attempt_timeout_s``, 1 h).
2. If there is one, retire the dead branches first: tag each branch's snapshot as
   ``dead_<branch>``, then drop the branch. An attempt judged dead that still runs can then no
   longer publish (its publish requires its branch), so it cannot publish a snapshot pointing
   at files step 3 deletes. The tag keeps the trail: a recovery that finds a ``dead_`` tag
   redoes step 3.
3. Delete orphan files: files under the table location that no snapshot references and that
   are older than the cut-off: the earlier of the instant taken *before* the refs are read
   again after the drop and the start of every attempt those refs show (minus
   ``ORPHAN_CLOCK_SKEW_S``, 1 s). These are files a dead attempt wrote before its branch
   commit. An attempt registers its branch before writing, so one the refs do not show
   started after the cut-off instant, and its files are newer than the cut-off. Uses Iceberg's
   ``DeleteOrphanFiles`` Spark action (the ``remove_orphan_files`` procedure refuses windows
   under 24 hours). Then drop the ``dead_`` tags.
4. Expire the snapshots no ref reaches any more that the write path made (ingest snapshots,
   dead-letter snapshots, or any that hold no data), with Iceberg's ``expire_snapshots``
   procedure by snapshot id. It deletes exactly the files only those snapshots reference: a
   dead attempt's data files and quarantined records. Files of ``main`` are referenced by
   retained snapshots and are never deleted.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kafka_iceberg.catalog.spark import java_spark_actions, java_table
from kafka_iceberg.catalog.tables import TableMetadataView
from kafka_iceberg.state import KEY_DEAD_LETTER_OF, ancestors

BRANCH_PREFIX = "ingest_"
DEAD_TAG_PREFIX = "dead_"  # + an attempt branch name: a dead attempt whose orphan files may remain
_BRANCH = re.compile(r"^ingest_(\d{13})_([A-Za-z0-9_]+)$")


@dataclass(frozen=True)
class Attempt:
    """A write attempt, as recorded in its branch name."""

    branch: str
    started_ms: int  # ms since epoch, the attempt's clock when it began
    token: str  # the commit id with every non-alphanumeric character replaced by "_"


def commit_token(commit_id: str) -> str:
    """The branch-safe spelling of a commit id (``-`` and other punctuation become ``_``)."""
    return re.sub(r"[^A-Za-z0-9]", "_", commit_id)


def attempt_branch(commit_id: str, started_ms: int) -> str:
    """Branch name for an attempt of ``commit_id`` started at ``started_ms``."""
    return f"{BRANCH_PREFIX}{started_ms:013d}_{commit_token(commit_id)}"


def parse_attempt(branch: str) -> Attempt | None:
    """The :class:`Attempt` behind an attempt branch name, or None for any other ref."""
    m = _BRANCH.match(branch)
    return Attempt(branch, int(m.group(1)), m.group(2)) if m else None


def age_liveness(timeout_s: float, now_ms: Callable[[], int] | None = None) -> Callable[[Attempt], bool]:
    """Liveness outside Dagster: an attempt is alive while younger than ``timeout_s`` seconds."""
    clock = now_ms or (lambda: int(time.time() * 1000))
    return lambda attempt: clock() - attempt.started_ms < timeout_s * 1000


@dataclass
class RecoveryReport:
    """What recovery found and removed on one table."""

    dead_attempts: list[str] = field(default_factory=list)  # branch names
    live_attempts: list[str] = field(default_factory=list)
    expired_snapshots: list[int] = field(default_factory=list)
    orphan_files_deleted: list[str] = field(default_factory=list)
    rolled_forward: list[int] = field(default_factory=list)  # dead-letter snapshots published late

    @property
    def did_anything(self) -> bool:
        """True when recovery changed the table or deleted files."""
        return bool(self.dead_attempts or self.expired_snapshots or self.orphan_files_deleted or self.rolled_forward)


def _reachable(view: TableMetadataView, skip: set[str]) -> set[int]:
    out: set[int] = set()
    for name, head in view.refs.items():
        if name not in skip:
            out.update(s.snapshot_id for s in ancestors(view.snapshots, head))
    return out


def expirable_snapshots(view: TableMetadataView, dropped: set[str]) -> list[int]:
    """Snapshots no remaining ref reaches once ``dropped`` refs are gone, that the write path made
    (they carry ``kafka.offsets``, or ``kafka.dead-letter-of`` on a dead-letter table) or that hold
    no data files (empty branch-creation snapshots)."""
    reachable = _reachable(view, dropped)
    out = []
    for sid, snap in view.snapshots.items():
        if sid in reachable:
            continue
        if snap.is_ingest or KEY_DEAD_LETTER_OF in snap.summary or snap.summary.get("total-data-files", "0") == "0":
            out.append(sid)
    return sorted(out)


def delete_orphan_files(spark, qualified_table: str, older_than_ms: int) -> list[str]:
    """Delete files under the table location that no snapshot references and that were last
    modified before ``older_than_ms`` (ms since epoch). Returns their locations.

    Runs Iceberg's ``SparkActions.deleteOrphanFiles`` action through the JVM gateway. A table on
    object storage (location not ``file:``) is listed through its FileIO's prefix listing
    (``usePrefixListing``), since Hadoop has no ``s3://`` filesystem without hadoop-aws.
    """
    jtable = java_table(spark, qualified_table)
    action = java_spark_actions(spark).deleteOrphanFiles(jtable)
    if not str(jtable.location()).startswith(("file:", "/")):
        action = action.usePrefixListing(True)
    result = action.olderThan(int(older_than_ms)).execute()
    it = result.orphanFileLocations().iterator()
    out = []
    while it.hasNext():
        out.append(str(it.next()))
    return out


def expire_snapshot_ids(spark, catalog_name: str, identifier: str, snapshot_ids: list[int]) -> None:
    """Expire exactly ``snapshot_ids`` (no age-based expiry) with the ``expire_snapshots`` procedure,
    deleting the files only they reference."""
    if not snapshot_ids:
        return
    ids = ", ".join(f"{int(s)}L" for s in snapshot_ids)
    spark.sql(
        f"CALL {catalog_name}.system.expire_snapshots(table => '{identifier}', snapshot_ids => array({ids}), "
        "older_than => TIMESTAMP '1970-01-01 00:00:01')"
    )


def recover(
    spark,
    *,
    catalog_name: str,
    identifier: str,
    load_view: Callable[[], TableMetadataView],
    view: TableMetadataView | None = None,
    is_alive: Callable[[Attempt], bool],
    clock_skew_s: float,
    only: set[str] | None = None,
) -> RecoveryReport:
    """Clean up what dead attempts left on one table (see the module docstring).

    Args:
        load_view: returns the table's current metadata (called again after each change).
        view: the table's current metadata if the caller has it (then not loaded first).
        is_alive: decides whether an attempt's run may still be writing.
        only: restrict to these branch names (an attempt cleaning up after its own failure).

    Raises:
        Whatever Spark raises for the DDL and procedures; recovery is idempotent, so the next
        run simply repeats it.
    """
    report = RecoveryReport()
    view = view or load_view()
    attempts = [a for a in (parse_attempt(n) for n in view.refs) if a is not None]
    if only is not None:
        attempts = [a for a in attempts if a.branch in only]
        dead = attempts
        live_all = [a for a in (parse_attempt(n) for n in view.refs) if a is not None and a.branch not in only]
        live = [a for a in live_all if is_alive(a)]
    else:
        dead = [a for a in attempts if not is_alive(a)]
        live = [a for a in attempts if a not in dead]
    dropped = {a.branch for a in dead}
    unfinished = dead_tags(view)  # dead attempts an interrupted recovery retired before deleting their orphans
    report.dead_attempts = sorted(dropped | {t.removeprefix(DEAD_TAG_PREFIX) for t in unfinished})
    report.live_attempts = [a.branch for a in live]
    qualified_table = f"{catalog_name}.{identifier}"
    pending = expirable_snapshots(view, dropped | unfinished)
    if not report.dead_attempts and not pending:
        return report
    if report.dead_attempts:
        view, before_ms = _retire_then_reload(spark, qualified_table, {b: view.refs[b] for b in dropped}, load_view)
        cutoff = _orphan_cutoff(view, before_ms, dropped, clock_skew_s)
        report.orphan_files_deleted = delete_orphan_files(spark, qualified_table, cutoff)
        retired = dead_tags(view)
        for tag in sorted(retired):
            spark.sql(f"ALTER TABLE {qualified_table} DROP TAG IF EXISTS `{tag}`")
        pending = expirable_snapshots(view, retired)
    expire_snapshot_ids(spark, catalog_name, identifier, pending)
    report.expired_snapshots = pending
    return report


def dead_tags(view: TableMetadataView) -> set[str]:
    """The ``dead_<attempt branch>`` tags of ``view``: dead attempts whose orphan files may remain."""
    return {n for n in view.refs if n.startswith(DEAD_TAG_PREFIX) and parse_attempt(n.removeprefix(DEAD_TAG_PREFIX))}


def _retire_then_reload(spark, qualified_table: str, dead: dict[str, int], load_view) -> tuple[TableMetadataView, int]:
    """Tag each dead branch's snapshot (``dead``: branch -> snapshot id) as ``dead_<branch>``, drop the
    branch, then read the refs again; returns that view and the instant (ms since epoch) taken just
    before the read."""
    for branch, snapshot_id in sorted(dead.items()):
        tag = DEAD_TAG_PREFIX + branch
        spark.sql(f"ALTER TABLE {qualified_table} CREATE OR REPLACE TAG `{tag}` AS OF VERSION {int(snapshot_id)}")
        spark.sql(f"ALTER TABLE {qualified_table} DROP BRANCH IF EXISTS `{branch}`")
    before_ms = int(time.time() * 1000)  # before the refs are read: an attempt they miss starts later
    return load_view(), before_ms


def _orphan_cutoff(view: TableMetadataView, before_ms: int, dropped: set[str], clock_skew_s: float) -> int:
    """The orphan cut-off (ms since epoch): the earlier of ``before_ms`` (taken before ``view`` was read)
    and the start of every attempt branch ``view`` shows that is not ``dropped``, minus the clock skew."""
    starts = [a.started_ms for a in (parse_attempt(n) for n in view.refs) if a is not None and a.branch not in dropped]
    return min([before_ms, *starts]) - int(clock_skew_s * 1000)


__all__ = [
    "Attempt",
    "RecoveryReport",
    "age_liveness",
    "attempt_branch",
    "commit_token",
    "dead_tags",
    "delete_orphan_files",
    "expirable_snapshots",
    "expire_snapshot_ids",
    "parse_attempt",
    "recover",
]
