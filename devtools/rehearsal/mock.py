"""Rehearsal scenarios on librdkafka's mock Kafka cluster (:mod:`devtools.services.mockcluster`): partition
leaders moved and brokers replaced while producers write and the sink runs micro-batches.

noida-db, the rehearsal's usual broker, is a single broker: it cannot move a leader. The mock
cluster can, so ``leader_moves`` runs on a 3-broker mock cluster living in the rehearsal process;
the sink process and its Spark Python workers reach it over TCP. Registered in
:data:`devtools.rehearsal.run.SCENARIO_MODULES` (``make rehearse --only leader_moves``).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable

from devtools.rehearsal.run import Lake, Rehearsal, ScenarioResult, Traffic, reconcile, table_declaration
from devtools.services.mockcluster import API_KEYS, MockCluster
from kafka_iceberg.declaration.spec import parse_table_spec
from kafka_iceberg.kafka.admin import KafkaMetadata


class LeaderMover(threading.Thread):
    """Moves the leader of every partition of ``topic`` to another live broker every
    ``interval_s`` seconds (a *round*) until :meth:`stop`. Every ``replace_every``-th round
    (0: never) replaces a broker instead: one of the current leaders (each in turn) goes down, ``detect_s`` later
    its partitions are led by live brokers (as the controller would elect), and ``down_s`` later
    it comes back up, leading nothing until a later round moves leaders onto it.

    ``rounds``: the ``time.monotonic()`` of every completed round of moves; ``replacements``:
    (broker id, down at, up at) in the same clock; ``errors``: failed mock calls. With
    ``wait_for``, the first round waits until it returns True (polled every 20 ms).
    """

    def __init__(
        self,
        cluster: MockCluster,
        topic: str,
        partitions: int,
        interval_s: float = 0.25,
        replace_every: int = 0,
        detect_s: float = 0.5,
        down_s: float = 2.0,
        wait_for: Callable[[], bool] | None = None,
    ):
        super().__init__(daemon=True, name=f"leader-mover-{topic}")
        self.cluster, self.topic, self.partitions = cluster, topic, partitions
        self.interval_s, self.replace_every, self.detect_s, self.down_s = interval_s, replace_every, detect_s, down_s
        self.leader = {p: 1 + p % cluster.brokers for p in range(partitions)}
        self.rounds: list[float] = []
        self.replacements: list[tuple[int, float, float]] = []
        self.errors: list[str] = []
        self.wait_for = wait_for
        self._halt = threading.Event()

    def _live(self) -> list[int]:
        return [b for b in range(1, self.cluster.brokers + 1) if b not in self.cluster.down]

    def _move_all(self, away_from: int | None = None) -> None:
        """Every partition (or only those led by ``away_from``) to the next live broker."""
        live = self._live()
        for p in range(self.partitions):
            if away_from is not None and self.leader[p] != away_from:
                continue
            others = [b for b in live if b != self.leader[p]] or live
            nxt = min((b for b in others if b > self.leader[p]), default=others[0])
            self.cluster.set_leader(self.topic, p, nxt)
            self.leader[p] = nxt

    def _replace(self) -> None:
        leaders = sorted(set(self.leader.values()))
        victim = leaders[len(self.replacements) % len(leaders)]
        self.cluster.broker_down(victim)
        down_at = time.monotonic()
        self._halt.wait(self.detect_s)
        self._move_all(away_from=victim)
        self.rounds.append(time.monotonic())
        self._halt.wait(self.down_s)
        self.cluster.broker_up(victim)
        self.replacements.append((victim, down_at, time.monotonic()))

    def run(self) -> None:
        for p in range(self.partitions):  # start from known leaders
            self.cluster.set_leader(self.topic, p, self.leader[p])
        while self.wait_for is not None and not self.wait_for() and not self._halt.is_set():
            self._halt.wait(0.02)
        n = 0
        while not self._halt.is_set():
            n += 1
            try:
                if self.replace_every and n % self.replace_every == 0:
                    self._replace()
                else:
                    self._move_all()
                    self.rounds.append(time.monotonic())
            except Exception as exc:  # reported as a failed check by the scenario
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._halt.wait(self.interval_s)

    def stop(self) -> None:
        """Stop moving; every broker is up afterwards."""
        self._halt.set()
        self.join(30)
        for b in sorted(self.cluster.down):
            self.cluster.broker_up(b)

    def rounds_while(self, times: list[float], window_s: float = 1.0) -> int:
        """Rounds with one of ``times`` (e.g. Fetch requests) less than ``window_s`` before them and
        another less than ``window_s`` after them: moves that happened in the middle of that activity."""

        def near(t: float, lo: float, hi: float) -> bool:
            return any(lo < x < hi for x in times)

        return sum(1 for t in self.rounds if near(t, t - window_s, t) and near(t, t, t + window_s))


def leader_moves(
    r: Rehearsal, rate: float = 60.0, partitions: int = 3, bound: int = 60, backlog_s: float = 6.0
) -> ScenarioResult:
    """On a 3-broker mock cluster: a producer writes small records continuously; after a first
    catch-up, every partition's leader moves every 0.25 s and every 12th round a broker is replaced
    (down, its partitions led elsewhere, up again 2 s later) while a sink catches up in micro-batches
    of ``bound`` offsets per partition. That run must succeed or fail cleanly (rc 0 or 3); a last
    catch-up without faults then reconciles exactly once.

    ``bound`` is small so the catch-up fetches in several micro-batches: a 6 s backlog (about 120
    records per partition) is one fetch of a fraction of a second in one batch, which leader
    moves every 0.25 s can miss (seen once, in the sixth session).
    """
    t0 = time.monotonic()
    with MockCluster(3) as cluster:
        cluster.track_requests()
        lake = Lake(r.lake.home, r.lake.broker_dir, cluster.bootstrap_servers)
        mr = Rehearsal(lake, r.log)
        name = f"leaders_{uuid.uuid4().hex[:6]}"
        decl = table_declaration(name, f"rehearsal.{name}", bound)
        topic, spec = decl["topic"], parse_table_spec(decl)
        cluster.create_topic(topic, partitions, 3)
        traffic = Traffic(lake.kafka_config, topic, rate, bad_every=89)
        traffic.start()
        time.sleep(2)
        first = lake.catch_up(decl)
        mover = LeaderMover(cluster, topic, partitions, interval_s=0.25, replace_every=12)
        mover.start()
        time.sleep(backlog_s)
        faulted = lake.catch_up(decl)
        mover.stop()
        time.sleep(2)
        traffic.stop()
        fetches = [t for _, _, t in cluster.requests(API_KEYS["Fetch"])]
        during = mover.rounds_while(fetches)
        batches = [json.loads(line) for line in faulted.stdout.splitlines() if line.startswith("{")]
        err = faulted.stderr.strip().splitlines()
        checks = {
            "first run caught up": first.returncode == 0,
            "producer delivered everything": not traffic.errors,
            "leaders moved while the sink was fetching": during > 0,
            "a broker was replaced while the sink ran": bool(mover.replacements) and not mover.errors,
            "the run under leader moves succeeded or failed cleanly": faulted.returncode in (0, 3),
        }
        if faulted.returncode != 0:
            r.log(faulted.stderr[-3000:])
        mr._final_catch_up(decl, checks)
        checks["no attempt branches left"] = mr._no_leftovers(spec)
        checks["no overlapping snapshot ranges"] = mr._no_overlaps(spec)
        lows = KafkaMetadata(lake.kafka_config).watermarks(topic)
        checks["the mock kept every record (log start offsets 0)"] = all(w.low == 0 for w in lows.values())
        tally = reconcile(mr.catalog, spec, traffic.expected())
    outcome = (
        f"succeeded in {len(batches)} micro-batches"
        if faulted.returncode == 0
        else f"failed cleanly (rc {faulted.returncode}: {err[-1][:160] if err else ''})"
        if faulted.returncode == 3
        else f"failed UNCLEANLY (rc {faulted.returncode}: {err[-1][:160] if err else ''})"
    )
    notes = (
        f"{len(mover.rounds)} rounds of leader moves ({during} while fetching), "
        f"{len(mover.replacements)} broker replacements; the run {outcome}"
    )
    return ScenarioResult(
        "leader moves + broker replacement (mock cluster)",
        len(mover.rounds) + len(mover.replacements),
        tally,
        checks,
        notes,
        time.monotonic() - t0,
    )


def register(scenarios: dict) -> None:
    """Add this module's scenarios to the rehearsal's registry."""
    scenarios["leader_moves"] = lambda r, args: leader_moves(r)


__all__ = ["LeaderMover", "leader_moves", "register"]
