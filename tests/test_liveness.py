"""A run that dies never holds a table (lake_assets/liveness.py).

The first test (on a SQLite catalog, whose tables share one pool, and on a PostgreSQL catalog, one pool
per table) SIGKILLs a real ``dagster asset materialize`` (its whole process group: the CLI, its
Spark JVM and Python workers) while its run holds the table's pool slot, then materializes the same
table again without any daemon: the second run finds the first one's worker gone, marks that run
failed and frees its slot within 2 minutes, then completes. The second test checks the reaper on a real
instance with real processes: a dead worker, a reused pid, a live worker, a run that ended.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from devtools.demo.data import produce
from devtools.rehearsal.run import kill_group
from kafka_iceberg.config.settings import CHECKOUT
from kafka_iceberg.declaration.spec import parse_table_spec
from kafka_iceberg.lake_assets.liveness import (
    HOST_TAG,
    PID_TAG,
    RUN_TAG,
    START_TAG,
    reap_dead_runs,
    reap_untagged_runs,
    worker_tags,
)
from kafka_iceberg.lake_assets.vocabulary import MICRO_BATCHES, TABLE_TAG, table_pool
from tests.helpers import event_records, new_database, spec_dict

LOCATION = Path(__file__).with_name("backfill_location.py")


def _materialize(env: dict[str, str], select: str, slot: str, log: Path) -> subprocess.Popen:
    """``dagster asset materialize`` of one slot, in its own process group, output to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [
                str(Path(sys.executable).with_name("dagster")),
                "asset",
                "materialize",
                "-f",
                str(LOCATION),
                "-a",
                "defs",
                "--select",
                select,
                "--partition",
                slot,
            ],
            cwd=CHECKOUT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _instance(tmp_path: Path) -> tuple[Path, DagsterInstance]:
    home = tmp_path / "dagster"
    home.mkdir()
    shutil.copy(CHECKOUT / "dagster.yaml", home / "dagster.yaml")  # pools: default_limit 1
    return home, DagsterInstance.from_config(str(home))


@pytest.fixture(scope="module")
def postgres_uri(postgres_server):
    """A database of this module's own on the session's PostgreSQL server, for the catalog; its URI."""
    return new_database(postgres_server, "liveness")


@pytest.mark.parametrize("catalog_kind", ["sqlite", "postgresql"])
def test_a_sigkilled_materialization_does_not_block_the_next_one(
    catalog_kind, request, lake_env, kafka_config, unique, topic_factory, tmp_path
):
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(2000)))
    home, instance = _instance(tmp_path)
    instance.add_dynamic_partitions(MICRO_BATCHES.name, ["s1", "s2"])
    raw = spec_dict(unique, topic, max_records_per_partition=500)
    env = {**os.environ, **lake_env, "DAGSTER_HOME": str(home), "LAKE_TEST_TABLE_JSON": json.dumps(raw)}
    if catalog_kind == "postgresql":  # one pool per table (lake/table/<namespace>_<table>)
        env.update(LAKE_CATALOG_URI=request.getfixturevalue("postgres_uri"), LAKE_WAREHOUSE=f"file://{tmp_path / 'wh'}")
    pool = table_pool(parse_table_spec(raw), sqlite_catalog=catalog_kind == "sqlite")
    select = f"lake/test/{unique}"

    first = _materialize(env, select, "s1", tmp_path / "first.log")
    try:
        holder = _wait_for(
            lambda: instance.event_log_storage.get_concurrency_info(pool).claimed_slots,
            300,
            f"the first run to claim a slot of pool {pool}",
        )
    finally:
        kill_group(first)  # SIGKILL: the CLI, its Spark JVM and Python workers
    (run,) = instance.get_runs()
    assert holder[0].run_id == run.run_id
    assert run.status == DagsterRunStatus.STARTED  # what a kill leaves behind
    assert run.tags[HOST_TAG] and run.tags[PID_TAG] == str(first.pid)

    second = _materialize(env, select, "s2", tmp_path / "second.log")
    try:
        # the bound of issue 9: within 2 minutes the dead run is failed and the new run holds the pool
        _wait_for(
            lambda: (
                instance.get_run_by_id(run.run_id).status == DagsterRunStatus.FAILURE
                and [s.run_id for s in instance.event_log_storage.get_concurrency_info(pool).claimed_slots]
                not in ([], [run.run_id])
            ),
            120,
            "the dead run to be failed and the next run to get its slot",
        )
        second.wait(timeout=900)  # then the micro-batch itself (Spark; no speed asserted)
    finally:
        if second.poll() is None:
            kill_group(second)
    assert second.returncode == 0, (tmp_path / "second.log").read_text()[-3000:]
    assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.FAILURE
    (done,) = instance.get_runs(filters=RunsFilter(statuses=[DagsterRunStatus.SUCCESS]))
    assert done.run_id != run.run_id
    assert instance.event_log_storage.get_concurrency_info(pool).claimed_slots == []


def _run(instance: DagsterInstance, status: DagsterRunStatus, tags: dict[str, str]) -> str:
    run_id = str(uuid.uuid4())
    instance.add_run(DagsterRun(job_name="liveness_test", run_id=run_id, status=status, tags=tags))
    instance.event_log_storage.claim_concurrency_slot("liveness_pool", run_id, f"step_{run_id[:8]}")
    return run_id


def test_reaper_marks_dead_workers_failed_and_frees_ended_runs_slots(tmp_path):
    _, instance = _instance(tmp_path)
    instance.event_log_storage.set_concurrency_slots("liveness_pool", 10)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        dead_id = _run(instance, DagsterRunStatus.STARTED, {**worker_tags(live.pid), PID_TAG: str(dead.pid)})
        reused_id = _run(instance, DagsterRunStatus.STARTED, {**worker_tags(live.pid), START_TAG: "1"})
        live_id = _run(instance, DagsterRunStatus.STARTED, worker_tags(live.pid))
        ended_id = _run(instance, DagsterRunStatus.SUCCESS, worker_tags(live.pid))
        untagged_id = _run(instance, DagsterRunStatus.STARTED, {})

        reaped = reap_dead_runs(instance, exclude_run_id=None)

        assert sorted(reaped) == sorted([dead_id, reused_id, ended_id])
        status = {r: instance.get_run_by_id(r).status for r in (dead_id, reused_id, live_id, ended_id, untagged_id)}
        assert status == {
            dead_id: DagsterRunStatus.FAILURE,
            reused_id: DagsterRunStatus.FAILURE,
            live_id: DagsterRunStatus.STARTED,
            ended_id: DagsterRunStatus.SUCCESS,
            untagged_id: DagsterRunStatus.STARTED,
        }
        holders = {s.run_id for s in instance.event_log_storage.get_concurrency_info("liveness_pool").claimed_slots}
        assert holders == {live_id, untagged_id}
        assert reap_dead_runs(instance) == []  # nothing left to do
    finally:
        live.kill()
        live.wait()


def test_untagged_runs_of_this_code_location_count_as_dead_after_the_grace(tmp_path):
    """A worker killed before its executor tagged the run leaves it NOT_STARTED or STARTED with no
    slot; the lag sensor would take its table for busy for ever. After the grace it is marked failed;
    runs of other code locations and tagged runs are left alone."""
    _, instance = _instance(tmp_path)
    instance.event_log_storage.set_concurrency_slots("liveness_pool", 10)
    table_run = _run(instance, DagsterRunStatus.STARTED, {TABLE_TAG: "demo.flights"})
    selected = str(uuid.uuid4())
    instance.add_run(
        DagsterRun(
            job_name="__ASSET_JOB",
            run_id=selected,
            status=DagsterRunStatus.NOT_STARTED,
            asset_selection=frozenset({AssetKey(["lake", "demo", "flights"])}),
        )
    )
    foreign = str(uuid.uuid4())
    instance.add_run(
        DagsterRun(
            job_name="other_team_job",
            run_id=foreign,
            status=DagsterRunStatus.STARTED,
            asset_selection=frozenset({AssetKey(["warehouse", "orders"])}),
        )
    )
    starting = _run(instance, DagsterRunStatus.STARTING, {TABLE_TAG: "demo.flights"})  # run monitoring's
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        tagged = _run(instance, DagsterRunStatus.STARTED, {TABLE_TAG: "demo.flights", **worker_tags(live.pid)})
        assert reap_untagged_runs(instance, grace_s=3600) == []  # within the grace: still starting
        time.sleep(0.05)
        assert sorted(reap_untagged_runs(instance, exclude_run_id=None, grace_s=0)) == sorted([table_run, selected])
        status = {r: instance.get_run_by_id(r).status for r in (table_run, selected, foreign, starting, tagged)}
        assert status == {
            table_run: DagsterRunStatus.FAILURE,
            selected: DagsterRunStatus.FAILURE,
            foreign: DagsterRunStatus.STARTED,
            starting: DagsterRunStatus.STARTING,
            tagged: DagsterRunStatus.STARTED,
        }
        holders = {s.run_id for s in instance.event_log_storage.get_concurrency_info("liveness_pool").claimed_slots}
        assert table_run not in holders and {starting, tagged} <= holders
    finally:
        live.kill()
        live.wait()


def test_a_retry_with_its_dead_parents_tags_is_not_taken_for_its_parent(tmp_path):
    """Dagster's run retries copy the parent run's tags: a retry of a killed run starts with the dead worker's
    liveness tags. Until its own worker tags it, the retry counts as untagged (reaped only after the grace),
    never as a run whose worker died; once tagged for itself it is judged by its own worker."""
    _, instance = _instance(tmp_path)
    instance.event_log_storage.set_concurrency_slots("liveness_pool", 10)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        parent = str(uuid.uuid4())
        inherited = {TABLE_TAG: "demo.flights", **worker_tags(live.pid, run_id=parent), PID_TAG: str(dead.pid)}
        retry = _run(instance, DagsterRunStatus.STARTED, inherited)
        assert inherited[RUN_TAG] == parent != retry
        assert reap_dead_runs(instance) == [], "the dead pid is its parent's worker, not its own"
        assert instance.get_run_by_id(retry).status == DagsterRunStatus.STARTED

        instance.add_run_tags(retry, worker_tags(live.pid, run_id=retry))  # its own worker starts
        time.sleep(0.05)
        assert reap_untagged_runs(instance, grace_s=0) == [] and reap_dead_runs(instance) == []
        instance.add_run_tags(retry, {PID_TAG: str(dead.pid)})  # ... and dies
        assert reap_dead_runs(instance) == [retry]

        orphan = _run(instance, DagsterRunStatus.STARTED, inherited)  # a retry whose worker never tagged it
        time.sleep(0.05)
        assert reap_untagged_runs(instance, grace_s=0) == [orphan]
    finally:
        live.kill()
        live.wait()
