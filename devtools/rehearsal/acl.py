"""Rehearsal scenario ``acl_revoked``: the sink's Kafka ACLs revoked while a micro-batch runs, then
granted again, on librdkafka's mock cluster (:mod:`devtools.services.mockcluster`).

The mock cluster has no principals, so a revoked ACL is its answers: every ListOffsets and Fetch
request is answered ``TOPIC_AUTHORIZATION_FAILED`` (29) and every OffsetCommit and OffsetFetch
``GROUP_AUTHORIZATION_FAILED`` (30), until the errors are cleared (the ACL is back). Metadata is
left alone: the mock cannot refuse it to the sink only, and the producers need it.

Two revocations:

* topic and group ACLs revoked as soon as the micro-batch has created its attempt branch (before
  its read): the micro-batch fails with one line (``NotAuthorizedError: ... topic ... not
  authorized (TOPIC_AUTHORIZATION_FAILED) ...``), the sink posts the failed-run alert (to a
  recording Slack API), and nothing is committed: the table's ``main`` and committed offsets are
  unchanged, the consumer group untouched;
* only the group ACL revoked: the micro-batch commits (the table is the source of truth), its
  result reports the group mirror refused (``group_commit_error`` names ``GROUP_AUTHORIZATION_FAILED``);
  once the ACL is back the next micro-batch mirrors the group again.

After the ACLs are back a last catch-up commits everything exactly once (reconciled with DuckDB).
Registered in :data:`devtools.rehearsal.run.SCENARIO_MODULES` (``make rehearse --only acl_revoked``).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from contextlib import closing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from confluent_kafka import KafkaError

from devtools.rehearsal.run import Lake, Rehearsal, ScenarioResult, Traffic, reconcile, table_declaration
from devtools.services.mockcluster import API_KEYS, MockCluster
from kafka_iceberg.catalog.tables import load_table, read_state
from kafka_iceberg.declaration.spec import parse_table_spec
from kafka_iceberg.kafka.admin import KafkaMetadata

TOPIC_REFUSED = {
    API_KEYS["ListOffsets"]: KafkaError.TOPIC_AUTHORIZATION_FAILED,
    API_KEYS["Fetch"]: KafkaError.TOPIC_AUTHORIZATION_FAILED,
}
GROUP_REFUSED = {
    API_KEYS["OffsetCommit"]: KafkaError.GROUP_AUTHORIZATION_FAILED,
    API_KEYS["OffsetFetch"]: KafkaError.GROUP_AUTHORIZATION_FAILED,
}
_MANY = 100_000  # errors pushed per API key: every request until cleared


class SlackRecorder:
    """A Slack Web API stand-in on a free 127.0.0.1 port: answers ``chat.postMessage`` with ``ok``
    and keeps the ``text`` of every message (``messages``). ``base_url`` is ``SLACK_API_BASE_URL``."""

    def __init__(self):
        self.messages: list[str] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                try:
                    recorder.messages.append(str(json.loads(raw).get("text", raw)))
                except ValueError:
                    recorder.messages.append(raw)
                data = json.dumps({"ok": True, "channel": "C1", "ts": "1.0"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/api/"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _catalog_row(db: str, identifier: str) -> str | None:
    """The metadata location of ``identifier`` in the SQLite catalog ``db`` (moves with every commit)."""
    namespace, name = identifier.rsplit(".", 1)
    with closing(sqlite3.connect(db, timeout=30)) as conn:
        row = conn.execute(
            "SELECT metadata_location FROM iceberg_tables WHERE table_namespace = ? AND table_name = ?",
            (namespace, name),
        ).fetchone()
    return row[0] if row else None


def _revoke(cluster: MockCluster, errors: dict[int, int]) -> None:
    for api_key, code in errors.items():
        cluster.push_request_errors(api_key, code, _MANY)


def _grant(cluster: MockCluster, errors: dict[int, int]) -> None:
    for api_key in errors:
        cluster.clear_request_errors(api_key)


def _revoke_when_branched(cluster: MockCluster, db: str, identifier: str, before: str | None, fired: list) -> None:
    """Revoke the topic and group ACLs as soon as the table's catalog row moves (the micro-batch
    created its attempt branch; its read comes next); polled every 10 ms for at most 300 s."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if _catalog_row(db, identifier) != before:
            _revoke(cluster, {**TOPIC_REFUSED, **GROUP_REFUSED})
            fired.append(time.monotonic())
            return
        time.sleep(0.01)


def _batches(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def acl_revoked(r: Rehearsal, rate: float = 60.0, partitions: int = 2) -> ScenarioResult:
    """See the module docstring. Faults: the two revocations."""
    t0 = time.monotonic()
    slack = SlackRecorder()
    try:
        with MockCluster(1) as cluster:
            lake = Lake(
                r.lake.home,
                r.lake.broker_dir,
                cluster.bootstrap_servers,
                extra_env={"SLACK_BOT_TOKEN": "xoxb-rehearsal", "SLACK_API_BASE_URL": slack.base_url},
            )
            mr = Rehearsal(lake, r.log)
            name = f"acl_{uuid.uuid4().hex[:6]}"
            decl = table_declaration(name, f"rehearsal.{name}", 100_000)
            topic, spec = decl["topic"], parse_table_spec(decl)
            cluster.create_topic(topic, partitions, 1)
            kafka = KafkaMetadata(lake.kafka_config)
            db = lake.settings.catalog.sqlalchemy_uri[len("sqlite:///") :]
            traffic = Traffic(lake.kafka_config, topic, rate, bad_every=41)
            traffic.start()
            time.sleep(2)
            first = lake.catch_up(decl)
            r.log(f"  first catch-up: rc {first.returncode} at {time.monotonic() - t0:.0f} s")
            before = read_state(mr.catalog, spec.identifier)
            main_before = load_table(mr.catalog, spec.identifier).metadata.current_snapshot_id
            group_before = kafka.group_offsets(spec.consumer_group, topic)
            time.sleep(3)  # a backlog to read

            # 1. topic and group ACLs revoked mid-run
            fired: list[float] = []
            revoker = threading.Thread(
                target=_revoke_when_branched,
                args=(cluster, db, spec.identifier, _catalog_row(db, spec.identifier), fired),
                daemon=True,
            )
            revoker.start()
            refused = lake.catch_up(decl, timeout_s=600)
            revoker.join(30)
            r.log(f"  ACLs revoked mid-run: rc {refused.returncode} at {time.monotonic() - t0:.0f} s")
            after = read_state(mr.catalog, spec.identifier)
            main_after = load_table(mr.catalog, spec.identifier).metadata.current_snapshot_id
            alerts_after_refusal = list(slack.messages)
            _grant(cluster, {**TOPIC_REFUSED, **GROUP_REFUSED})
            group_after = kafka.group_offsets(spec.consumer_group, topic)
            time.sleep(2)

            # 2. only the group ACL revoked: the table commits, the group mirror is refused
            _revoke(cluster, GROUP_REFUSED)
            group_only = lake.catch_up(decl, timeout_s=600)
            _grant(cluster, GROUP_REFUSED)
            r.log(f"  group ACL revoked: rc {group_only.returncode} at {time.monotonic() - t0:.0f} s")
            time.sleep(2)
            traffic.stop()

            err = refused.stderr.strip().splitlines()
            last = err[-1] if err else ""
            group_errors = [b["group_commit_error"] for b in _batches(group_only.stdout) if b.get("group_commit_error")]
            checks = {
                "first run caught up": first.returncode == 0,
                "producer delivered everything": not traffic.errors,
                "ACLs revoked mid-run (after the attempt branch)": bool(fired),
                "the run failed with one NotAuthorizedError line naming the topic": refused.returncode == 3
                and last.startswith("NotAuthorizedError:")
                and topic in last
                and "not authorized" in last,
                "an alert was posted for the failed run": any(
                    "NotAuthorizedError" in m and spec.identifier in m for m in alerts_after_refusal
                ),
                "nothing committed while refused (main, offsets, group unchanged)": main_after == main_before
                and after.offsets == before.offsets
                and group_after == group_before,
                "group ACL revoked: the table committed, the group mirror refused": group_only.returncode == 0
                and any("GROUP_AUTHORIZATION_FAILED" in e and "not authorized" in e for e in group_errors),
            }
            if not all(checks.values()):
                r.log(refused.stderr[-3000:] + "\n" + group_only.stderr[-2000:])
            mr._final_catch_up(decl, checks)
            final = read_state(mr.catalog, spec.identifier).offsets
            checks["the consumer group mirrors the table again"] = (
                kafka.group_offsets(spec.consumer_group, topic) == final
            )
            checks["no attempt branches left"] = mr._no_leftovers(spec)
            checks["no overlapping snapshot ranges"] = mr._no_overlaps(spec)
            tally = reconcile(mr.catalog, spec, traffic.expected())
    finally:
        slack.close()
    notes = (
        f"refused run: rc {refused.returncode}: {last[:200]}; {len(alerts_after_refusal)} alert(s) posted; "
        f"group-only revocation: rc {group_only.returncode}, group mirror error: "
        f"{group_errors[0][:160] if group_errors else 'none'}"
    )
    return ScenarioResult("ACL revoked mid-run (mock cluster)", 2, tally, checks, notes, time.monotonic() - t0)


def register(scenarios: dict) -> None:
    """Add this module's scenarios to the rehearsal's registry."""
    scenarios["acl_revoked"] = lambda r, args: acl_revoked(r)


__all__ = ["SlackRecorder", "acl_revoked", "register"]
