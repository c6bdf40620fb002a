"""A worker run's chore alerts post once per failure episode (lake_assets/chore_alerts.py,
kafka_iceberg/ops/chore_episodes.py): the first failure of a chore on a table posts, the failures after it
do not, in the same run or in the run that takes the table over (the episode lives in a table property of a
real pyiceberg SQL catalog), and the first success after them posts the recovery with the count."""

from types import SimpleNamespace

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog

from kafka_iceberg.lake_assets.worker_chores import ChoreEnv, WorkerChores
from kafka_iceberg.ops.chore_episodes import FAILING_PROPERTY, parse_failing
from kafka_iceberg.ops.rota import MaintenanceRota
from kafka_iceberg.resources.slack import LakeSlackResource
from tests.helpers import make_spec

PROPERTY = FAILING_PROPERTY.format(what="compact")


def _run(run_id: str, spec, env, outcomes: list[bool], errors: list[str]) -> WorkerChores:
    """A worker run's chores whose compaction fails or succeeds as ``outcomes`` says, one call each."""

    class Flaky(WorkerChores):
        def job(self, spec, kind, started_ms, *, concurrent=False, after, run_id):
            if not outcomes.pop(0):
                raise ConnectionError("warehouse unreachable")
            return SimpleNamespace(procedure=kind, files_before=3, files_after=1, seconds=0.1, as_metadata=dict)

    log = SimpleNamespace(error=errors.append, info=lambda _: None)
    context = SimpleNamespace(run_id=run_id, log=log, log_event=lambda _: None)
    return Flaky(context, [spec], MaintenanceRota({}), env)


def test_a_failing_chore_posts_once_per_episode_across_worker_runs(tmp_path, slack_alerts):
    catalog = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("test")
    catalog.create_table("test.chores", schema=pa.schema([pa.field("id", pa.int64())]))
    spec = make_spec("chores", "topic_chores")
    env = ChoreEnv(None, None, catalog, LakeSlackResource.from_env())
    outcomes, errors = [False, False, False, True, True, False], []

    first = _run("run-1", spec, env, outcomes, errors)
    first.maintain(spec, "compact")
    first.maintain(spec, "compact")
    assert len(slack_alerts.messages) == 1, "the second failure of the episode posted again"
    assert "warehouse unreachable" in str(slack_alerts.messages[0])
    assert parse_failing(catalog.load_table("test.chores").properties.get(PROPERTY))[1] == 2

    successor = _run("run-2", spec, env, outcomes, errors)  # takes the table over: the episode goes on
    successor.maintain(spec, "compact")
    assert len(slack_alerts.messages) == 1, "the successor posted the open episode again"
    successor.maintain(spec, "compact")  # the first success: the recovery, with every failure counted
    assert len(slack_alerts.messages) == 2
    assert "after 3 failure(s)" in str(slack_alerts.messages[1]) and "run-2" in str(slack_alerts.messages[1])
    assert PROPERTY not in catalog.load_table("test.chores").properties
    successor.maintain(spec, "compact")  # a success with no episode open posts nothing
    successor.maintain(spec, "compact")  # a new episode posts again
    assert len(slack_alerts.messages) == 3 and "warehouse unreachable" in str(slack_alerts.messages[2])
    assert len(errors) == 4, "every failure is logged"
