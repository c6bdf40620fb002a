"""The object-storage rehearsal scenario (``make rehearse --only storage_faults``, 90 s of faults):
a warehouse on S3 (moto) behind a proxy answering a share of PUTs and GETs with 503 SlowDown, 500
and timeouts while producers write and a sink loops (see :mod:`devtools.rehearsal.storage`)."""

from __future__ import annotations

import pytest

from devtools.rehearsal.run import _load_scenarios, format_table
from devtools.rehearsal.storage import storage_faults
from devtools.services.devbroker import free_port
from devtools.services.s3faults import FaultProxy, start_moto
from tests.helpers import rehearsal_on_own_broker

pytestmark = pytest.mark.rehearsal


def test_fault_proxy_fails_a_share_and_forwards_the_rest(tmp_path):
    moto = start_moto(tmp_path / "moto.log", free_port())
    proxy = FaultProxy(moto.endpoint, share=0.5, kinds=("slowdown", "internal"), seed=3)
    try:
        direct, through = moto.client(), moto.client(proxy.endpoint, attempts=20)
        direct.create_bucket(Bucket="proxy-test")
        proxy.enabled = True
        for i in range(20):  # boto3 retries 5xx: every PUT lands in the end
            through.put_object(Bucket="proxy-test", Key=f"k{i}", Body=b"v%d" % i)
        assert proxy.counts() and set(proxy.counts()) <= {"PUT slowdown", "PUT internal"}
        retried, never = proxy.retried()
        assert retried == len(proxy.faults) and never == 0
        keys = [o["Key"] for o in direct.list_objects_v2(Bucket="proxy-test")["Contents"]]
        assert sorted(keys) == sorted(f"k{i}" for i in range(20))
    finally:
        proxy.close()
        moto.stop()


@pytest.fixture(scope="module")
def rehearsal():
    yield from rehearsal_on_own_broker("lake-rehearsal-s3-", seed=17)


@pytest.mark.timeout(2400)  # several sink processes, each starting Spark
def test_storage_faults_observed_retried_exactly_once(rehearsal):
    assert "storage_faults" in _load_scenarios()
    # 50 records/s: a micro-batch still writes to all 28 day partitions (as many PUTs); the backlog stays small
    result = storage_faults(rehearsal, seconds=30, min_batches=3, rate=50.0)
    print("\n" + format_table([result]))
    assert result.faults > 0
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
