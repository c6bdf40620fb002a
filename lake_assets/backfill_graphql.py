"""``lake backfill --url``: the same backfill as :func:`kafka_iceberg.lake_assets.backfill_cli.backfill_command`
submitted through the Dagster webserver's GraphQL API, for operators without access to the
instance's storage (the webserver's ``/graphql`` endpoint, as the UI's *Launch backfill* uses).

Mutations ``addDynamicPartition`` (the micro-batch slots) and ``launchPartitionBackfill``;
queries ``assetNodeOrError`` (the table asset's code location and partition statuses),
``runsOrError`` and ``partitionBackfillsOrError`` (work in progress) and
``partitionBackfillOrError`` (``--wait``). HTTP through the standard library.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.backfill import choose_slots, ring_slot_keys
from kafka_iceberg.lake_assets.vocabulary import MICRO_BATCHES, TABLE_TAG, table_key

IN_PROGRESS_STATUSES = ["QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"]
ACTIVE_BACKFILL = ("REQUESTED", "CANCELING", "FAILING")


class WebserverUnavailableError(ConnectionError):
    """The Dagster webserver did not answer (exit 3 in the CLI)."""


class GraphQLError(RuntimeError):
    """The webserver answered with an error (a GraphQL error or an error result type)."""


class DagsterGraphQL:
    """A minimal client of the webserver at ``url`` (e.g. ``http://127.0.0.1:3000``)."""

    def __init__(self, url: str, timeout_s: float = 30.0):
        self.endpoint, self.timeout_s = url.rstrip("/") + "/graphql", timeout_s

    def query(self, text: str, variables: Mapping | None = None) -> dict:
        """The ``data`` of one GraphQL request.

        Raises:
            WebserverUnavailableError: no HTTP answer. GraphQLError: ``errors`` in the answer.
        """
        body = json.dumps({"query": text, "variables": dict(variables or {})}).encode()
        request = urllib.request.Request(self.endpoint, body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                payload = json.loads(answer.read())
        except urllib.error.HTTPError as e:
            raise GraphQLError(f"Dagster webserver {self.endpoint}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            raise WebserverUnavailableError(f"Dagster webserver {self.endpoint} is unreachable: {e}") from None
        if payload.get("errors"):
            raise GraphQLError(f"Dagster webserver {self.endpoint}: {payload['errors'][0].get('message')}")
        return payload["data"]


def _checked(result: dict, ok: str) -> dict:
    if result.get("__typename") != ok:
        raise GraphQLError(f"{result.get('__typename')}: {result.get('message', result)}")
    return result


_ASSET = """query($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) { __typename
  ... on AssetNode { repository { name location { name } }
    assetPartitionStatuses { __typename ... on DefaultPartitionStatuses { materializedPartitions failedPartitions } } }
  ... on AssetNotFoundError { message } } }"""
_RUNS = """query($filter: RunsFilter!) { runsOrError(filter: $filter, limit: 1) { __typename
  ... on Runs { results { runId } } ... on PythonError { message } } }"""
_BACKFILLS = """query { partitionBackfillsOrError(limit: 100) { __typename
  ... on PartitionBackfills { results { id status assetSelection { path } } } ... on PythonError { message } } }"""
_ADD = """mutation($repo: RepositorySelector!, $name: String!, $key: String!) {
  addDynamicPartition(repositorySelector: $repo, partitionsDefName: $name, partitionKey: $key) { __typename
  ... on PythonError { message } ... on UnauthorizedError { message } } }"""
_LAUNCH = """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) { __typename
  ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } ... on UnauthorizedError { message }
  ... on PartitionSetNotFoundError { message } ... on InvalidSubsetError { message } } }"""
_STATUS = """query($id: String!) { partitionBackfillOrError(backfillId: $id) { __typename
  ... on PartitionBackfill { status } ... on PythonError { message } } }"""


class GraphQLBackfills:
    """Backfill operations of :mod:`kafka_iceberg.lake_assets.backfill` through :class:`DagsterGraphQL`."""

    def __init__(self, client: DagsterGraphQL):
        self.client = client

    def _asset(self, spec: TableSpec) -> dict:
        found = self.client.query(_ASSET, {"key": {"path": list(table_key(spec).path)}})["assetNodeOrError"]
        return _checked(found, "AssetNode")

    def in_progress(self, spec: TableSpec) -> str | None:
        """``"run <id>"`` / ``"backfill <id>"`` already materializing the table, or ``None``."""
        tags = [{"key": TABLE_TAG, "value": spec.identifier}]
        runs = self.client.query(_RUNS, {"filter": {"tags": tags, "statuses": IN_PROGRESS_STATUSES}})["runsOrError"]
        for run in _checked(runs, "Runs")["results"]:
            return f"run {run['runId']}"
        path = list(table_key(spec).path)
        backfills = _checked(self.client.query(_BACKFILLS)["partitionBackfillsOrError"], "PartitionBackfills")
        for b in backfills["results"]:
            if b["status"] in ACTIVE_BACKFILL and any(a["path"] == path for a in b.get("assetSelection") or []):
                return f"backfill {b['id']}"
        return None

    def next_slots(self, spec: TableSpec, count: int) -> list[str]:
        """Ring slots for ``count`` micro-batches: failed slots, then never materialized, then the rest."""
        statuses = self._asset(spec).get("assetPartitionStatuses") or {}
        ring = ring_slot_keys()
        done = {k: ring.index(k) for k in statuses.get("materializedPartitions") or [] if k in ring}
        bad = {k: len(ring) + ring.index(k) for k in statuses.get("failedPartitions") or [] if k in ring}
        return choose_slots(done, bad, count)

    def submit(self, spec: TableSpec, slot_keys: Sequence[str], tags: Mapping[str, str], title: str, description: str):
        """Add the slots (an existing one is kept) and launch the backfill; returns its id."""
        repo = self._asset(spec)["repository"]
        selector = {"repositoryName": repo["name"], "repositoryLocationName": repo["location"]["name"]}
        for key in slot_keys:
            added = self.client.query(_ADD, {"repo": selector, "name": MICRO_BATCHES.name, "key": key})
            kind = added["addDynamicPartition"]["__typename"]
            if kind not in ("AddDynamicPartitionSuccess", "DuplicateDynamicPartitionError"):
                _checked(added["addDynamicPartition"], "AddDynamicPartitionSuccess")
        params = {
            "assetSelection": [{"path": list(table_key(spec).path)}],
            "partitionNames": list(slot_keys),
            "tags": [{"key": k, "value": v} for k, v in tags.items()],
            "title": title,
            "description": description,
        }
        launched = self.client.query(_LAUNCH, {"params": params})["launchPartitionBackfill"]
        return _checked(launched, "LaunchBackfillSuccess")["backfillId"]

    def status(self, backfill_id: str) -> str:
        """The backfill's status name (``REQUESTED``, ``COMPLETED_SUCCESS``, ``FAILED`` ...)."""
        found = self.client.query(_STATUS, {"id": backfill_id})["partitionBackfillOrError"]
        return _checked(found, "PartitionBackfill")["status"]

    def wait(self, backfill_id: str, runs: int, wait_s: float, poll_s: float = 2.0) -> tuple[int, str]:
        """Poll until the backfill (of ``runs`` runs) ends or ``wait_s`` seconds pass: (0 succeeded /
        1 otherwise, its status)."""
        deadline = time.monotonic() + wait_s
        status = self.status(backfill_id)
        while status in ACTIVE_BACKFILL and time.monotonic() < deadline:
            time.sleep(poll_s)
            status = self.status(backfill_id)
        return (0 if status in ("COMPLETED", "COMPLETED_SUCCESS") else 1), status
