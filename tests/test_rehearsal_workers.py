"""The rehearsal's many-table worker scenario, small: a worker serving three tables is SIGKILLed
mid-stream three times while producers write; then every table holds every record exactly once
(devtools/rehearsal/workers.py)."""

from __future__ import annotations

import pytest

from devtools.rehearsal.run import format_table
from devtools.rehearsal.workers import worker_kills
from tests.helpers import rehearsal_on_own_broker

pytestmark = pytest.mark.rehearsal


@pytest.fixture(scope="module")
def rehearsal():
    # seed 310: the worker is killed 20.1, 12.2 and 13.7 s after each start
    yield from rehearsal_on_own_broker("lake-rehearsal-workers-", seed=310)


def test_a_killed_many_table_worker_loses_and_duplicates_nothing(rehearsal):
    result = worker_kills(rehearsal, tables=3, kills=3, rate=40.0)
    assert result.passed, format_table([result]) + f"\n{result.checks}\n{result.tally.examples}"
    assert result.tally.produced > 0 and result.tally.in_table > 0 and result.tally.lost == 0
    assert result.tally.duplicates == 0
