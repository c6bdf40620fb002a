"""The ACL rehearsal scenario (``make rehearse --only acl_revoked``): the sink's topic and group ACLs
revoked on librdkafka's mock cluster while a micro-batch runs, then granted again (see
:mod:`devtools.rehearsal.acl`); and the refusals as the write path's admin client reports them."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, Producer

from devtools.rehearsal.acl import acl_revoked
from devtools.rehearsal.run import _load_scenarios, format_table
from devtools.services.mockcluster import API_KEYS, MockCluster
from kafka_iceberg.errors import NotAuthorizedError
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata
from tests.helpers import rehearsal_on_own_broker

pytestmark = pytest.mark.rehearsal


def test_refused_acls_raise_not_authorized_naming_the_topic_and_group():
    with MockCluster(1) as cluster:
        cluster.create_topic("acl.orders", 2, 1)
        producer = Producer({"bootstrap.servers": cluster.bootstrap_servers})
        for i in range(10):
            producer.produce("acl.orders", value=b"%d" % i, partition=i % 2)
        producer.flush(30)
        kafka = KafkaMetadata(KafkaConfig(cluster.bootstrap_servers, {}, 10.0))
        assert kafka.watermarks("acl.orders")[0].high == 5
        cluster.push_request_errors(API_KEYS["ListOffsets"], KafkaError.TOPIC_AUTHORIZATION_FAILED, 1000)
        cluster.push_request_errors(API_KEYS["OffsetCommit"], KafkaError.GROUP_AUTHORIZATION_FAILED, 1000)
        with pytest.raises(NotAuthorizedError, match=r"acl\.orders: not authorized \(TOPIC_AUTHORIZATION_FAILED\)"):
            kafka.watermarks("acl.orders")
        # a refused partition of an offset commit is an error too, not a silent success
        with pytest.raises(
            NotAuthorizedError, match=r"group lake\.acl .*not authorized \(GROUP_AUTHORIZATION_FAILED\)"
        ):
            kafka.commit_group_offsets("lake.acl", "acl.orders", {0: 5, 1: 5})
        cluster.clear_request_errors(API_KEYS["ListOffsets"])
        cluster.clear_request_errors(API_KEYS["OffsetCommit"])
        assert kafka.watermarks("acl.orders")[1].high == 5
        kafka.commit_group_offsets("lake.acl", "acl.orders", {0: 5, 1: 5})
        assert kafka.group_offsets("lake.acl", "acl.orders") == {0: 5, 1: 5}


@pytest.fixture(scope="module")
def rehearsal():
    yield from rehearsal_on_own_broker("lake-rehearsal-acl-", seed=13)


@pytest.mark.timeout(2400)  # four sink processes, each starting Spark
def test_acl_revoked_mid_run_fails_clearly_alerts_commits_nothing_and_recovers(rehearsal):
    assert "acl_revoked" in _load_scenarios()
    result = acl_revoked(rehearsal)
    print("\n" + format_table([result]))
    assert result.tally.produced > 0 and result.tally.in_table > 0 and result.tally.quarantined > 0
    assert (result.tally.lost, result.tally.duplicates, result.tally.unexpected, result.tally.mismatched) == (
        0,
        0,
        0,
        0,
    ), result.tally
    assert all(result.checks.values()), {k: v for k, v in result.checks.items() if not v}
    assert result.tally.leaks_beyond_bound == 0, result.tally.leaks.describe()
    assert result.passed
