"""The CDC rehearsal scenario's fast subset (``make rehearse`` runs ``cdc_kills`` full size): real
Debezium capturing a real PostgreSQL under a continuous SQL workload while the upsert sink is
SIGKILLed 3 times; after the catch-up the Iceberg table equals the PostgreSQL table, EXCEPT ALL
both ways (see :mod:`devtools.rehearsal.cdc`)."""

from __future__ import annotations

import pytest

from devtools.rehearsal.cdc import cdc_kills
from devtools.rehearsal.run import _load_scenarios, format_table
from tests.helpers import rehearsal_on_own_broker

pytestmark = [pytest.mark.rehearsal, pytest.mark.cdc]


@pytest.fixture(scope="module")
def rehearsal():
    # seed 293: the two kills from outside come 15.7 s (the sink starting) and 35.0 s (micro-batches) after the start
    yield from rehearsal_on_own_broker("lake-rehearsal-cdc-", seed=293)


def test_cdc_kills_table_equals_postgres(rehearsal):
    assert "cdc_kills" in _load_scenarios()
    result = cdc_kills(rehearsal, n=3, planes=300)
    print("\n" + format_table([result]))
    assert result.faults == 3 and result.tally.produced > 300
    assert result.tally.in_table > 200 and result.tally.quarantined == 0
    assert (result.tally.lost, result.tally.unexpected, result.tally.duplicates) == (0, 0, 0), result.tally
    assert all(result.checks.values()), {k: v for k, v in result.checks.items() if not v}
