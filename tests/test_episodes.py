"""Failure episodes: one Slack message when a table's (or a job's) runs start failing, one when they recover.

The fold is plain Python (kafka_iceberg/ops/episodes.py); the sensor (sensors/alerts.py) is evaluated on
real runs executed in an ephemeral Dagster instance, posting to the recording Slack server of conftest.
"""

import pytest
from dagster import (
    AssetMaterialization,
    DagsterInstance,
    Failure,
    asset,
    build_sensor_context,
    job,
    materialize,
    op,
)

from kafka_iceberg.ops.episodes import (
    FAILED_TABLES_TAG,
    RELAUNCH_CAP_S,
    EpisodeBook,
    Outcome,
    advance,
    relaunch_backoff_s,
    relaunch_wait_s,
)
from kafka_iceberg.resources.slack import LakeSlackResource
from kafka_iceberg.sensors.alerts import run_failure_alert_sensor


def _fail(subject, position, run_id=None):
    return Outcome(subject, False, position, 1_000 * position, run_id or f"r{position}", ("lake", *subject.split(".")))


def _ok(subject, position, detail="run"):
    return Outcome(subject, True, position, 1_000 * position, f"r{position}", ("lake", *subject.split(".")), detail)


def test_an_episode_starts_once_counts_its_failures_and_ends_once():
    book, notices = advance(EpisodeBook(), [_fail("a.t", 3), _fail("a.t", 1), _fail("b.t", 2)])
    assert [(n.kind, n.episode.subject, n.outcome.position) for n in notices] == [
        ("started", "a.t", 1),
        ("started", "b.t", 2),
    ]
    assert book.open["a.t"].failures == 2 and book.open["a.t"].last_position == 3
    book, notices = advance(EpisodeBook.from_json(book.to_json()), [_fail("a.t", 4), _ok("b.t", 5)])
    assert [(n.kind, n.episode.subject, n.episode.failures) for n in notices] == [("recovered", "b.t", 1)]
    assert set(book.open) == {"a.t"} and book.open["a.t"].failures == 3
    # a success older than the latest failure does not end the episode; a later one does
    book, notices = advance(book, [_ok("a.t", 2)])
    assert notices == [] and book.open["a.t"].failures == 3
    book, notices = advance(book, [_ok("a.t", 6, "commit")])
    assert [(n.kind, n.episode.failures, n.episode.first_run_id, n.outcome.detail) for n in notices] == [
        ("recovered", 3, "r1", "commit")
    ]
    assert book.open == {}
    # a success without an open episode posts nothing; the next failure starts a new episode
    book, notices = advance(book, [_ok("a.t", 7), _fail("a.t", 8)])
    assert [(n.kind, n.episode.failures) for n in notices] == [("started", 1)]


def test_relaunch_backoff_doubles_from_30_s_up_to_the_cap():
    assert [relaunch_backoff_s(n) for n in range(0, 8)] == [0.0, 30.0, 60.0, 120.0, 240.0, 480.0, 900.0, 900.0]
    assert relaunch_backoff_s(10_000) == RELAUNCH_CAP_S
    assert relaunch_backoff_s(3, base_s=1, cap_s=3) == 3.0
    # newest first: two failures after a success, the last one ended 20 s ago -> 60 - 20 s left
    assert relaunch_wait_s([(False, 980.0), (False, 900.0), (True, 800.0)], now_s=1000.0) == 40.0
    assert relaunch_wait_s([(True, 990.0), (False, 900.0)], now_s=1000.0) == 0.0
    assert relaunch_wait_s([], now_s=1000.0) == 0.0
    assert relaunch_wait_s([(False, 100.0)], now_s=1000.0) == 0.0  # waited long enough
    assert relaunch_wait_s([(False, None)], now_s=1000.0) == 30.0


@pytest.fixture
def slack_env(slack, monkeypatch):
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
    monkeypatch.setenv("SLACK_API_BASE_URL", slack.base_url)
    monkeypatch.setenv("DAGSTER_UI_URL", "http://ui.test:3000")
    return slack


def _tick(instance, cursor):
    context = build_sensor_context(
        instance=instance, cursor=cursor, resources={"lake_slack": LakeSlackResource.from_env()}
    )
    return run_failure_alert_sensor(context).cursor


_broken = {"yes": True}


@asset(key=["lake", "t", "flaky"])
def flaky():
    if _broken["yes"]:
        raise ValueError("partition 0 offset 17 is not JSON")
    return 1


def test_a_hundred_failures_post_two_messages(slack_env):
    """100 consecutive failed runs of one table post one message; its next successful run posts the recovery."""
    _broken["yes"] = True
    cursor = None
    with DagsterInstance.ephemeral() as instance:
        for i in range(100):
            result = materialize([flaky], instance=instance, raise_on_error=False, tags={"lake/table": "t.flaky"})
            assert not result.success
            if i % 25 == 24:
                cursor = _tick(instance, cursor)
        assert len(slack_env.messages) == 1
        _broken["yes"] = False
        assert materialize([flaky], instance=instance).success
        cursor = _tick(instance, cursor)
        _tick(instance, cursor)  # nothing more to say

    texts = [m["text"] for m in slack_env.messages]
    assert len(texts) == 2, texts
    assert ":rotating_light: ERROR t.flaky (run failure)" in texts[0]
    assert "ValueError: partition 0 offset 17 is not JSON" in texts[0]
    assert "episode: first failed run of t.flaky" in texts[0]
    assert ":white_check_mark: OK t.flaky (run failure)" in texts[1]
    assert "run_status = RECOVERED after 100 failed run(s)" in texts[1]
    assert "http://ui.test:3000/assets/lake/t/flaky" in texts[1]


def test_a_table_recovers_with_a_commit_of_another_run(slack_env):
    """A worker run's commit (an AssetMaterialization logged by an op) ends the table's episode."""
    _broken["yes"] = True

    @op
    def commit_flaky(context):
        context.log_event(AssetMaterialization(asset_key=["lake", "t", "flaky"]))

    @job
    def lake_worker_9():
        commit_flaky()

    with DagsterInstance.ephemeral() as instance:
        for _ in range(3):
            materialize([flaky], instance=instance, raise_on_error=False)
        cursor = _tick(instance, None)
        assert lake_worker_9.execute_in_process(instance=instance).success
        _tick(instance, cursor)
    texts = [m["text"] for m in slack_env.messages]
    assert len(texts) == 2, texts
    assert "RECOVERED after 3 failed run(s)" in texts[1] and "recovered with a commit" in texts[1]


def test_a_failing_worker_job_posts_once_and_recovers_with_its_next_successful_run(slack_env):
    """A job with no asset step (a worker run) is its own subject: ``job lake_worker_0``."""
    state = {"fail": True}

    @op
    def serve():
        if state["fail"]:
            raise Failure(description="1 of 2 tables failed: {'t.flaky': 'bad records'}", allow_retries=False)

    @job
    def lake_worker_0():
        serve()

    with DagsterInstance.ephemeral() as instance:
        cursor = None
        for _ in range(4):
            assert not lake_worker_0.execute_in_process(instance=instance, raise_on_error=False).success
            cursor = _tick(instance, cursor)
        state["fail"] = False
        assert lake_worker_0.execute_in_process(instance=instance).success
        _tick(instance, cursor)
    texts = [m["text"] for m in slack_env.messages]
    assert len(texts) == 2, texts
    assert "ERROR job lake_worker_0" in texts[0] and "1 of 2 tables failed" in texts[0]
    assert "OK job lake_worker_0" in texts[1] and "RECOVERED after 4 failed run(s)" in texts[1]


def test_relaunch_hold_reads_the_consecutive_failed_runs_of_a_job_from_the_instance():
    import time

    from kafka_iceberg.sensors.backoff import relaunch_hold_s

    state = {"fail": True}

    @op
    def serve_or_fail():
        if state["fail"]:
            raise RuntimeError("broken")

    @job
    def lake_worker_7():
        serve_or_fail()

    with DagsterInstance.ephemeral() as instance:
        assert relaunch_hold_s(instance, time.time(), "lake_worker_7") == 0.0  # no run yet
        for _ in range(3):
            lake_worker_7.execute_in_process(instance=instance, raise_on_error=False)
        now = time.time()
        hold = relaunch_hold_s(instance, now, "lake_worker_7")
        assert 100.0 < hold <= 120.0  # 3 failures: 120 s after the last one ended (a moment ago)
        assert relaunch_hold_s(instance, now + 120.0, "lake_worker_7") == 0.0
        assert relaunch_hold_s(instance, now, "another_job") == 0.0
        state["fail"] = False
        lake_worker_7.execute_in_process(instance=instance)
        assert relaunch_hold_s(instance, time.time(), "lake_worker_7") == 0.0
        # a table's runs, by their tag (the per-table lag sensor)
        state["fail"] = True
        lake_worker_7.execute_in_process(instance=instance, raise_on_error=False, tags={"lake/table": "t.x"})
        assert 0.0 < relaunch_hold_s(instance, time.time(), tags={"lake/table": "t.x"}) <= 30.0
        assert relaunch_hold_s(instance, time.time(), tags={"lake/table": "t.y"}) == 0.0
        # a worker run that failed because a table failed served: no backoff for the worker
        lake_worker_7.execute_in_process(instance=instance, raise_on_error=False, tags={FAILED_TABLES_TAG: "t.x"})
        assert relaunch_hold_s(instance, time.time(), "lake_worker_7") == 0.0


def test_a_worker_run_s_failed_table_is_its_own_episode_and_recovers_with_its_next_commit(slack_env):
    """A worker run that set a table aside tags it (lake_assets/worker.py) and fails: the table's episode,
    not the worker's; a later worker run's commit of the table ends it."""
    state = {"fail": True}

    @op
    def serve_tables(context):
        if state["fail"]:
            context.instance.add_run_tags(context.run_id, {FAILED_TABLES_TAG: "t.flaky"})
            raise Failure(description="1 of 2 tables failed: {'t.flaky': 'bad records'}", allow_retries=False)
        context.log_event(AssetMaterialization(asset_key=["lake", "t", "flaky"]))

    @job
    def lake_worker_1():
        serve_tables()

    with DagsterInstance.ephemeral() as instance:
        cursor = None
        for _ in range(3):
            assert not lake_worker_1.execute_in_process(instance=instance, raise_on_error=False).success
            cursor = _tick(instance, cursor)
        state["fail"] = False
        assert lake_worker_1.execute_in_process(instance=instance).success
        _tick(instance, cursor)
    texts = [m["text"] for m in slack_env.messages]
    assert len(texts) == 2, texts
    assert ":rotating_light: ERROR t.flaky (run failure)" in texts[0] and "job: lake_worker_1" in texts[0]
    assert "http://ui.test:3000/assets/lake/t/flaky" in texts[0]
    assert "OK t.flaky" in texts[1] and "RECOVERED after 3 failed run(s)" in texts[1]
