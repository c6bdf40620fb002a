"""Consistency groups in the declaration (kafka_iceberg/declaration/groups.py): ``consistency_group:``
is accepted on Debezium upsert tables of one source, refused anywhere else."""

from __future__ import annotations

import pytest

from kafka_iceberg.declaration.groups import assignment_units, groups, source_prefix, transaction_topic
from kafka_iceberg.declaration.spec import parse_declarations
from kafka_iceberg.errors import ConfigError

COLUMNS = [{"name": "id", "type": "long", "required": True}, {"name": "qty", "type": "long"}]


def _table(name: str, topic: str, **extra) -> dict:
    return {"name": name, "identifier": f"shop.{name}", "topic": topic, "schema": COLUMNS, **extra}


def _cdc(name: str, topic: str, group: str | None = "shop") -> dict:
    return _table(name, topic, mode="upsert", key=["id"], cdc="debezium", consistency_group=group)


def test_the_debezium_tables_of_one_source_form_a_group():
    specs = parse_declarations(
        {
            "tables": [
                _cdc("orders", "shop.public.orders"),
                _cdc("order_lines", "shop.public.order_lines"),
                _cdc("stock", "shop.public.stock", group=None),
            ]
        },
        "tables.yaml",
    )
    assert {name: [s.name for s in members] for name, members in groups(specs).items()} == {
        "shop": ["orders", "order_lines"]
    }
    assert transaction_topic(source_prefix(specs[0].topic)) == "shop.transaction"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (_table("orders", "shop.public.orders", consistency_group="shop"), "needs mode: upsert and cdc: debezium"),
        (
            _table("orders", "shop.public.orders", mode="upsert", key=["id"], cdc="none", consistency_group="shop"),
            "needs mode: upsert and cdc: debezium",
        ),
        (_cdc("orders", "shop.public.orders", group="Shop Group"), "consistency_group"),
    ],
)
def test_a_group_on_a_table_that_is_not_debezium_cdc_is_refused(entry, message):
    with pytest.raises(ConfigError, match=message):
        parse_declarations({"tables": [entry]}, "tables.yaml")


def test_a_group_across_two_debezium_sources_is_refused():
    doc = {"tables": [_cdc("orders", "shop.public.orders"), _cdc("stock", "warehouse.public.stock")]}
    with pytest.raises(ConfigError, match=r"mixes Debezium sources \(topic prefixes \['shop', 'warehouse'\]\)"):
        parse_declarations(doc, "tables.yaml")


def test_a_groups_tables_are_one_assignment_unit():
    grouped = [_cdc(n, f"shop.public.{n}") for n in ("a_orders", "m_lines", "z_stock")]
    alone = [_cdc(n, f"shop.public.{n}", group=None) for n in ("b", "c")]
    specs = parse_declarations({"tables": grouped + alone}, "tables.yaml")
    assert [[s.name for s in unit] for unit in assignment_units(specs)] == [
        ["a_orders", "m_lines", "z_stock"],
        ["b"],
        ["c"],
    ]
