"""The order of recovery's steps (kafka_iceberg/batch/recovery.py): dead branches are tagged ``dead_<branch>``
and dropped before orphan files are deleted, the tags only after, and the orphan cut-off is taken before the refs it is bounded by are read,
so an attempt that registers its branch meanwhile never has its files deleted. Spark's part (the DDL,
the orphan action) is recorded, not run: what is checked is the order and the cut-off."""

from __future__ import annotations

import time

from kafka_iceberg.batch import recovery
from kafka_iceberg.batch.recovery import attempt_branch, recover
from kafka_iceberg.catalog.tables import TableMetadataView
from kafka_iceberg.state import SnapshotInfo

SKEW_S = 5.0


class Recorder:
    """Stands in for the Spark session: records each statement, the orphan deletion and each load."""

    def __init__(self):
        self.steps: list[tuple] = []

    def sql(self, statement: str):
        self.steps.append(("sql", statement))


def _view(refs: dict[str, int]) -> TableMetadataView:
    snaps = {1: SnapshotInfo(1, None, 0, {"kafka.offsets": "{}", "total-data-files": "1"})}
    return TableMetadataView(snaps, refs, "file:///t/metadata/00001.metadata.json")


def _recover(spark, refs: dict[str, int], is_alive, load_view=None):
    """Recovery of table ``lake.db.t`` whose refs are ``refs`` (and stay so unless ``load_view`` says)."""
    return recover(
        spark,
        catalog_name="lake",
        identifier="db.t",
        load_view=load_view or (lambda: _view(refs)),
        view=_view(refs),
        is_alive=is_alive,
        clock_skew_s=SKEW_S,
    )


def test_dead_branches_are_dropped_before_orphans_are_deleted_and_the_cutoff_precedes_the_refs_read(monkeypatch):
    spark = Recorder()
    dead = attempt_branch("dead-run", int(time.time() * 1000) - 3_600_000)
    newcomer = {}

    def load_view():
        # an attempt that registers its branch while recovery runs: the first load after the drop shows it
        # with a start a little after the instant recovery took before this load
        spark.steps.append(("load", int(time.time() * 1000)))
        newcomer.setdefault("branch", attempt_branch("new-run", int(time.time() * 1000) + 1))
        return _view({"main": 1, newcomer["branch"]: 1, f"dead_{dead}": 1})

    def delete_orphan_files(_spark, table, older_than_ms):
        spark.steps.append(("orphans", older_than_ms))
        return []

    monkeypatch.setattr(recovery, "delete_orphan_files", delete_orphan_files)
    monkeypatch.setattr(recovery, "expire_snapshot_ids", lambda *a: spark.steps.append(("expire", a[3])))
    report = _recover(spark, {"main": 1, dead: 1}, lambda a: a.branch != dead, load_view)
    kinds = [s[0] for s in spark.steps]
    statements = [s[1] for s in spark.steps if s[0] == "sql"]
    assert statements[:2] == [
        f"ALTER TABLE lake.db.t CREATE OR REPLACE TAG `dead_{dead}` AS OF VERSION 1",
        f"ALTER TABLE lake.db.t DROP BRANCH IF EXISTS `{dead}`",
    ], "the trail (the tag) is laid before the branch goes"
    assert kinds.index("sql") < kinds.index("load") < kinds.index("orphans"), spark.steps
    assert spark.steps[kinds.index("orphans") + 1] == ("sql", f"ALTER TABLE lake.db.t DROP TAG IF EXISTS `dead_{dead}`")
    loaded_at = spark.steps[kinds.index("load")][1]
    cutoff = spark.steps[kinds.index("orphans")][1]
    assert cutoff <= loaded_at - SKEW_S * 1000, "the cut-off instant is taken before the refs are read"
    started = recovery.parse_attempt(newcomer["branch"]).started_ms
    assert cutoff < started, "an attempt started after the refs were read keeps its files"
    assert report.dead_attempts == [dead]


def test_nothing_is_dropped_or_deleted_without_a_dead_attempt(monkeypatch):
    spark = Recorder()
    live = attempt_branch("live-run", int(time.time() * 1000))
    monkeypatch.setattr(recovery, "delete_orphan_files", lambda *a: spark.steps.append(("orphans",)) or [])
    report = _recover(spark, {"main": 1, live: 1}, lambda a: True)
    assert spark.steps == [] and report.live_attempts == [live]


def test_a_dead_tag_left_by_an_interrupted_recovery_has_its_orphans_deleted_then_goes(monkeypatch):
    """A recovery killed after dropping a dead branch and before deleting its orphans leaves the tag
    ``dead_<branch>``; the next recovery, with no dead branch in sight, deletes the orphans, then the tag."""
    spark = Recorder()
    tag = "dead_" + attempt_branch("dead-run", int(time.time() * 1000) - 3_600_000)
    monkeypatch.setattr(
        recovery, "delete_orphan_files", lambda _s, _t, ms: spark.steps.append(("orphans", ms)) or ["f"]
    )
    monkeypatch.setattr(recovery, "expire_snapshot_ids", lambda *a: spark.steps.append(("expire", a[3])))
    report = _recover(spark, {"main": 1, tag: 1}, lambda a: True)
    assert [s[0] for s in spark.steps] == ["orphans", "sql", "expire"], spark.steps
    assert spark.steps[1] == ("sql", f"ALTER TABLE lake.db.t DROP TAG IF EXISTS `{tag}`")
    assert report.orphan_files_deleted == ["f"] and report.dead_attempts == [tag.removeprefix("dead_")]
