"""The rehearsal's command line (devtools/rehearsal/run.py ``main``): ``--kills`` and each scenario's default."""

from __future__ import annotations

import argparse

import pytest

from devtools.rehearsal import cdc, consistent_cdc, run


def test_kills_default_per_scenario_and_zero_is_kept():
    assert run.kills_or(argparse.Namespace(kills=None), 12) == 12
    assert run.kills_or(argparse.Namespace(kills=0), 12) == 0
    assert run.kills_or(argparse.Namespace(kills=3), 12) == 3


def test_help_names_the_defaults_the_scenarios_use(capsys):
    with pytest.raises(SystemExit) as stop:
        run.main(["--help"])
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"dagster_cli_kills {run.KILLS}" in text
    assert f"cdc_kills {cdc.KILLS}" in text
    assert f"consistent_cdc {consistent_cdc.KILLS}" in text
    assert cdc.cdc_kills.__defaults__[0] == cdc.KILLS
    assert consistent_cdc.consistent_cdc.__defaults__[0] == consistent_cdc.KILLS
