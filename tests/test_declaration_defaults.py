"""One source of truth for the declaration: every default and pattern of ``tables.yaml`` is written in
the pydantic models of kafka_iceberg.declaration.models; the dataclasses the rest of the code reads carry
no defaults of their own, and an undeclared section gives exactly the models' defaults."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

from kafka_iceberg.declaration import columns, format_spec, models, patterns, spec
from kafka_iceberg.declaration.models import (
    BadRecordsDecl,
    FreshnessDecl,
    LagDecl,
    MaintenanceDecl,
    RetentionDecl,
    TableDecl,
    parse_duration_s,
)
from kafka_iceberg.ops.lag import LagRules
from kafka_iceberg.ops.retention import RetentionPolicy

DECLARED = [
    spec.StartingPosition,
    spec.FreshnessPolicy,
    spec.LagPolicy,
    spec.MaintenancePolicy,
    spec.BadRecordPolicy,
    spec.TableSpec,
    RetentionPolicy,
    LagRules,
    format_spec.FormatSpec,
]


@pytest.mark.parametrize("cls", DECLARED, ids=lambda c: c.__name__)
def test_declaration_dataclasses_have_no_defaults_of_their_own(cls):
    defaulted = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ]
    assert defaulted == [], f"{cls.__name__} defaults {defaulted}: write the default in the pydantic model"


def test_an_undeclared_section_gives_the_models_defaults():
    table = spec.parse_table_spec(
        {"name": "t", "identifier": "ns.t", "topic": "t", "schema": [{"name": "id", "type": "long"}]}
    )
    lag, m, r, b = LagDecl(), MaintenanceDecl(), RetentionDecl(), BadRecordsDecl()
    assert table.lag == spec.LagPolicy(
        lag.max_offset_lag,
        parse_duration_s(lag.max_interval, "lag"),
        lag.window,
        parse_duration_s(lag.interval, "lag"),
        parse_duration_s(lag.grace, "lag"),
    )
    assert (table.maintenance.compact_cron, table.maintenance.retain_last) == (m.compact, m.retain_last)
    assert table.maintenance.orphan_older_than_s == parse_duration_s(m.orphan_older_than, "m") == 3 * 86400
    assert table.retention.warn_headroom_s == parse_duration_s(r.warn_headroom, "r") == 6 * 3600
    assert (table.bad_records.policy, table.bad_records.max_record_bytes) == (b.policy, b.max_record_bytes)
    assert table.freshness.max_snapshot_age_s == parse_duration_s(FreshnessDecl().max_snapshot_age, "f")
    for field in ("max_records_per_partition", "unknown_fields"):
        assert getattr(table, field) == TableDecl.model_fields[field].default
    assert table.starting_position.kind == TableDecl.model_fields["starting_position"].default
    assert table.format.subject_strategy == models.FormatDecl.model_fields["subject_strategy"].default


def test_patterns_are_written_once():
    """The identifier and duration patterns live in the models module; no declaration module spells them again."""
    for module in (spec, format_spec, patterns, columns):
        source = inspect.getsource(module)
        assert "[a-z_][a-z0-9_]" not in source, module.__name__
        assert "(ms|s|m|h|d)" not in source, module.__name__
    assert spec.IDENTIFIER is models.IDENTIFIER and models.IDENTIFIER.pattern == models.IDENTIFIER_PATTERN
    assert re.match(models.DURATION_PATTERN, "90s") and parse_duration_s("1.5m", "d") == 90.0
