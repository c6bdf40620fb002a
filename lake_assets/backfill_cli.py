"""``lake backfill`` (:func:`backfill_command`): plan a table's catch-up and submit it as one
Dagster backfill of micro-batches (:mod:`kafka_iceberg.lake_assets.backfill`), to the instance of
``$DAGSTER_HOME`` through ``DagsterInstance.get()`` (:class:`InstanceBackfills`) or, with ``--url``,
through the webserver's GraphQL API (:mod:`kafka_iceberg.lake_assets.backfill_graphql`)."""

from __future__ import annotations

import json
import sys
import time

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from kafka_iceberg.batch.planning import offset_lag
from kafka_iceberg.catalog.tables import load_catalog, read_state
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata
from kafka_iceberg.lake_assets.backfill import (
    ACTIVE_BACKFILL_STATUSES,
    RING_SLOTS,
    backfill_url,
    next_slots,
    plan_catch_up,
    submit_backfill,
    table_in_progress,
)
from kafka_iceberg.lake_assets.backfill_graphql import DagsterGraphQL, GraphQLBackfills
from kafka_iceberg.lake_assets.dagster_internals import BACKFILL_ID_TAG, BulkActionStatus
from kafka_iceberg.lake_assets.vocabulary import TABLE_TAG


class InstanceBackfills:
    """Backfill operations on the Dagster instance (public ``DagsterInstance`` API; submitting a
    backfill goes through :mod:`kafka_iceberg.lake_assets.dagster_internals`, as the sensor daemon does).
    :class:`kafka_iceberg.lake_assets.backfill_graphql.GraphQLBackfills` has the same methods."""

    def __init__(self, instance: DagsterInstance):
        self.instance = instance

    def in_progress(self, spec: TableSpec) -> str | None:
        return table_in_progress(self.instance, spec)

    def next_slots(self, spec: TableSpec, count: int) -> list[str]:
        return next_slots(self.instance, spec, count)

    def submit(self, spec, slot_keys, tags, title, description) -> str:
        return submit_backfill(self.instance, spec, slot_keys, tags, title, description)

    def wait(self, backfill_id: str, runs: int, wait_s: float) -> tuple[int, str]:
        code = wait_for_backfill(self.instance, backfill_id, runs, wait_s)
        found = self.instance.get_backfill(backfill_id)
        return code, found.status.value if found else "UNKNOWN"


def backfill_target(settings, url: str | None):
    """Where ``lake backfill`` submits: the webserver at ``url`` (GraphQL), else the instance of
    ``DAGSTER_HOME`` (``DagsterInstance.get()``; without ``DAGSTER_HOME``, ``$LAKE_HOME/dagster``)."""
    if url:
        return GraphQLBackfills(DagsterGraphQL(url))
    settings.dagster_home.mkdir(parents=True, exist_ok=True)  # as make dev does for a new lake
    if settings.dagster_home_dir is not None:
        return InstanceBackfills(DagsterInstance.get())
    return InstanceBackfills(DagsterInstance.from_config(str(settings.dagster_home)))


def backfill_command(
    settings,
    spec: TableSpec,
    batches: int | None,
    force: bool,
    wait_s: float | None,
    kafka=None,
    url: str | None = None,
    as_json: bool = False,
) -> int:
    """``lake backfill``: submit a backfill of micro-batches for ``spec`` (:func:`backfill_target`).

    ``batches`` slots, or by default as many as the table's lag needs (:func:`plan_catch_up`,
    up to :data:`MAX_BACKFILL_BATCHES`). Returns 0 when submitted (and, with ``wait_s``, when it
    completed successfully within ``wait_s`` seconds; the backfill daemon must run) or when
    there is no lag; 1 when the waited-for backfill failed or is still running; 2 when refused
    (``batches`` outside 1..RING_SLOTS, or the table is being materialized and not ``force``).
    ``kafka``: the :class:`~kafka_iceberg.kafka.admin.KafkaMetadata` to read watermarks with.
    Prints the backfill id and its UI link (``DAGSTER_UI_URL`` or ``url``), one JSON line with
    ``as_json``. Raises ``BrokerUnavailableError``/``CatalogUnavailableError`` or a
    ``ConnectionError`` for an unreachable webserver (the CLI's exit 3).
    """
    state = read_state(load_catalog(settings.catalog), spec.identifier)
    kafka = kafka or KafkaMetadata(KafkaConfig.from_settings(settings))
    lag = offset_lag(kafka.watermarks(spec.topic), state.offsets)
    plan = plan_catch_up(spec, lag, has_state=bool(state.offsets))
    row = {"table": spec.identifier, "backfill_id": None, "lag": plan.total_lag}
    if batches is None and plan.max_partition_lag == 0:
        _say(as_json, row, f"{spec.identifier}: no lag; nothing to backfill (pass --batches N to add slots anyway)")
        return 0
    batches = plan.batches if batches is None else batches
    if not 1 <= batches <= RING_SLOTS:
        return _refuse(as_json, row, f"--batches must be between 1 and {RING_SLOTS}")
    target = backfill_target(settings, url)
    busy = target.in_progress(spec)
    if busy and not force:
        return _refuse(as_json, row, f"{spec.identifier}: {busy} is still in progress; not submitting (use --force)")
    keys = target.next_slots(spec, batches)
    reason = (
        f"command line: {batches} micro-batches; largest partition lag {plan.max_partition_lag} records, "
        f"bound {plan.bound} per partition"
    )
    tags = {TABLE_TAG: spec.identifier, "lake/trigger": reason, "lake/launched-by": "cli"}
    backfill_id = target.submit(spec, keys, tags, f"catch up {spec.identifier}: {batches} micro-batches", reason)
    link = backfill_url(url or settings.dagster_ui_url, backfill_id)
    row.update(backfill_id=backfill_id, batches=batches, slots=keys, url=link)
    code, status = (0, "REQUESTED") if wait_s is None else target.wait(backfill_id, batches, wait_s)
    row["status"] = status
    _say(
        as_json,
        row,
        f"backfill {backfill_id}: {spec.identifier}, {batches} micro-batch runs, slots {keys[0]} .. {keys[-1]}\n"
        f"    lag then {plan.total_lag} records (largest partition {plan.max_partition_lag}); {link}; {status}",
    )
    return code


def _say(as_json: bool, row: dict, text: str) -> None:
    print(json.dumps(row) if as_json else text)


def _refuse(as_json: bool, row: dict, why: str) -> int:
    print(f"lake: bad input: {why}", file=sys.stderr)
    if as_json:
        print(json.dumps({**row, "error": "bad input", "message": why, "exit_code": 2}))
    return 2


def wait_for_backfill(instance: DagsterInstance, backfill_id: str, runs: int, wait_s: float) -> int:
    """Poll the backfill every 2 s for up to ``wait_s`` seconds, with a progress bar of its ``runs``
    finished runs on a terminal (``rich``; nothing when stderr is not a TTY). Returns 0 when it
    completed successfully, 1 when it ended otherwise or is still running."""
    from rich.console import Console
    from rich.progress import Progress

    deadline = time.monotonic() + wait_s
    finished = [DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]
    with Progress(console=Console(stderr=True), disable=not sys.stderr.isatty(), transient=True) as progress:
        task = progress.add_task(f"backfill {backfill_id}", total=runs)
        while time.monotonic() < deadline:
            done = instance.get_runs_count(RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}, statuses=finished))
            progress.update(task, completed=done)
            backfill = instance.get_backfill(backfill_id)
            if backfill is not None and backfill.status not in ACTIVE_BACKFILL_STATUSES:
                return 0 if backfill.status == BulkActionStatus.COMPLETED_SUCCESS else 1
            time.sleep(2)
    print(
        f"backfill {backfill_id} still running after {wait_s:.0f} s (is the daemon running? make dev)", file=sys.stderr
    )
    return 1
