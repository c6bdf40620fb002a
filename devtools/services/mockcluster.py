"""librdkafka's mock Kafka cluster, from the copy of librdkafka inside the confluent-kafka wheel.

The mock cluster is a set of in-process Kafka brokers (threads of this process listening on
127.0.0.1 TCP ports) whose partition leaders can be moved and whose brokers can be taken down
and brought back: what replacing brokers under traffic looks like to a client. confluent-kafka's
Python API does not expose it, so :class:`MockCluster` calls librdkafka's C API
(``rdkafka_mock.h``) through :mod:`ctypes`.

It lives as long as the process (and the :class:`MockCluster` object) that created it. Other
processes, such as a rehearsal's sink and its Spark Python workers, reach it over TCP through
:attr:`MockCluster.bootstrap_servers`.

What it serves (librdkafka 2.16 ``rdkafka_mock_handlers.c``): Produce, Fetch, ListOffsets,
Metadata (so ``describe_topics``), OffsetCommit and OffsetFetch (so the admin client's
``alter_consumer_group_offsets`` / ``list_consumer_group_offsets``), FindCoordinator, the
classic consumer-group protocol, InitProducerId and transactions, OffsetForLeaderEpoch. What it
does not: CreateTopics (use :meth:`MockCluster.create_topic`), DeleteRecords,
DescribeConfigs/AlterConfigs. Limits: every partition keeps only its last 5 MiB or 100,000
message sets; older ones are dropped silently (the log start offset moves, as retention
would), so rehearsals write small records. There is no persistence and no replication: moving
a leader moves the one in-memory log with it, so nothing is lost by a move.
"""

from __future__ import annotations

import ctypes
import glob
import os
from pathlib import Path

RD_KAFKA_PRODUCER = 0
API_KEYS = {"Produce": 0, "Fetch": 1, "ListOffsets": 2, "Metadata": 3, "OffsetCommit": 8, "OffsetFetch": 9}
"""Kafka protocol API keys of the requests a rehearsal looks for in :meth:`MockCluster.requests`."""


def library_path() -> str:
    """Path of the librdkafka shared library the installed confluent-kafka wheel bundles.

    Raises:
        RuntimeError: no bundled librdkafka (confluent-kafka built against a system one, or not installed).
    """
    import confluent_kafka

    pkg = Path(confluent_kafka.__file__).parent
    for pattern in (
        str(pkg.parent / "confluent_kafka.libs" / "librdkafka*.so*"),
        str(pkg / "librdkafka*.so*"),
        str(pkg.parent / "confluent_kafka.libs" / "librdkafka*.dylib"),
    ):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    raise RuntimeError(f"no bundled librdkafka next to {pkg}; the mock cluster needs the confluent-kafka wheel")


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(library_path())
    vp, cp, i32 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32
    signatures = {
        "rd_kafka_conf_new": (vp, []),
        "rd_kafka_conf_set": (ctypes.c_int, [vp, cp, cp, cp, ctypes.c_size_t]),
        "rd_kafka_new": (vp, [ctypes.c_int, vp, cp, ctypes.c_size_t]),
        "rd_kafka_destroy": (None, [vp]),
        "rd_kafka_err2name": (cp, [ctypes.c_int]),
        "rd_kafka_mock_cluster_new": (vp, [vp, ctypes.c_int]),
        "rd_kafka_mock_cluster_destroy": (None, [vp]),
        "rd_kafka_mock_cluster_bootstraps": (cp, [vp]),
        "rd_kafka_mock_topic_create": (ctypes.c_int, [vp, cp, ctypes.c_int, ctypes.c_int]),
        "rd_kafka_mock_partition_set_leader": (ctypes.c_int, [vp, cp, i32, i32]),
        "rd_kafka_mock_broker_set_down": (ctypes.c_int, [vp, i32]),
        "rd_kafka_mock_broker_set_up": (ctypes.c_int, [vp, i32]),
        "rd_kafka_mock_partition_delete_records": (ctypes.c_int, [vp, cp, i32, ctypes.c_int64]),
        "rd_kafka_mock_broker_set_rtt": (ctypes.c_int, [vp, i32, ctypes.c_int]),
        "rd_kafka_mock_start_request_tracking": (None, [vp]),
        "rd_kafka_mock_get_requests": (ctypes.POINTER(vp), [vp, ctypes.POINTER(ctypes.c_size_t)]),
        "rd_kafka_mock_request_destroy_array": (None, [ctypes.POINTER(vp), ctypes.c_size_t]),
        "rd_kafka_mock_request_id": (i32, [vp]),
        "rd_kafka_mock_request_api_key": (ctypes.c_int16, [vp]),
        "rd_kafka_mock_request_timestamp": (ctypes.c_int64, [vp]),
        "rd_kafka_mock_push_request_errors_array": (
            None,
            [vp, ctypes.c_int16, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)],
        ),
        "rd_kafka_mock_clear_request_errors": (None, [vp, ctypes.c_int16]),
        "rd_kafka_mock_topic_set_error": (None, [vp, cp, ctypes.c_int]),
        # not in rdkafka_mock.h of v2.x, but exported by 2.16 (librdkafka's tests/0156 call it):
        # void (mcluster, int32_t controller_id)
        "rd_kafka_mock_set_controller_id": (None, [vp, i32]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


class MockClusterError(RuntimeError):
    """A mock-cluster call failed (its librdkafka error name is in the message)."""


class MockCluster:
    """``brokers`` mock Kafka brokers (ids 1..brokers) in this process, as a context manager.

    Args:
        brokers: number of brokers (ids ``1`` to ``brokers``).

    Raises:
        MockClusterError: librdkafka could not create the handle or the cluster.
    """

    def __init__(self, brokers: int = 3):
        self.brokers = brokers
        self._lib = _load()
        self._rk = self._handle()
        self._mc = self._lib.rd_kafka_mock_cluster_new(self._rk, brokers)
        if not self._mc:
            self._lib.rd_kafka_destroy(self._rk)
            raise MockClusterError(f"rd_kafka_mock_cluster_new({brokers}) failed")
        self.bootstrap_servers: str = self._lib.rd_kafka_mock_cluster_bootstraps(self._mc).decode()
        """``host:port,...`` of every broker (127.0.0.1 ports chosen by the OS)."""
        self.leaders: dict[tuple[str, int], int] = {}  # (topic, partition) -> broker id set by set_leader
        self.down: set[int] = set()
        self.controller = 0
        self.set_controller(1)

    def set_controller(self, broker_id: int) -> None:
        """Name ``broker_id`` the controller in Metadata answers. The mock starts with controller id
        0, which no broker has, and the admin client's ``describe_topics`` waits for a controller
        until it times out; a real cluster always elects one."""
        self._lib.rd_kafka_mock_set_controller_id(self._live(), broker_id)
        self.controller = broker_id

    def _handle(self) -> int:
        """A producer handle that only hosts the cluster (it never connects anywhere)."""
        errstr = ctypes.create_string_buffer(512)
        conf = self._lib.rd_kafka_conf_new()
        for key, value in (("log_level", "3"), ("client.id", f"mockcluster-{os.getpid()}")):
            if self._lib.rd_kafka_conf_set(conf, key.encode(), value.encode(), errstr, len(errstr)) != 0:
                raise MockClusterError(f"rd_kafka_conf_set {key}: {errstr.value.decode()}")
        rk = self._lib.rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
        if not rk:
            raise MockClusterError(f"rd_kafka_new: {errstr.value.decode()}")
        return rk

    def _check(self, err: int, what: str) -> None:
        if err != 0:
            raise MockClusterError(f"{what}: {self._lib.rd_kafka_err2name(err).decode()}")

    def _live(self):
        if not self._mc:
            raise MockClusterError("the mock cluster is closed")
        return self._mc

    def create_topic(self, name: str, partitions: int, replication: int = 1) -> None:
        """Create ``name`` with ``partitions`` partitions and ``replication`` replicas (at most
        :attr:`brokers`); leaders are spread over the brokers by the mock.

        Raises:
            MockClusterError: e.g. ``TOPIC_ALREADY_EXISTS``, ``INVALID_REPLICATION_FACTOR``.
        """
        self._check(
            self._lib.rd_kafka_mock_topic_create(self._live(), name.encode(), partitions, replication),
            f"create topic {name}",
        )

    def set_leader(self, topic: str, partition: int, broker_id: int) -> None:
        """Make ``broker_id`` the leader of ``topic``/``partition`` (bumps the leader epoch; ``-1``:
        no leader). Clients learn it from NOT_LEADER_OR_FOLLOWER answers and a metadata refresh."""
        self._check(
            self._lib.rd_kafka_mock_partition_set_leader(self._live(), topic.encode(), partition, broker_id),
            f"set leader of {topic} [{partition}] to {broker_id}",
        )
        self.leaders[(topic, partition)] = broker_id

    def broker_down(self, broker_id: int) -> None:
        """Disconnect broker ``broker_id``'s clients and refuse new connections (``-1``: every
        broker). Its partitions keep it as leader until :meth:`set_leader` moves them. When it was
        the controller, the lowest live broker becomes the controller (as a real cluster elects one)."""
        self._check(self._lib.rd_kafka_mock_broker_set_down(self._live(), broker_id), f"set broker {broker_id} down")
        self.down.update(range(1, self.brokers + 1) if broker_id == -1 else {broker_id})
        live = [b for b in range(1, self.brokers + 1) if b not in self.down]
        if self.controller in self.down and live:
            self.set_controller(live[0])

    def broker_up(self, broker_id: int) -> None:
        """Accept connections on broker ``broker_id`` again (``-1``: every broker)."""
        self._check(self._lib.rd_kafka_mock_broker_set_up(self._live(), broker_id), f"set broker {broker_id} up")
        self.down.difference_update(range(1, self.brokers + 1) if broker_id == -1 else {broker_id})

    def set_rtt(self, broker_id: int, rtt_ms: int) -> None:
        """Delay every answer of broker ``broker_id`` by ``rtt_ms`` ms (slows reads down so faults land mid-read)."""
        self._check(
            self._lib.rd_kafka_mock_broker_set_rtt(self._live(), broker_id, rtt_ms), f"set rtt of broker {broker_id}"
        )

    def push_request_errors(self, api_key: int, error: int, count: int) -> None:
        """Answer the next ``count`` requests of ``api_key`` (see :data:`API_KEYS`), from any client to
        any broker, with the Kafka error code ``error`` (e.g. ``KafkaError.TOPIC_AUTHORIZATION_FAILED``)
        for every partition or group they name; :meth:`clear_request_errors` drops the rest."""
        errors = (ctypes.c_int * count)(*([error] * count))
        self._lib.rd_kafka_mock_push_request_errors_array(self._live(), api_key, count, errors)

    def clear_request_errors(self, api_key: int) -> None:
        """Drop the errors still pushed for ``api_key``: its requests are answered normally again."""
        self._lib.rd_kafka_mock_clear_request_errors(self._live(), api_key)

    def set_topic_error(self, topic: str, error: int) -> None:
        """Report ``error`` for ``topic`` in every Metadata answer (0: none), to every client."""
        self._lib.rd_kafka_mock_topic_set_error(self._live(), topic.encode(), error)

    def delete_records(self, topic: str, partition: int, before_offset: int) -> None:
        """Move the log start offset of ``topic``/``partition`` up to ``before_offset`` (as retention would)."""
        self._check(
            self._lib.rd_kafka_mock_partition_delete_records(self._live(), topic.encode(), partition, before_offset),
            f"delete records of {topic} [{partition}] before {before_offset}",
        )

    def track_requests(self) -> None:
        """Record every request the brokers receive from now on (see :meth:`requests`)."""
        self._lib.rd_kafka_mock_start_request_tracking(self._live())

    def requests(self, api_key: int | None = None) -> list[tuple[int, int, float]]:
        """The requests received since :meth:`track_requests`, oldest first, as (broker id, API
        key, seconds on this machine's monotonic clock, comparable with ``time.monotonic()``);
        only those of ``api_key`` (see :data:`API_KEYS`) when given."""
        count = ctypes.c_size_t(0)
        array = self._lib.rd_kafka_mock_get_requests(self._live(), ctypes.byref(count))
        out = []
        try:
            for i in range(count.value):
                req = array[i]
                key = self._lib.rd_kafka_mock_request_api_key(req)
                if api_key is None or key == api_key:
                    out.append(
                        (
                            self._lib.rd_kafka_mock_request_id(req),
                            key,
                            self._lib.rd_kafka_mock_request_timestamp(req) / 1e6,
                        )
                    )
        finally:
            if array:
                self._lib.rd_kafka_mock_request_destroy_array(array, count.value)
        return sorted(out, key=lambda r: r[2])

    def close(self) -> None:
        """Stop every broker (clients see them go away) and free the cluster; idempotent."""
        if self._mc:
            self._lib.rd_kafka_mock_cluster_destroy(self._mc)
            self._mc = None
        if self._rk:
            self._lib.rd_kafka_destroy(self._rk)
            self._rk = None

    def __enter__(self) -> MockCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["API_KEYS", "MockCluster", "MockClusterError", "library_path"]
