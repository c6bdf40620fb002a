"""``lake``: the one operator command (``[project.scripts]``; also ``python -m kafka_iceberg.lake_assets.cli``).

Subcommands (``lake <command> --help`` for each; every one takes ``--json`` for JSON lines on stdout)::

    lake status                          committed offsets, lag and lag verdict of every table
    lake tables                          the declared tables (no I/O beyond the declarations)
    lake validate [--file F] [--json-schema [OUT]]   check the declarations; print/write their JSON Schema
    lake backfill --table T [--batches N] [--force] [--wait S] [--url URL]   a Dagster backfill
    lake replay --table T --from ... [--into ... | --branch ...] [--validate]
    lake accept-gap --table T --reason TEXT [--yes]    accept records lost to retention (asks first)
    lake --version

Exit codes, the same for every subcommand:

====  ==========================================================================
0     done
1     a finding (a replay that does not match, a table that lags past its cadence,
      a backfill that did not succeed, an accept-gap not confirmed) or an unexpected
      error (one line naming a log file that holds the traceback)
2     bad input: tables.yaml, settings or arguments (unknown table, bad range)
3     a component unreachable: Kafka broker, Iceberg catalog, schema registry
130   interrupted (Ctrl-C)
====  ==========================================================================

Errors print one line on stderr, no traceback (``--debug`` shows it); with ``--json``
stdout also gets ``{"error": ..., "message": ..., "exit_code": ...}``. See
docs/operations.md#the-lake-command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

from kafka_iceberg.batch.planning import offset_lag
from kafka_iceberg.config.settings import load_settings
from kafka_iceberg.declaration.models import json_schema
from kafka_iceberg.declaration.spec import find_table, load_table_specs
from kafka_iceberg.errors import LakeError
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata
from kafka_iceberg.lake_assets.cli_support import (
    BAD_INPUT,
    FINDING,
    INTERRUPTED,
    OK,
    UNREACHABLE,
    confirm,
    emit,
    exit_code_for,
    fail,
    log_warnings_as_lines,
    version,
)

__all__ = ["BAD_INPUT", "FINDING", "INTERRUPTED", "OK", "UNREACHABLE", "main", "parser"]


def parser() -> argparse.ArgumentParser:
    """The ``lake`` argument parser with every subcommand (each takes ``--json``)."""
    top = argparse.ArgumentParser(
        prog="lake",
        description="Operate the Kafka -> Iceberg lake. Exit codes: 0 done, "
        "1 finding or unexpected error, 2 bad input, 3 component unreachable, 130 interrupted.",
    )
    top.add_argument("--version", action="version", version=f"lake (kafka-iceberg-lake) {version()}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output: JSON lines on stdout")
    common.add_argument("--debug", action="store_true", help="print tracebacks and librdkafka's connection log")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser(
        "status",
        parents=[common],
        help="committed offsets, lag and lag verdict of every declared table (exit 1: a table lags "
        "past max_interval + grace)",
    )
    sub.add_parser("tables", parents=[common], help="the declared tables: name, identifier, topic, owners, tags")
    val = sub.add_parser("validate", parents=[common], help="check the declarations without starting anything")
    val.add_argument(
        "--file",
        type=Path,
        help="tables file (default: LAKE_TABLES_FILE, else the Component instances of LAKE_DEFS_MODULE)",
    )
    val.add_argument(
        "--json-schema",
        nargs="?",
        const="-",
        metavar="OUT",
        help="print the JSON Schema of tables.yaml (or write it to OUT)",
    )
    bf = sub.add_parser(
        "backfill", parents=[common], help="a Dagster backfill of micro-batches for one table, one run each"
    )
    bf.add_argument("--table", required=True, help="declared table name or identifier (flights or nyc.flights)")
    bf.add_argument("--batches", type=int, help="micro-batches (runs) to backfill; default: what the lag needs")
    bf.add_argument("--force", action="store_true", help="submit even if a run or backfill of the table is in progress")
    bf.add_argument("--wait", type=float, metavar="SECONDS", help="wait up to SECONDS for the backfill to end")
    bf.add_argument(
        "--url",
        metavar="URL",
        help="submit through the Dagster webserver's GraphQL API at URL (e.g. http://127.0.0.1:3000) "
        "instead of the instance at $DAGSTER_HOME",
    )
    gap = sub.add_parser(
        "accept-gap", parents=[common], help="accept records lost to retention and continue after them"
    )
    gap.add_argument("--table", required=True, help="declared table name or identifier (e.g. flights or nyc.flights)")
    gap.add_argument("--reason", required=True, help="why the loss is accepted (kept in the snapshot summary)")
    gap.add_argument("--yes", action="store_true", help="confirm without asking (required without a terminal)")
    _add_replay_parser(sub, common)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the process exit code (see the module docstring). From the console
    (``argv`` None), Ctrl-C ends the process at once with 130 after its one line: the Kafka client's and the
    catalog's background threads are not awaited."""
    args = parser().parse_args(argv)
    log_warnings_as_lines()
    as_json, debug = getattr(args, "json", False), getattr(args, "debug", False)
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        code = fail(KeyboardInterrupt("interrupted (Ctrl-C)"), INTERRUPTED, as_json, debug)
        if argv is None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback (--debug or the error log has it)
        return fail(exc, exit_code_for(exc), as_json, debug)


def quiet_kafka(settings, debug: bool = False):
    """A :class:`~kafka_iceberg.kafka.admin.KafkaMetadata` whose librdkafka log lines (one per
    failed connection attempt) go to the ``lake.librdkafka`` logger, silent unless ``debug`` (``--debug``)."""
    import dataclasses
    import logging

    log = logging.getLogger("lake.librdkafka")
    log.propagate, log.disabled = debug, not debug
    config = KafkaConfig.from_settings(settings)
    return KafkaMetadata(dataclasses.replace(config, client_config={**config.client_config, "logger": log}))


def _settings_and_specs(path: Path | None = None):

    settings = load_settings()
    if path:
        return settings, load_table_specs(path)
    # the Component type builds the table assets, whose modules import pyspark
    from kafka_iceberg.lake_assets.component import declared_specs

    return settings, declared_specs(settings)


def _validate(args) -> int:
    if args.json_schema:
        text = json.dumps(json_schema(), indent=2) + "\n"
        if args.json_schema == "-":
            sys.stdout.write(text)
        else:
            Path(args.json_schema).write_text(text)
            if args.json:
                emit({"json_schema": args.json_schema})
        return OK
    settings, specs = _settings_and_specs(args.file)
    where = args.file or settings.tables_file or f"the KafkaIcebergTables instances of {settings.defs_module}"
    if args.json:
        emit({"file": str(where), "valid": True, "tables": [s.name for s in specs]})
    else:
        print(f"{where}: {len(specs)} tables valid: {', '.join(s.name for s in specs)}")
    return OK


def _tables(args) -> int:
    _, specs = _settings_and_specs()
    for s in specs:
        row = {
            "name": s.name,
            "identifier": s.identifier,
            "topic": s.topic,
            "owners": list(s.owners),
            "tags": dict(s.tags),
            "max_records_per_partition": s.max_records_per_partition,
            "max_interval_s": s.lag.max_interval_s,
        }
        if args.json:
            emit(row)
        else:
            owners = ", ".join(row["owners"]) or "-"
            print(f"{s.name:<16} {s.identifier:<28} topic {s.topic}  owners {owners}")
    return OK


def _status(args) -> int:
    """One line per table (a JSON line with ``--json``); exit 1 when a table has lag and no
    commit for max_interval + grace."""
    # imported here: it imports pyspark, which `lake tables` and `lake validate` do not need
    from kafka_iceberg.catalog.tables import load_catalog, read_state

    settings, specs = _settings_and_specs()
    kafka = quiet_kafka(settings, args.debug)
    catalog = load_catalog(settings.catalog, settings.catalog_retry_s)
    code, now_ms = OK, int(time.time() * 1000)
    for spec in specs:
        state = read_state(catalog, spec.identifier)
        lag = offset_lag(kafka.watermarks(spec.topic), state.offsets)
        since = None if state.snapshot_timestamp_ms is None else round((now_ms - state.snapshot_timestamp_ms) / 1000, 1)
        late = sum(lag.values()) > 0 and (since is None or since > spec.lag.max_interval_s + spec.lag.grace_s)
        code = FINDING if late else code
        row = {
            "table": spec.identifier,
            "verdict": "STOP" if late else "OK",
            "committed": state.offsets,
            "lag": lag,
            "since_last_commit_s": since,
            "accepted_gaps": list(state.accepted_gaps),
        }
        if args.json:
            emit(row)
        else:
            ago = "never committed" if since is None else f"last commit {since} s ago"
            print(f"{spec.identifier:<28} {row['verdict']:<4} lag {sum(lag.values())} records, {ago}")
    return code


def _find(args):
    settings, specs = _settings_and_specs()
    return settings, specs, find_table(specs, args.table)


def lost_ranges(watermarks: dict, committed: dict) -> dict[int, tuple[int, int]]:
    """``{partition: (committed offset, log start offset)}`` where retention deleted unread records."""
    lost = {}
    for p, marks in watermarks.items():
        offset = committed.get(p, committed.get(str(p)))
        if offset is not None and offset < marks.low:
            lost[p] = (offset, marks.low)
    return lost


def _confirm_gap(args, settings, spec) -> bool:
    """Show what accept-gap gives up and ask (``--yes`` skips); reads the broker and the catalog only."""
    # imported here: it imports pyspark, which `lake tables` and `lake validate` do not need
    from kafka_iceberg.catalog.tables import load_catalog, read_state

    marks = quiet_kafka(settings, args.debug).watermarks(
        spec.topic
    )  # fails fast (exit 3) before Spark when the broker is down
    lost = lost_ranges(
        marks, read_state(load_catalog(settings.catalog, settings.catalog_retry_s), spec.identifier).offsets
    )
    ranges = ", ".join(f"partition {p} offsets {a}..{b - 1} ({b - a} records)" for p, (a, b) in lost.items())
    question = (
        f"{spec.identifier}: accept as lost {ranges or 'no records (nothing below the log start offsets now)'}, "
        f"reason {args.reason!r}? The table then continues after them; this cannot be undone."
    )
    return confirm(question, args.yes)


def _accept_gap(args) -> int:
    # imported here: it imports pyspark, which `lake tables` and `lake validate` do not need
    from kafka_iceberg.batch.pipeline import TableWriter
    from kafka_iceberg.catalog.spark import get_spark
    from kafka_iceberg.catalog.tables import load_catalog

    settings, _, spec = _find(args)
    if not _confirm_gap(args, settings, spec):
        print("lake: not confirmed; nothing accepted", file=sys.stderr)
        return FINDING
    kafka = KafkaMetadata(KafkaConfig.from_settings(settings))
    catalog = load_catalog(settings.catalog, settings.catalog_retry_s)
    writer = TableWriter(get_spark(settings), settings, spec, kafka, catalog)
    try:
        result = writer.accept_gap(commit_id=f"accept-gap-{uuid.uuid4()}", reason=args.reason)
    except LakeError as exc:  # nothing to accept, no reason: the operator's input (unless unreachable)
        return fail(exc, exit_code_for(exc), args.json)
    row = {"table": result.table, "snapshot_id": result.snapshot_id, "committed_offsets": result.offsets}
    if args.json:
        emit(row)
    else:
        print(f"{result.table}: gap accepted in snapshot {result.snapshot_id}; committed offsets {result.offsets}")
    return OK


def _backfill(args) -> int:
    # imported here: it imports pyspark, which `lake tables` and `lake validate` do not need
    from kafka_iceberg.lake_assets.backfill_cli import backfill_command

    settings, _, spec = _find(args)
    return backfill_command(
        settings,
        spec,
        batches=args.batches,
        force=args.force,
        wait_s=args.wait,
        kafka=quiet_kafka(settings, args.debug),
        url=args.url,
        as_json=args.json,
    )


def _add_replay_parser(sub, common) -> None:
    rep = sub.add_parser(
        "replay",
        parents=[common],
        help="replay a table's offset range into a new table or a branch, optionally validated",
    )
    rep.add_argument("--table", required=True, help="declared table name or identifier (e.g. flights or nyc.flights)")
    start = rep.add_mutually_exclusive_group(required=True)
    start.add_argument(
        "--from",
        dest="from_offsets",
        metavar="P:O,...",
        help='start offsets per partition (only these partitions), e.g. 0:100,1:250; or "earliest"',
    )
    start.add_argument("--from-time", metavar="TIME", help="start time: ISO-8601 or ms since epoch")
    start.add_argument("--from-snapshot", metavar="ID", help="snapshot of main whose committed offsets are the start")
    end = rep.add_mutually_exclusive_group()
    end.add_argument("--to", dest="to_offsets", metavar="P:O,...", help="exclusive end offsets (default: the table's)")
    end.add_argument("--to-time", metavar="TIME", help="exclusive end time: ISO-8601 or ms since epoch")
    target = rep.add_mutually_exclusive_group()
    target.add_argument("--into", metavar="NS.TABLE", help="new table (default <ns>.<table>_replay_<digest>)")
    target.add_argument("--branch", metavar="NAME", help="branch replay_<NAME> of the table, from --from-snapshot")
    rep.add_argument("--validate", action="store_true", help="compare with the table over the same offsets")
    rep.add_argument("--max-records-per-partition", type=int, metavar="N", help="offsets per partition per micro-batch")
    rep.add_argument("--max-batches", type=int, metavar="N", help="stop after N micro-batches (a rerun resumes)")


def _replay(args) -> int:
    """The ``replay`` command (0 ok, 1 mismatch, 2 bad input, 3 unreachable); see docs/operations.md#replay-and-rebuild."""
    # imported here: it imports pyspark, which `lake tables` and `lake validate` do not need
    from kafka_iceberg.catalog.spark import get_spark
    from kafka_iceberg.catalog.tables import load_catalog
    from kafka_iceberg.replay import ReplayError, ReplayRequest, run_replay

    settings, specs, spec = _find(args)
    quiet_kafka(settings, args.debug).watermarks(
        spec.topic
    )  # fail fast (exit 3) before starting Spark when the broker is down
    kafka = KafkaMetadata(KafkaConfig.from_settings(settings))
    catalog = load_catalog(settings.catalog, settings.catalog_retry_s)
    try:
        request = ReplayRequest.from_strings(
            from_offsets=args.from_offsets,
            from_time=args.from_time,
            from_snapshot=args.from_snapshot,
            to_offsets=args.to_offsets,
            to_time=args.to_time,
            into=args.into,
            branch=args.branch,
            validate=args.validate,
            max_records_per_partition=args.max_records_per_partition,
            max_batches=args.max_batches,
        )
        result = run_replay(
            get_spark(settings),
            settings,
            spec,
            request,
            kafka=kafka,
            catalog=catalog,
            commit_id=f"replay-{uuid.uuid4()}",
            declared=[s.identifier for s in specs],
            progress=lambda line: print(line, file=sys.stderr),
        )
    except ReplayError as exc:
        return fail(exc, BAD_INPUT, args.json)
    found = result.to_dict(settings.catalog.name)
    if args.json:
        emit(found)
    else:
        for key, value in found.items():
            print(f"{key}: {json.dumps(value, default=str) if isinstance(value, (dict, list)) else value}")
    return FINDING if result.validation is not None and not result.validation.valid else OK


COMMANDS = {
    "status": _status,
    "tables": _tables,
    "validate": _validate,
    "backfill": _backfill,
    "accept-gap": _accept_gap,
    "replay": _replay,
}


if __name__ == "__main__":
    sys.exit(main())
