"""The Dagster UI in a real browser: `dagster dev` on a temporary $LAKE_HOME, driven by headless
Chromium (Debian's) through Playwright. Screenshots go to a temporary directory, or with ``make screenshots``
(``UI_SCREENSHOTS_DIR``) to docs/screenshots/, shown in the README and the docs: a test run leaves the checkout as it was.

It checks what a user sees: the lineage from Kafka topics to tables to the downstream asset,
a table's checks with their results, the ``lake_workers`` sensor's ticks and the worker run it launched
on its own, and a backfill of two new micro-batch slots launched from the asset's Materialize dialog,
under Runs -> Backfills; a table's freshness policy badge, its
column schema with column docs, the Component's ``defs.yaml`` as the table's code reference, the
downstream asset's source snapshots, and the resources without their secrets (the test sets a Kafka
SASL password and a Slack bot token it then looks for in the Resources pages).

The tables are declared by a ``KafkaIcebergTables`` Component instance in a defs folder of the
test's own (``LAKE_DEFS_MODULE``), a copy of the demo's flights and weather with the weather table's
``max_records_per_partition: 150``, so its 300 records are a backlog of two micro-batches that the
worker run the ``lake_workers`` sensor launches at its first tick commits. The demo's downstream asset is never
launched by the test: it refreshes itself (its AutomationCondition) and shows the snapshots it read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from devtools.demo.data import FLIGHTS, WEATHER, create_topic, load_frame, produce, to_records
from devtools.services import devbroker
from kafka_iceberg.config.settings import CHECKOUT

CHROMIUM = "/usr/bin/chromium"
WEATHER_BOUND = 150
"""Records per partition per micro-batch of the weather table in this test (300 records: two)."""
SHOTS = Path(os.environ.get("UI_SCREENSHOTS_DIR") or Path(tempfile.gettempdir()) / f"lake-ui-shots-{os.getpid()}")
"""Where the screenshots go: ``$UI_SCREENSHOTS_DIR`` (``make screenshots``: docs/screenshots), else a directory of
this test process."""
COMPONENT = "kafka_iceberg.lake_assets.component.KafkaIcebergTables"
LOCATION = "kafka_iceberg.lake_assets.definitions"  # workspace.yaml's module, the code location's name
SASL_PASSWORD = "sasl-pw-Zq81vX"
"""A recognisable secret in ``KAFKA_CLIENT_CONFIG`` (``sasl.password``): the UI must never show it."""
SLACK_TOKEN = "xoxb-ui-test-7Hk2Lp"
"""A recognisable ``SLACK_BOT_TOKEN``: the UI must never show it."""
pytestmark = pytest.mark.browser


def _graphql(url: str, query: str) -> dict:
    req = urllib.request.Request(
        f"{url}/graphql", data=json.dumps({"query": query}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["data"]


@pytest.fixture()
def dagster_ui(tmp_path, broker, kafka_config, slack):
    """`dagster dev` in its own process group, on a free port, with a fresh $LAKE_HOME whose
    topics hold the first 300 rows of each demo data set, and two secrets in its environment:
    a SASL password in ``KAFKA_CLIENT_CONFIG`` (the dev broker has no SASL: librdkafka ignores it)
    and a Slack bot token (alerts go to the recording server). Stopped by process group."""
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian chromium is not installed: run scripts/install-system-deps.sh (make test does)")
    for demo in (FLIGHTS, WEATHER):
        if create_topic(kafka_config, demo.topic, demo.partitions, {"retention.ms": "-1"}):
            produce(kafka_config, demo.topic, to_records(demo.dataset, load_frame(demo.dataset).head(300)))
    lake_home = tmp_path / "lake"
    dagster_home = lake_home / "dagster"
    dagster_home.mkdir(parents=True)
    shutil.copy(CHECKOUT / "dagster.yaml", dagster_home / "dagster.yaml")
    # no first-visit newsletter dialog: opening late on a loaded machine, it covered the Materialize
    # click once, and its Skip handler could not bring back the launch dialog (fresh-clone run, 2026-11-25)
    with (dagster_home / "dagster.yaml").open("a") as f:
        f.write("\nnux:\n  enabled: false\n")
    declared = yaml.safe_load((CHECKOUT / "kafka_iceberg" / "defs" / "nyc" / "defs.yaml").read_text())["attributes"]
    # the two JSON-fed tables the downstream asset joins (the demo's Avro, nested and CDC tables need
    # a registry and PostgreSQL, which this test does not start); weather is produced as JSON here
    declared["tables"] = [t for t in declared["tables"] if t["name"] in ("flights", "weather")]
    for table in declared["tables"]:
        if table["name"] == "weather":
            table["max_records_per_partition"] = WEATHER_BOUND
            table["format"] = {"type": "json"}
    # a team's own defs folder (LAKE_DEFS_MODULE) with one KafkaIcebergTables instance: Component-defined tables
    defs_folder = tmp_path / "uiproject" / "ui_defs" / "nyc"
    defs_folder.mkdir(parents=True)
    (defs_folder / "defs.yaml").write_text(yaml.safe_dump({"type": COMPONENT, "attributes": declared}, sort_keys=False))
    port = devbroker.free_port()
    env = {
        **os.environ,
        "LAKE_HOME": str(lake_home),
        "DAGSTER_HOME": str(dagster_home),
        "LAKE_DEFS_MODULE": "ui_defs",
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "uiproject"), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "KAFKA_BOOTSTRAP_SERVERS": broker,
        "SPARK_MASTER": "local[1]",
        "LAKE_SPARK_CONF": json.dumps({"spark.driver.memory": "1g"}),
        "DAGSTER_UI_URL": f"http://127.0.0.1:{port}",
        "KAFKA_CLIENT_CONFIG": json.dumps({"sasl.password": SASL_PASSWORD}),
        "SLACK_BOT_TOKEN": SLACK_TOKEN,
        "SLACK_API_BASE_URL": slack.base_url,
    }
    log = open(tmp_path / "dagster-dev.log", "w")
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("dagster")),
            "dev",
            "-w",
            "workspace.yaml",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        cwd=CHECKOUT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
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


BACKFILLS = (
    "{ partitionBackfillsOrError(limit: 20) { ... on PartitionBackfills { results "
    "{ id status numPartitions partitionNames tags { key value } } } } }"
)


def _backfills(url: str) -> list[dict]:
    """Every backfill of the instance, newest first, with its tags as a dict."""
    results = _graphql(url, BACKFILLS)["partitionBackfillsOrError"]["results"]
    return [{**b, "tags": {t["key"]: t["value"] for t in b["tags"]}} for b in results]


def _runs_of_backfill(url: str, backfill_id: str) -> list[dict]:
    """The runs launched by one backfill (``runId`` and ``status``)."""
    query = (
        '{ runsOrError(filter: {tags: [{key: "dagster/backfill", value: "%s"}]}) '
        "{ ... on Runs { results { runId status } } } }" % backfill_id
    )
    return _graphql(url, query)["runsOrError"]["results"]


def _runs(url: str) -> list[dict]:
    """The instance's runs (``runId``, ``status`` and ``jobName``), newest first."""
    query = "{ runsOrError { ... on Runs { results { runId status jobName } } } }"
    return _graphql(url, query)["runsOrError"]["results"]


def _check_executions(url: str, check: str) -> list[dict]:
    """Every execution of the weather table's asset check ``check``, newest first."""
    query = (
        '{ assetCheckExecutions(assetKey: {path: ["lake", "nyc", "weather"]}, checkName: "%s", limit: 50) '
        "{ runId status evaluation { success } } }" % check
    )
    return _graphql(url, query)["assetCheckExecutions"]


def _wait_for_backfill(url: str, backfill_id: str, timeout_s: float = 1200) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        (backfill,) = [b for b in _backfills(url) if b["id"] == backfill_id]
        if backfill["status"] not in ("REQUESTED", "CANCELING", "FAILING"):
            return backfill
        time.sleep(3)
    raise AssertionError(f"backfill {backfill_id} did not finish in {timeout_s} s")


@pytest.mark.timeout(1800)  # two backfills of Spark runs and ten pages: longer than 900 s at load average 30
def test_ui_shows_lineage_checks_sensor_ticks_and_backfills(dagster_ui):
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    url = dagster_ui
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        page = browser.new_page(viewport={"width": 1500, "height": 950})
        page.set_default_timeout(60_000)
        expect.set_options(timeout=60_000)  # a loaded machine (2 cores, Spark runs) renders slowly

        # 1. launch a backfill of two new micro-batch slots of the weather table from its Materialize dialog
        # the first-visit newsletter dialog may open at any moment (late on a loaded machine): skip it then
        page.add_locator_handler(page.get_by_role("button", name="Skip", exact=True), lambda skip: skip.click())
        page.goto(f"{url}/assets/lake/nyc/weather")
        materialize = page.locator("button", has_text="Materialize").first
        expect(materialize.get_by_role("progressbar")).to_have_count(0)  # the button loads the partitions first
        materialize.click()
        dialog = page.locator("[role=dialog]", has_text="Launch runs to materialize").first
        expect(dialog.get_by_text("maximum of 1 partitions per run", exact=False)).to_be_visible()
        for n, slot in enumerate(("ui-slot-1", "ui-slot-2"), start=1):
            dialog.get_by_text("Add a partition", exact=True).click()
            add = page.locator("[role=dialog]", has_text="Add a partition for micro_batches")
            add.locator("input[type=text]").fill(slot)
            add.get_by_role("button", name="Save").click()
            expect(add).to_have_count(0)
            # the dialog refetches the partitions after an add; adding the next one before that refetch
            # lands lost it once (the selection came back with ui-slot-1 only), so let each add settle
            expect(dialog.get_by_text(f"{n} partition{'s' if n > 1 else ''}", exact=True)).to_be_visible()
            page.wait_for_timeout(2000)
        expect(dialog.get_by_text("2 partitions", exact=True)).to_be_visible()
        dialog.get_by_role("button", name="Launch backfill").click()
        expect(page.get_by_text("Created backfill", exact=False).first).to_be_visible()
        (from_ui,) = [b for b in _backfills(url) if b["tags"].get("dagster/from_ui") == "true"]
        assert sorted(from_ui["partitionNames"]) == ["ui-slot-1", "ui-slot-2"]

        # 2. the lake_workers sensor launched a worker run on its own, which committed the weather backlog
        deadline = time.monotonic() + 600
        while not [r for r in _runs(url) if r["jobName"] == "lake_worker_0"]:
            assert time.monotonic() < deadline, "the lake_workers sensor launched no worker run in 600 s"
            time.sleep(3)
        while len(_materializations(url, ["lake", "nyc", "weather"])) < 1:
            assert time.monotonic() < deadline, "no worker commit of the weather table in 600 s"
            time.sleep(3)
        assert _wait_for_backfill(url, from_ui["id"])["status"] == "COMPLETED_SUCCESS"
        page.goto(f"{url}/runs/b/{from_ui['id']}")
        expect(page.get_by_text("100% completed", exact=False).first).to_be_visible()
        page.screenshot(path=str(SHOTS / "backfill.png"))

        # 3. Runs -> Backfills lists the UI's
        page.goto(f"{url}/runs?view=backfills")
        expect(page.get_by_text(from_ui["id"], exact=True).first).to_be_visible()
        page.wait_for_timeout(1000)
        page.screenshot(path=str(SHOTS / "backfills.png"))

        # 4. one of the UI backfill's runs: one micro-batch slot, succeeded
        runs = _runs_of_backfill(url, from_ui["id"])
        assert len(runs) == 2 and all(r["status"] == "SUCCESS" for r in runs)
        page.goto(f"{url}/runs/{runs[0]['runId']}")
        expect(page.get_by_text("Success", exact=False).first).to_be_visible()
        expect(page.get_by_text("RUN_SUCCESS", exact=False).first).to_be_visible()  # the event log has loaded
        page.screenshot(path=str(SHOTS / "run-success.png"))

        # 5. lineage: topic -> table -> downstream asset
        page.goto(f"{url}/assets/lake/nyc/weather?view=lineage&lineageScope=neighbors&lineageDepth=2")
        expect(page.get_by_text("nycflights13_weather", exact=False).first).to_be_visible()
        expect(page.get_by_text("hourly_departure_delay", exact=False).first).to_be_visible()
        expect(page.get_by_text("Loading", exact=False)).to_have_count(0, timeout=30_000)
        page.screenshot(path=str(SHOTS / "lineage.png"))

        # 6. the table's checks: each of the backfill's runs evaluated all three, then the Checks tab, where
        # "Execute all" runs them on their own against the newest snapshot and shows them Passed.
        # (The tab shows the execution of the run *created* last; its runs wait for the table's pool
        # in no fixed order, so when another run committed last that execution does not target the
        # newest materialization and the tab reads "Not evaluated" until the checks run again: the
        # CI run of 2026-11-25. docs/operations.md, "Asset checks".)
        all_runs = {r["runId"] for r in _runs_of_backfill(url, from_ui["id"])}
        for check in ("duplicate_free", "freshness", "quarantine"):
            executions = [e for e in _check_executions(url, check) if e["runId"] in all_runs]
            assert sorted(e["runId"] for e in executions) == sorted(all_runs), (check, executions)
            assert all(e["status"] in ("SUCCEEDED", "FAILED") and e["evaluation"] for e in executions), (
                check,
                executions,
            )
            if check == "duplicate_free":  # severity ERROR: never failed
                assert {e["status"] for e in executions} == {"SUCCEEDED"}, executions
        page.goto(f"{url}/assets/lake/nyc/weather?view=checks")
        expect(page.get_by_text("duplicate_free", exact=False).first).to_be_visible()
        expect(page.get_by_text("freshness", exact=False).first).to_be_visible()
        before = {r["runId"] for r in _runs(url)}
        page.get_by_role("button", name="Execute all").click()
        deadline = time.monotonic() + 600  # one Spark run on a loaded machine
        # besides the checks run, the demo's downstream asset may refresh itself (lake_downstream_automation)
        done = ("SUCCESS", "FAILURE", "CANCELED")
        # (a worker run the lake_workers sensor launches meanwhile serves on: not one of them)
        fresh = lambda: [r for r in _runs(url) if r["runId"] not in before and r["jobName"] != "lake_worker_0"]  # noqa: E731
        while not (checks_run := fresh()) or any(r["status"] not in done for r in checks_run):
            assert time.monotonic() < deadline, f"the checks run did not finish in 600 s: {checks_run}"
            time.sleep(3)
        assert 1 <= len(checks_run) <= 2 and all(r["status"] == "SUCCESS" for r in checks_run), checks_run
        page.reload()
        expect(page.get_by_text("Passed", exact=True).first).to_be_visible()
        expect(page.get_by_text("Not evaluated", exact=True)).to_have_count(0)
        page.screenshot(path=str(SHOTS / "checks.png"))

        # 7. the lake_workers sensor and its ticks (the first requested the worker run)
        page.goto(f"{url}/locations/{LOCATION}/sensors/lake_workers")
        expect(page.get_by_text("lake_workers", exact=False).first).to_be_visible()
        ticks = _graphql(
            url,
            '{ sensorOrError(sensorSelector: {repositoryLocationName: "%s", '
            'repositoryName: "__repository__", sensorName: "lake_workers"}) '
            "{ ... on Sensor { sensorState { ticks(limit: 1000) { status } } } } }" % LOCATION,
        )
        statuses = [t["status"] for t in ticks["sensorOrError"]["sensorState"]["ticks"]]
        assert "SUCCESS" in statuses, statuses
        page.reload()
        expect(page.get_by_text("lake_workers", exact=False).first).to_be_visible()
        page.wait_for_timeout(2000)
        page.screenshot(path=str(SHOTS / "lag-sensor.png"))

        _asset_health_and_schema(page, url)
        _resources_without_secrets(page, url)
        _downstream_refreshed_itself(page, url)
        browser.close()
    for name in SCREENSHOTS:
        assert (SHOTS / f"{name}.png").stat().st_size > 10_000
    if not os.environ.get("UI_SCREENSHOTS_DIR"):  # a failed run keeps them, to look at
        shutil.rmtree(SHOTS)


SCREENSHOTS = (
    "backfill",
    "backfills",
    "run-success",
    "lineage",
    "checks",
    "lag-sensor",
    "freshness",
    "column-schema",
    "resources",
    "resources-slack",
    "downstream",
)


def _asset_health_and_schema(page, url: str) -> None:
    """8. the weather table's FreshnessPolicy badge (Passing: it was just materialized) and its
    definition, declared in the Component instance's ``defs.yaml``; 9. its column schema (dagster/column_schema) with the declared and Kafka column docs."""
    from playwright.sync_api import expect

    page.goto(f"{url}/assets/lake/nyc/weather")
    # tables.yaml: freshness.max_snapshot_age 1d -> fail window 24 h, warn window 12 h
    policy = page.get_by_text("Fails if more than 24 hours since last materialization", exact=True)
    expect(policy).to_be_visible(timeout=60_000)
    expect(page.get_by_text("Warns if more than 12 hours since last materialization", exact=True)).to_be_visible()
    # the sidebar's policy section reads "Freshness policy / Passing / Last materialized ... ago"; the
    # daemon evaluates the policy after the materialization, so allow it a minute
    passing = re.compile(r"Freshness policy\s+Passing\s+Last materialized")
    for _ in range(12):
        page.wait_for_timeout(2000)
        if passing.search(page.inner_text("body")):
            break
        page.wait_for_timeout(3000)
        page.reload()
        expect(policy).to_be_visible(timeout=60_000)
    body = page.inner_text("body")
    assert passing.search(body), body[body.find("Freshness policy") :][:300]
    # a Component-defined table: its declaration's code reference is the instance's defs.yaml
    declaration = page.get_by_role("link", name=re.compile("declaration of weather"))
    expect(declaration).to_have_attribute("href", re.compile(r"ui_defs/nyc/defs\.yaml"))
    policy.scroll_into_view_if_needed()
    page.wait_for_timeout(1000)
    page.screenshot(path=str(SHOTS / "freshness.png"))

    temp_row = page.locator("tr", has=page.get_by_text("temp", exact=True)).first
    expect(temp_row).to_contain_text("Fahrenheit")  # the declared doc
    offset_row = page.locator("tr", has_text="_kafka_offset").first
    expect(offset_row).to_contain_text("Kafka offset of the record in its partition")
    expect(offset_row).to_contain_text("non-nullable")
    page.locator("tr", has_text="_kafka_headers").first.evaluate("e => e.scrollIntoView({block: 'end'})")
    page.wait_for_timeout(1000)
    page.screenshot(path=str(SHOTS / "column-schema.png"))


MATERIALIZATIONS = (
    "{ assetOrError(assetKey: {path: %s}) { ... on Asset { assetMaterializations(limit: 50) "
    "{ runId metadataEntries { label ... on JsonMetadataEntry { jsonString } ... on TextMetadataEntry { text } } } } } }"
)


def _materializations(url: str, key: list[str]) -> list[dict]:
    """The asset ``key``'s materializations, newest first: ``runId`` and ``metadata`` (label -> JSON or text)."""
    found = _graphql(url, MATERIALIZATIONS % json.dumps(key))["assetOrError"].get("assetMaterializations", [])
    return [
        {
            "runId": m["runId"],
            "metadata": {e["label"]: e.get("jsonString", e.get("text")) for e in m["metadataEntries"]},
        }
        for m in found
    ]


def _downstream_refreshed_itself(page, url: str) -> None:
    """11. the demo's downstream asset, never launched by the test: its AutomationCondition sensor
    materialized it after the tables committed, it read them through the ``lake_reader`` resource at
    snapshots their materializations recorded, and its page shows those snapshot ids."""
    from playwright.sync_api import expect

    downstream = ["lake", "analytics", "hourly_departure_delay"]
    deadline = time.monotonic() + 600  # the sensor evaluates every 30 s; one Spark run on a loaded machine
    while not (refreshes := _materializations(url, downstream)):
        assert time.monotonic() < deadline, "lake_downstream_automation did not refresh the downstream asset in 600 s"
        time.sleep(5)
    run = _graphql(url, '{ runOrError(runId: "%s") { ... on Run { tags { key value } } } }' % refreshes[0]["runId"])
    tags = {t["key"]: t["value"] for t in run["runOrError"]["tags"]}
    assert tags.get("dagster/sensor_name") == "lake_downstream_automation", tags
    assert tags.get("dagster/from_automation_condition") == "true", tags
    read = json.loads(refreshes[0]["metadata"]["lake/source_snapshots"])
    for table in ("flights", "weather"):
        recorded = {m["metadata"].get("snapshot_id") for m in _materializations(url, ["lake", "nyc", table])}
        assert read[f"nyc.{table}"] in recorded, (table, read, recorded)
    page.goto(f"{url}/assets/{'/'.join(downstream)}")
    expect(page.get_by_text("lake/source_snapshots", exact=True).first).to_be_visible()
    expect(page.get_by_text(read["nyc.weather"], exact=False).first).to_be_visible()
    page.wait_for_timeout(1000)
    page.screenshot(path=str(SHOTS / "downstream.png"))


def _resources_without_secrets(page, url: str) -> None:
    """10. Deployment -> the code location's resources: every resource page names the secret's
    environment variable (an ``EnvVar``) and shows neither secret, in its text or its HTML."""
    from playwright.sync_api import expect

    base = f"{url}/locations/{LOCATION}/resources"
    page.goto(base)
    for name in ("lake_kafka", "lake_catalog", "lake_pyspark", "lake_slack"):
        expect(page.get_by_text(name, exact=True).first).to_be_visible()
    pages = {
        "": None,
        "lake_kafka": ("client_config_json", "KAFKA_CLIENT_CONFIG"),
        "lake_slack": ("token", "SLACK_BOT_TOKEN"),
        "lake_catalog": None,
        "lake_pyspark": None,
    }
    for resource, env_field in pages.items():
        page.goto(f"{base}/{resource}" if resource else base)
        expect(page.get_by_text("Configuration" if resource else "Name", exact=True).first).to_be_visible()
        if env_field:
            field, variable = env_field
            row = page.locator("tr", has=page.get_by_text(field, exact=True)).first
            expect(row).to_contain_text(variable)
            expect(row).to_contain_text("Env var")
        page.wait_for_timeout(1000)
        for text in (page.inner_text("body"), page.content()):
            assert SASL_PASSWORD not in text and SLACK_TOKEN not in text, f"a secret is shown on {base}/{resource}"
        if resource == "lake_kafka":
            page.screenshot(path=str(SHOTS / "resources.png"))
        if resource == "lake_slack":
            page.screenshot(path=str(SHOTS / "resources-slack.png"))
