"""Tables from topic patterns: the template, the exclusions and the validation (plain Python), and
on the dev broker: five topics make five tables in the code location, a sixth topic becomes a table
after a reload (the code location imported again in a new process), a Debezium connector's topics
become upsert tables, and a broker that does not answer at load leaves the location loading."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from dagster import AssetCheckKey, AssetKey

from devtools.services.devbroker import free_port
from kafka_iceberg.config.settings import CHECKOUT, load_settings
from kafka_iceberg.declaration.models import json_schema
from kafka_iceberg.declaration.patterns import expand_entries, identifier_part, parse_pattern
from kafka_iceberg.declaration.spec import load_table_specs
from kafka_iceberg.errors import ConfigError
from tests.helpers import EVENT_SCHEMA

DEBEZIUM_SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string"},
]


def _pattern(topic_pattern: str, **fields) -> dict:
    return {
        "topic_pattern": topic_pattern,
        "name": "{topic_table}",
        "identifier": "pat.{topic_table}",
        "schema": EVENT_SCHEMA,
        **fields,
    }


def _write(tmp_path: Path, tables: list[dict], defaults: dict | None = None) -> Path:
    path = tmp_path / "tables.yaml"
    path.write_text(yaml.safe_dump({"defaults": defaults or {}, "tables": tables}, sort_keys=False))
    return path


def _plain(name: str, topic: str, identifier: str | None = None) -> dict:
    return {"name": name, "identifier": identifier or f"plain.{name}", "topic": topic, "schema": EVENT_SCHEMA}


# --- the template -------------------------------------------------------------------------------


def test_template_fields_are_the_named_groups_and_the_topic(tmp_path):
    decl = _pattern(
        r"shop\.(?P<schema>[^.]+)\.(?P<table>[^.]+)",
        name="{schema}_{table}",
        identifier="cdc.{schema}_{table}",
        description="Rows of {topic}",
    )
    topics = ["shop.Public.Order-Items", "shop.sales.2024_totals", "shop.only_two", "other.public.orders"]
    specs = load_table_specs(_write(tmp_path, [decl]), lambda: topics)
    assert [(s.name, s.identifier, s.topic, s.description) for s in specs] == [
        ("public_order_items", "cdc.public_order_items", "shop.Public.Order-Items", "Rows of shop.Public.Order-Items"),
        ("sales_2024_totals", "cdc.sales_2024_totals", "shop.sales.2024_totals", "Rows of shop.sales.2024_totals"),
    ]
    assert identifier_part("shop.public.Orders-v2") == "shop_public_orders_v2"
    assert identifier_part("2024") == "2024"
    (spec,) = load_table_specs(
        _write(tmp_path, [_pattern(r"(?P<n>\d+)\.(?P<t>\w+)", name="{n}", identifier="{n}.{t}")]), lambda: ["7.x"]
    )
    assert (spec.name, spec.identifier) == ("_7", "_7.x")


def test_topic_table_field_and_default_description(tmp_path):
    specs = load_table_specs(_write(tmp_path, [_pattern(r"events\..*")]), lambda: ["events.c", "events.a-b"])
    assert [(s.name, s.identifier) for s in specs] == [("events_a_b", "pat.events_a_b"), ("events_c", "pat.events_c")]
    assert "from topic pattern" in specs[0].description and "events.a-b" in specs[0].description
    assert specs[0].consumer_group == "lake.pat.events_a_b"
    assert specs[0].bad_records.dead_letter_identifier == "pat.events_a_b_dead_letter"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "{tbl}"}, r"name template '\{tbl\}' uses unknown fields \['tbl'\]; known: \['table', 'topic'"),
        ({"identifier": "{table}"}, "must render a lower_snake_case name and identifier"),
        ({"identifier": "cdc.{table}-x"}, "must render a lower_snake_case name and identifier"),
        ({"name": "{table"}, "name template '{table'"),
        ({"topic_pattern": "(unclosed"}, r"topic_pattern '\(unclosed' is not a regular expression"),
        ({"exclude": ["[bad"]}, "exclude entry '\\[bad' is not a regular expression"),
        ({"topic": "t"}, "unknown keys \\['topic'\\]"),
    ],
)
def test_invalid_patterns_are_config_errors_naming_the_pattern(fields, message):
    decl = {**_pattern(r"db\.(?P<table>\w+)", name="{table}", identifier="cdc.{table}"), **fields}
    with pytest.raises(ConfigError, match=message) as err:
        parse_pattern(decl, {})
    assert str(err.value).startswith("table pattern ")


def test_a_pattern_is_validated_without_topics_and_gives_no_tables(tmp_path):
    path = _write(tmp_path, [_plain("p1", "plain.p1"), _pattern(r"events\..*")])
    assert [s.name for s in load_table_specs(path)] == ["p1"]
    assert [s.name for s in load_table_specs(path, lambda: None)] == ["p1"]  # the broker did not answer
    with pytest.raises(ConfigError, match="unknown fields"):
        load_table_specs(_write(tmp_path, [_pattern(r"events\..*", name="{nope}")]))


def test_topics_are_listed_only_when_a_pattern_is_declared(tmp_path):
    def fail():
        raise AssertionError("listed topics although no pattern is declared")

    assert [s.name for s in load_table_specs(_write(tmp_path, [_plain("p1", "plain.p1")]), fail)] == ["p1"]


# --- exclusions and overlaps --------------------------------------------------------------------

INTERNAL = [
    "__consumer_offsets",
    "__transaction_state",
    "_schemas",
    "__debezium-heartbeat.shop",
    "shop.debezium-heartbeat",
    "schema-changes.shop",
    "schemahistory.shop",
    "dbhistory.shop",
    "shop-schema-history",
    "shop.transaction",
    "connect-offsets",
    "connect-configs",
    "my_connect_status",
]


def test_internal_topics_are_excluded_by_default_and_exclude_adds_more():
    topics = [*INTERNAL, "shop.public.transactions", "shop.public.orders", "shop.public.orders_archive"]
    pairs = expand_entries([_pattern(".*")], {}, lambda: topics)
    assert sorted(own["topic"] for own, _ in pairs) == [
        "shop.public.orders",
        "shop.public.orders_archive",
        "shop.public.transactions",
    ]
    pairs = expand_entries([_pattern(".*", exclude=[r".*_archive"])], {}, lambda: topics)
    assert sorted(own["topic"] for own, _ in pairs) == ["shop.public.orders", "shop.public.transactions"]


def test_a_pattern_that_matches_nothing_logs_and_gives_no_tables(tmp_path, caplog):
    path = _write(tmp_path, [_plain("p1", "plain.p1"), _pattern(r"nothing\..*")])
    with caplog.at_level(logging.WARNING, logger="kafka_iceberg.declaration.patterns"):
        specs = load_table_specs(path, lambda: ["plain.p1", "events.a"])
    assert [s.name for s in specs] == ["p1"]
    assert r"table pattern 'nothing\\..*' matches none of the 2 topics" in caplog.text


def test_two_patterns_giving_one_identifier_is_an_error_naming_both(tmp_path):
    first = _pattern(r"a\.(?P<t>\w+)", name="a_{t}", identifier="x.{t}")
    second = _pattern(r"b\.(?P<t>\w+)", name="b_{t}", identifier="x.{t}")
    with pytest.raises(ConfigError) as err:
        load_table_specs(_write(tmp_path, [first, second]), lambda: ["a.orders", "b.orders", "b.items"])
    assert str(err.value) == (
        r"identifier 'x.orders' is declared twice: by table pattern 'a\\.(?P<t>\\w+)' (topic 'a.orders') "
        r"and by table pattern 'b\\.(?P<t>\\w+)' (topic 'b.orders')"
    )


def test_a_pattern_and_a_table_giving_one_identifier_is_an_error_naming_both(tmp_path):
    path = _write(
        tmp_path, [_plain("orders", "legacy.orders", "x.orders"), _pattern(r"a\.(?P<t>\w+)", identifier="x.{t}")]
    )
    with pytest.raises(
        ConfigError, match=r"identifier 'x.orders' is declared twice: by table 'orders' and by table pattern"
    ):
        load_table_specs(path, lambda: ["a.orders"])


def test_a_topic_declared_by_a_table_is_not_taken_by_a_pattern_but_two_patterns_on_one_topic_fail(tmp_path):
    path = _write(tmp_path, [_plain("special", "events.a"), _pattern(r"events\..*")])
    specs = load_table_specs(path, lambda: ["events.a", "events.b"])
    assert [(s.name, s.topic) for s in specs] == [("special", "events.a"), ("events_b", "events.b")]
    path = _write(tmp_path, [_pattern(r"events\..*"), _pattern(r"events\.b", name="b", identifier="other.b")])
    with pytest.raises(ConfigError, match=r"topic 'events.b' is declared twice: by table pattern 'events"):
        load_table_specs(path, lambda: ["events.b"])


def test_pattern_fields_merge_over_the_defaults_and_crons_from_a_pattern_are_not_pinned(tmp_path):
    defaults = {"tags": {"team": "data"}, "maintenance": {"retain_last": 7}}
    decl = _pattern(r"events\..*", tags={"src": "pattern"}, maintenance={"compact": "0 * * * *"})
    (spec,) = load_table_specs(_write(tmp_path, [decl], defaults), lambda: ["events.a"])
    assert dict(spec.tags) == {"team": "data", "src": "pattern"}
    assert spec.maintenance.compact_cron == "0 * * * *" and spec.maintenance.pinned == ()


def test_the_json_schema_accepts_a_pattern_entry():
    tables = json_schema()["properties"]["tables"]["items"]
    assert {ref["$ref"].rsplit("/", 1)[-1] for ref in tables["anyOf"]} == {"TableDecl", "TablePatternDecl"}


# --- on the dev broker --------------------------------------------------------------------------

LIST_ASSETS = textwrap.dedent(
    """
    import json
    from kafka_iceberg.lake_assets.definitions import defs
    keys = sorted("/".join(k.path) for k in defs.resolve_all_asset_keys() if k.path[0] == "lake")
    print(json.dumps(keys))
    """
)


def _load_code_location(env: dict[str, str]) -> list[str]:
    """The table asset keys of the code location imported in a fresh process (what a reload does)."""
    out = subprocess.run(
        [sys.executable, "-c", LIST_ASSETS],
        cwd=CHECKOUT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_five_topics_make_five_tables_and_a_sixth_appears_after_a_reload(lake_env, tmp_path, unique, topic_factory):
    for i in range(5):
        topic_factory(f"{unique}_{i}", partitions=1)
    decl = _pattern(rf"events\.{unique}_(?P<n>\d+)", name=f"{unique}_{{n}}", identifier=f"pat.{unique}_{{n}}")
    env = {**lake_env, "LAKE_TABLES_FILE": str(_write(tmp_path, [decl]))}
    assert _load_code_location(env) == [f"lake/pat/{unique}_{i}" for i in range(5)]

    topic_factory(f"{unique}_5", partitions=1)
    assert _load_code_location(env) == [f"lake/pat/{unique}_{i}" for i in range(6)]


def test_the_definitions_hold_each_pattern_table_with_its_checks_sensors_and_schedules(
    lake_env, tmp_path, unique, topic_factory, monkeypatch
):
    from kafka_iceberg.lake_assets.definitions import build_definitions, topic_lister

    for i in range(2):
        topic_factory(f"{unique}_{i}", partitions=1)
    path = _write(tmp_path, [_pattern(rf"events\.{unique}_\d+")])
    settings = load_settings(env={**lake_env, "LAKE_TABLES_FILE": str(path)})
    specs = load_table_specs(settings.tables_file, topic_lister(settings))
    assert [s.topic for s in specs] == [f"events.{unique}_0", f"events.{unique}_1"]
    defs = build_definitions(settings, specs)
    repo = defs.get_repository_def()
    for spec in specs:
        assert repo.asset_graph.has(AssetKey(["lake", *spec.identifier.split(".")]))
        assert (
            AssetCheckKey(AssetKey(["lake", *spec.identifier.split(".")]), "duplicate_free")
            in repo.asset_checks_defs_by_key
        )
    assert all(s.identifier in repo.get_job("lake_worker_0").description for s in specs), "one worker serves them"


def test_a_debezium_connectors_topics_become_upsert_tables_with_keys(lake_env, tmp_path, unique, kafka_config):
    from devtools.demo.data import create_topic

    server = f"dbz_{unique}"
    captured = [f"{server}.public.customers", f"{server}.public.orders", f"{server}.inventory.products"]
    internal = [f"{server}.transaction", f"__debezium-heartbeat.{server}", f"schema-changes.{server}", server]
    for topic in captured + internal:
        create_topic(kafka_config, topic, 1, {"retention.ms": "-1"})
    decl = {
        "topic_pattern": rf"{server}\.(?P<schema>[^.]+)\.(?P<table>[^.]+)",
        "name": "{schema}_{table}",
        "identifier": "cdc_" + unique + ".{schema}_{table}",
        "mode": "upsert",
        "cdc": "debezium",
        "key": ["id"],
        "schema": DEBEZIUM_SCHEMA,
    }
    from kafka_iceberg.lake_assets.definitions import topic_lister

    settings = load_settings(env={**lake_env, "LAKE_TABLES_FILE": str(_write(tmp_path, [decl]))})
    specs = load_table_specs(settings.tables_file, topic_lister(settings))
    assert [(s.identifier, s.topic) for s in specs] == [
        (f"cdc_{unique}.inventory_products", f"{server}.inventory.products"),
        (f"cdc_{unique}.public_customers", f"{server}.public.customers"),
        (f"cdc_{unique}.public_orders", f"{server}.public.orders"),
    ]
    for spec in specs:
        assert spec.upsert is not None and spec.upsert.key == ("id",) and spec.upsert.cdc == "debezium"


def test_a_broker_down_at_load_leaves_the_location_loading_without_pattern_tables(tmp_path, caplog):
    from kafka_iceberg.lake_assets.definitions import build_definitions, topic_lister

    path = _write(tmp_path, [_plain("p1", "plain.p1"), _pattern(r"events\..*")])
    env = {
        "LAKE_HOME": str(tmp_path / "lake"),
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "LAKE_KAFKA_TIMEOUT_S": "2",
        "LAKE_TABLES_FILE": str(path),
    }
    settings = load_settings(env=env)
    with caplog.at_level(logging.WARNING, logger="kafka_iceberg.lake_assets.definitions"):
        specs = load_table_specs(settings.tables_file, topic_lister(settings))
    assert [s.name for s in specs] == ["p1"]
    assert "tables from topic patterns are not loaded" in caplog.text
    assert "Reload the code location once the broker answers" in caplog.text
    assert build_definitions(settings, specs).get_repository_def().asset_graph.has(AssetKey(["lake", "plain", "p1"]))


def _change(op: str, i: int, name: str | None, lsn: int) -> tuple[bytes, bytes]:
    row = {"id": i, "name": name}
    before, after = (row, None) if op == "d" else (None, row)
    value = {"before": before, "after": after, "op": op, "source": {"lsn": lsn}}
    return json.dumps({"id": i}).encode(), json.dumps(value).encode()


def test_tables_of_a_debezium_pattern_each_apply_their_own_changes(
    tmp_path, unique, kafka_config, writer_factory, spark, settings
):
    from confluent_kafka import Producer

    from devtools.demo.data import create_topic
    from tests.helpers import table_rows

    server = f"dbz_{unique}"
    topics = [f"{server}.public.customers", f"{server}.public.orders"]
    for topic in topics:
        create_topic(kafka_config, topic, 1, {"retention.ms": "-1"})
    producer = Producer(kafka_config.client_conf())
    changes = {
        topics[0]: [_change("c", 1, "ann", 1), _change("c", 2, "bob", 2), _change("u", 1, "anna", 3)],
        topics[1]: [_change("c", 7, "o7", 1), _change("c", 8, "o8", 2), _change("d", 7, None, 3)],
    }
    for topic, records in changes.items():
        for key, value in records:
            producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0
    decl = {
        "topic_pattern": rf"{server}\.(?P<schema>[^.]+)\.(?P<table>[^.]+)",
        "name": f"{unique}_{{table}}",
        "identifier": "cdc_" + unique + ".{table}",
        "mode": "upsert",
        "cdc": "debezium",
        "key": ["id"],
        "schema": DEBEZIUM_SCHEMA,
    }
    specs = load_table_specs(_write(tmp_path, [decl]), lambda: topics)
    for spec in specs:
        writer = writer_factory(spec)
        assert writer.execute(writer.plan(), f"run-{spec.name}").committed
    rows = {s.identifier: sorted((r["id"], r["name"]) for r in table_rows(spark, settings, s)) for s in specs}
    assert rows == {
        f"cdc_{unique}.customers": [(1, "anna"), (2, "bob")],
        f"cdc_{unique}.orders": [(8, "o8")],
    }
