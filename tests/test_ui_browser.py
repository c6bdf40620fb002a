"""The Dagster UI in a real browser: `dagster dev` on a temporary $LAKE_HOME, driven by headless
Chromium (Debian's) through Playwright. Screenshots go to docs/screenshots/ (shown in the README).

It checks what a user sees: the lineage from Kafka topics to tables to the downstream asset,
a table's checks with their results, the lag sensor's ticks, and a materialization launched
from the UI that succeeds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kafka_iceberg.demo_data import FLIGHTS, WEATHER, create_topic, load_frame, produce, to_records
from kafka_iceberg.settings import CHECKOUT
from tests.conftest import _free_port

CHROMIUM = "/usr/bin/chromium"
SHOTS = CHECKOUT / "docs" / "screenshots"
pytestmark = pytest.mark.browser


def _graphql(url: str, query: str) -> dict:
    req = urllib.request.Request(f"{url}/graphql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["data"]


@pytest.fixture()
def dagster_ui(tmp_path, broker, kafka_config):
    """`dagster dev` in its own process group, on a free port, with a fresh $LAKE_HOME whose
    topics hold the first 300 rows of each demo data set. Stopped by process group."""
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian chromium is not installed: run scripts/install-system-deps.sh (make test does)")
    for demo in (FLIGHTS, WEATHER):
        if create_topic(kafka_config, demo.topic, demo.partitions, {"retention.ms": "-1"}):
            produce(kafka_config, demo.topic, to_records(demo.dataset, load_frame(demo.dataset).head(300)))
    lake_home = tmp_path / "lake"
    dagster_home = lake_home / "dagster"
    dagster_home.mkdir(parents=True)
    shutil.copy(CHECKOUT / "dagster.yaml", dagster_home / "dagster.yaml")
    port = _free_port()
    env = {**os.environ, "LAKE_HOME": str(lake_home), "DAGSTER_HOME": str(dagster_home),
           "KAFKA_BOOTSTRAP_SERVERS": broker, "SPARK_MASTER": "local[1]", "LAKE_SPARK_DRIVER_MEMORY": "1g",
           "DAGSTER_UI_URL": f"http://127.0.0.1:{port}"}
    log = open(tmp_path / "dagster-dev.log", "w")
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("dagster")), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=CHECKOUT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                nodes = _graphql(url, "{ assetNodes { assetKey { path } } }")["assetNodes"]
                if nodes:
                    break
            except Exception:
                pass
            assert proc.poll() is None, (tmp_path / "dagster-dev.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "dagster dev did not serve the code location in 180 s"
            time.sleep(1)
        yield url
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=20)
                time.sleep(1)
                os.killpg(proc.pid, 0)  # anything left in the group?
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        log.close()


def _wait_for_run(url: str, run_id: str, timeout_s: float = 300) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = _graphql(url, f'{{ runOrError(runId: "{run_id}") {{ ... on Run {{ status }} }} }}')["runOrError"]["status"]
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            return status
        time.sleep(2)
    raise AssertionError(f"run {run_id} did not finish in {timeout_s} s")


def test_ui_shows_lineage_checks_sensor_ticks_and_a_launched_materialization(dagster_ui):
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    url = dagster_ui
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"],
        )
        page = browser.new_page(viewport={"width": 1500, "height": 950})
        page.set_default_timeout(60_000)

        # 1. launch a materialization of the weather table from its asset page
        page.goto(f"{url}/assets/lake/nyc/weather")
        skip = page.get_by_role("button", name="Skip", exact=True)  # the first-visit newsletter dialog
        try:
            skip.click(timeout=8_000)
        except Exception:
            pass
        page.locator("button", has_text="Materialize").first.click()
        launched = page.get_by_text("Launched run", exact=False)
        expect(launched.first).to_be_visible()
        runs = _graphql(url, "{ runsOrError(limit: 10) { ... on Runs { results { runId tags { key value } } } } }")
        launched_from_ui = [r["runId"] for r in runs["runsOrError"]["results"]
                            if not any(t["key"] == "dagster/sensor_name" for t in r["tags"])]
        assert launched_from_ui, "the click launched a run (sensor-requested runs are told apart by their tag)"
        run_id = launched_from_ui[0]
        assert _wait_for_run(url, run_id) == "SUCCESS"
        page.goto(f"{url}/runs/{run_id}")
        expect(page.get_by_text("Success", exact=False).first).to_be_visible()
        expect(page.get_by_text("RUN_SUCCESS", exact=False).first).to_be_visible()  # the event log has loaded
        page.screenshot(path=str(SHOTS / "run-success.png"))

        # 2. lineage: topic -> table -> downstream asset
        page.goto(f"{url}/assets/lake/nyc/weather?view=lineage&lineageScope=neighbors&lineageDepth=2")
        expect(page.get_by_text("nycflights13_weather", exact=False).first).to_be_visible()
        expect(page.get_by_text("hourly_departure_delay", exact=False).first).to_be_visible()
        expect(page.get_by_text("Loading", exact=False)).to_have_count(0, timeout=30_000)
        page.screenshot(path=str(SHOTS / "lineage.png"))

        # 3. the table's checks and their results
        page.goto(f"{url}/assets/lake/nyc/weather?view=checks")
        expect(page.get_by_text("duplicate_free", exact=False).first).to_be_visible()
        expect(page.get_by_text("freshness", exact=False).first).to_be_visible()
        expect(page.get_by_text("Passed", exact=False).first).to_be_visible()
        page.screenshot(path=str(SHOTS / "checks.png"))

        # 4. the lag sensor and its ticks (the daemon evaluates it on start)
        page.goto(f"{url}/locations/lake_assets.definitions/sensors/weather_lag")
        expect(page.get_by_text("weather_lag", exact=False).first).to_be_visible()
        deadline = time.monotonic() + 120
        while True:
            ticks = _graphql(url, '{ sensorOrError(sensorSelector: {repositoryLocationName: "lake_assets.definitions", '
                                  'repositoryName: "__repository__", sensorName: "weather_lag"}) '
                                  '{ ... on Sensor { sensorState { ticks(limit: 5) { status } } } } }')
            statuses = [t["status"] for t in ticks["sensorOrError"]["sensorState"]["ticks"]]
            if any(s in ("SUCCESS", "SKIPPED") for s in statuses):
                break
            assert time.monotonic() < deadline, f"no completed sensor tick in 120 s: {statuses}"
            time.sleep(3)
        page.reload()
        expect(page.get_by_text("weather_lag", exact=False).first).to_be_visible()
        page.wait_for_timeout(2000)
        page.screenshot(path=str(SHOTS / "lag-sensor.png"))
        browser.close()
    for name in ("run-success", "lineage", "checks", "lag-sensor"):
        assert (SHOTS / f"{name}.png").stat().st_size > 10_000
