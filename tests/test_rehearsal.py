"""The failure rehearsal's fast subset (``make rehearse`` runs it full size, 20 kills).

Each scenario runs on a broker and a catalog of its own (a second noida-db, a fresh
``LAKE_HOME``), with producers writing while faults are injected, and ends with the
reconciliation of every produced record (see :mod:`devtools.rehearsal.run`).

Producers write 50 records/s in most scenarios here (their defaults: 150-200 records/s): every sink
still finds records to read and crash on, and the backlog each final catch-up reads stays small.
"""

from __future__ import annotations

import pytest

from devtools.rehearsal.run import format_table
from tests.helpers import rehearsal_on_own_broker

pytestmark = pytest.mark.rehearsal


@pytest.fixture(scope="module")
def rehearsal():
    # seed 0: the kills' fifth is from outside (11.5 s after the sink started), the broker stops 8.5 s into its run
    yield from rehearsal_on_own_broker("lake-rehearsal-", seed=0)


def _assert_passed(result):
    print("\n" + format_table([result]))
    assert result.tally.lost == 0 and result.tally.duplicates == 0, result.tally
    assert result.tally.mismatched == 0 and result.tally.unexpected == 0, result.tally.examples
    assert result.tally.produced > 0 and result.tally.in_table > 0
    assert all(result.checks.values()), {k: v for k, v in result.checks.items() if not v}
    assert result.tally.leaks_beyond_bound == 0, result.tally.leaks.describe()
    assert result.passed


def test_kills_at_every_crash_point_and_from_outside(rehearsal):
    result = rehearsal.kills(n=5, rate=50.0)
    _assert_passed(result)
    assert result.tally.quarantined > 0, "the producer's malformed records are accounted for in the dead-letter table"
    assert result.tally.in_table + result.tally.quarantined == result.tally.produced


def test_sink_stop_and_restart(rehearsal):
    # 100 records/s: at least 1,000 records of lag (600 needed), a backlog of several micro-batches after the restart
    result = rehearsal.sink_outage(produce_s=10, rate=100.0)
    _assert_passed(result)
    assert result.tally.in_table == result.tally.produced


def test_broker_outage_mid_run(rehearsal):
    _assert_passed(rehearsal.broker_outage(down_s=6, rate=50.0))


def test_catalog_locked_by_another_process(rehearsal):
    _assert_passed(rehearsal.catalog_lock(short_s=6, long_s=20, rate=50.0))


def test_transaction_markers_and_aborted_transactions(rehearsal):
    result = rehearsal.transactions(seconds=6)
    _assert_passed(result)
    assert result.faults > 0, "some transactions were aborted"


def test_retention_loss_is_reported_and_the_gap_accepted(rehearsal):
    _assert_passed(rehearsal.retention_loss(rate=50.0))


def test_backfill_from_a_known_offset_into_a_new_table(rehearsal):
    result = rehearsal.backfill_from_offset(rate=50.0)
    _assert_passed(result)
    assert result.tally.quarantined > 0 and "valid" in result.notes
