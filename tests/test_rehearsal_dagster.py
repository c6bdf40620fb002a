"""The Dagster rehearsal's fast subset (``make rehearse`` runs it full size: 20 CLI kills, the
sensor-run kills, the daemon killed mid-backfill, ``dagster dev`` restarted).

Real ``dagster asset materialize`` processes of the real code location (``kafka_iceberg.lake_assets.definitions``)
are SIGKILLed while a producer writes; the next materialization must find the dead runs, fail them,
free the pool slot and catch up, and every produced record is reconciled (see
:mod:`devtools.rehearsal.dagster_runs`).
"""

from __future__ import annotations

import pytest

from devtools.rehearsal.dagster_runs import cli_kills
from devtools.rehearsal.run import format_table
from tests.helpers import rehearsal_on_own_broker

pytestmark = pytest.mark.rehearsal


@pytest.fixture(scope="module")
def rehearsal():
    yield from rehearsal_on_own_broker("lake-rehearsal-dagster-", seed=11)


def _assert_passed(result):
    print("\n" + format_table([result]))
    assert result.tally.lost == 0 and result.tally.duplicates == 0, result.tally
    assert result.tally.mismatched == 0 and result.tally.unexpected == 0, result.tally.examples
    assert result.tally.produced > 0 and result.tally.in_table + result.tally.quarantined == result.tally.produced
    assert result.checks["no stuck run (NOT_STARTED/QUEUED/STARTING/STARTED)"]
    assert result.checks["no held pool slot"]
    assert result.checks["table caught up (lag 0)"]
    assert all(result.checks.values()), {k: v for k, v in result.checks.items() if not v}


def test_sigkilled_dagster_asset_materialize_runs_never_hold_the_table(rehearsal):
    result = cli_kills(rehearsal, n=3)
    _assert_passed(result)
    assert result.faults >= 2, result.notes  # kills that hit a live materialization
    assert "holding the pool slot" in result.notes or "mid micro-batch" in result.notes, result.notes
