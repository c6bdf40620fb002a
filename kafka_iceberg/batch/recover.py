"""The recovery phase: finish what dead attempts left on a table and its dead-letter table
(see :mod:`kafka_iceberg.batch.recovery`), after rolling the dead-letter table forward to every
dead-letter snapshot a published snapshot points at.

It starts from histories the caller loaded and loads again only after it changed a table, so
a batch with nothing to recover reads each table's metadata once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kafka_iceberg.batch.context import Lake
from kafka_iceberg.batch.publish import publish_dead_letter
from kafka_iceberg.batch.recovery import Attempt, RecoveryReport, age_liveness, recover
from kafka_iceberg.catalog.tables import TableMetadataView
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.errors import LakeError
from kafka_iceberg.state import ancestors, dead_letter_ref

log = logging.getLogger(__name__)


def recover_tables(
    lake: Lake,
    spec: TableSpec,
    history: TableMetadataView,
    dead_letters: TableMetadataView | None,
    is_alive: Callable[[Attempt], bool] | None = None,
    only: set[str] | None = None,
) -> tuple[RecoveryReport, TableMetadataView]:
    """Recover the table (``history``) and its dead-letter table (``dead_letters``; None when it does
    not exist). ``only``: restrict to these attempt branches (an attempt cleaning up after itself).

    Returns the report and the table's history as of after recovery (the one given when
    recovery changed nothing).

    Raises:
        LakeError: a dead-letter snapshot a published snapshot points at is gone.
        Whatever Spark raises for the DDL and procedures (recovery is idempotent).
    """
    alive = is_alive or age_liveness(lake.settings.attempt_timeout_s)
    report = RecoveryReport()
    targets = [(spec.identifier, history, "")]
    if dead_letters is not None:
        report.rolled_forward = roll_forward_dead_letters(lake, spec, history, dead_letters)
        if report.rolled_forward:
            dead_letters = lake.history(dead_letters_id(spec))
        targets.append((dead_letters_id(spec), dead_letters, f"{dead_letters_id(spec)}:"))
    for ident, view, prefix in targets:
        given = [view]  # a retry after a transient error starts from freshly loaded metadata

        def attempt(ident=ident, given=given):
            return recover(
                lake.spark,
                catalog_name=lake.catalog_name,
                identifier=ident,
                view=given.pop() if given else None,
                load_view=lambda: lake.history(ident),
                is_alive=alive,
                clock_skew_s=lake.settings.orphan_clock_skew_s,
                only=only,
            )

        part = lake.retry(f"table {spec.identifier}: recover {ident}", attempt)
        report.dead_attempts += [prefix + b for b in part.dead_attempts]
        report.live_attempts += [prefix + b for b in part.live_attempts]
        report.expired_snapshots += part.expired_snapshots
        report.orphan_files_deleted += part.orphan_files_deleted
        if ident == spec.identifier and (part.dead_attempts or part.expired_snapshots):
            history = lake.history(ident)
    return report, history


def dead_letters_id(spec: TableSpec) -> str:
    """The dead-letter table's identifier."""
    return spec.bad_records.dead_letter_identifier


def roll_forward_dead_letters(
    lake: Lake, spec: TableSpec, history: TableMetadataView, dead_letters: TableMetadataView
) -> list[int]:
    """Publish dead-letter snapshots that ``main``'s published snapshots point at but the dead-letter
    table's ``main`` does not reach yet (a crash between the two publishes). Returns their ids,
    oldest first.

    Raises:
        LakeError: a pointed-at dead-letter snapshot is gone (its branch was dropped unpublished).
    """
    dlq = dead_letters_id(spec)
    published = {s.snapshot_id for s in ancestors(dead_letters.snapshots, dead_letters.main)}
    pending = []
    for snap in ancestors(history.snapshots, history.main):
        ref = dead_letter_ref(snap)
        if ref is None:
            continue
        if int(ref["snapshot-id"]) in published:
            break
        pending.append(ref)
    rolled = []
    for ref in reversed(pending):  # oldest first: each is a descendant of the one before
        sid, branch = int(ref["snapshot-id"]), ref["branch"]
        if dead_letters.refs.get(branch) != sid:
            raise LakeError(
                f"table {spec.identifier}: dead-letter snapshot {sid} of {dlq} (branch {branch}) is referenced "
                "by a published snapshot but is gone; its quarantined records are lost. See docs/operations.md."
            )
        publish_dead_letter(lake, dlq, branch, sid)
        log.warning("table %s: rolled dead-letter table %s forward to snapshot %s", spec.identifier, dlq, sid)
        rolled.append(sid)
    return rolled
