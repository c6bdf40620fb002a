"""``lake``: the one operator command (``[project.scripts]``; also ``python -m kafka_iceberg.lake_assets.cli``).

Subcommands (``lake <command> --help`` for each)::

    lake status                          committed offsets, lag and lag verdict of every table
    lake tables                          the declared tables (no I/O beyond the declarations)
    lake validate [--file F] [--json-schema [OUT]]   check the declarations; print/write their JSON Schema
    lake backfill --table T [--batches N] [--force] [--wait S]   a Dagster backfill of micro-batches
    lake replay --table T --from ... [--into ... | --branch ...] [--validate]
    lake accept-gap --table T --reason TEXT            accept records lost to retention

Exit codes, the same for every subcommand:

====  ==========================================================================
0     done
1     a finding: a replay that does not match, a table that lags past its cadence,
      a backfill that did not succeed
2     bad input: tables.yaml, settings or arguments (unknown table, bad range)
3     a component unreachable: Kafka broker, Iceberg catalog, schema registry
====  ==========================================================================

Errors print one line on stderr, no traceback (``LAKE_DEBUG=1`` shows it). See
docs/operations.md#the-lake-command.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
import uuid
from pathlib import Path

from kafka_iceberg.batch.planning import offset_lag
from kafka_iceberg.config.settings import (
    debug_enabled,  # not load_settings: it may be what failed
    load_settings,
)
from kafka_iceberg.declaration.models import json_schema
from kafka_iceberg.declaration.spec import find_table, load_table_specs
from kafka_iceberg.errors import (
    BrokerUnavailableError,
    CatalogUnavailableError,
    ConfigError,
    DataLossError,
    LakeError,
    OffsetsAheadError,
    TopicNotFoundError,
)
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata

OK, FINDING, BAD_INPUT, UNREACHABLE = 0, 1, 2, 3
UNREACHABLE_ERRORS: tuple[type[BaseException], ...] = (BrokerUnavailableError, CatalogUnavailableError)
BAD_INPUT_ERRORS: tuple[type[BaseException], ...] = (ConfigError, DataLossError, OffsetsAheadError, TopicNotFoundError)


def parser() -> argparse.ArgumentParser:
    """The ``lake`` argument parser with every subcommand."""
    top = argparse.ArgumentParser(
        prog="lake",
        description="Operate the Kafka -> Iceberg lake. Exit codes: 0 done, "
        "1 finding, 2 bad input, 3 component unreachable.",
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser(
        "status",
        help="committed offsets, lag and lag verdict of every declared table (exit 1: a table lags "
        "past max_interval + grace)",
    )
    sub.add_parser("tables", help="the declared tables: name, identifier, topic, owners, tags")
    val = sub.add_parser("validate", help="check tables.yaml without starting anything")
    val.add_argument(
        "--file",
        type=Path,
        help="tables file (default: LAKE_TABLES_FILE, else the Component instances of kafka_iceberg/defs)",
    )
    val.add_argument(
        "--json-schema",
        nargs="?",
        const="-",
        metavar="OUT",
        help="print the JSON Schema of tables.yaml (or write it to OUT)",
    )
    bf = sub.add_parser("backfill", help="a Dagster backfill of micro-batches for one table, one run each")
    bf.add_argument("--table", required=True, help="declared table name or identifier (flights or nyc.flights)")
    bf.add_argument("--batches", type=int, help="micro-batches (runs) to backfill; default: what the lag needs")
    bf.add_argument("--force", action="store_true", help="submit even if a run or backfill of the table is in progress")
    bf.add_argument("--wait", type=float, metavar="SECONDS", help="wait up to SECONDS for the backfill to end")
    gap = sub.add_parser("accept-gap", help="accept records lost to retention and continue after them")
    gap.add_argument("--table", required=True, help="declared table name or identifier (e.g. flights or nyc.flights)")
    gap.add_argument("--reason", required=True, help="why the loss is accepted (kept in the snapshot summary)")
    _add_replay_parser(sub)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the process exit code (see the module docstring)."""
    args = parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UNREACHABLE_ERRORS as exc:
        return _fail(exc, UNREACHABLE)
    except BAD_INPUT_ERRORS as exc:
        return _fail(exc, BAD_INPUT)
    except KeyboardInterrupt:
        return _fail(RuntimeError("interrupted"), UNREACHABLE)
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback; LAKE_DEBUG=1 shows it
        return _fail(exc, UNREACHABLE if _is_connection_error(exc) else BAD_INPUT if isinstance(exc, LakeError) else 3)


def _is_connection_error(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, (ConnectionError, TimeoutError, *UNREACHABLE_ERRORS)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _fail(exc: BaseException, code: int) -> int:

    if debug_enabled():
        traceback.print_exception(exc)
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    label = {UNREACHABLE: "unreachable", BAD_INPUT: "bad input"}.get(code, "error")
    print(f"lake: {label}: {first}", file=sys.stderr)
    return code


def quiet_kafka(settings):
    """A :class:`~kafka_iceberg.kafka.admin.KafkaMetadata` whose librdkafka log lines (one per
    failed connection attempt) go to the ``lake.librdkafka`` logger, silent unless ``LAKE_DEBUG``."""
    import dataclasses
    import logging

    log = logging.getLogger("lake.librdkafka")
    log.propagate, log.disabled = settings.debug, not settings.debug
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
        return OK
    settings, specs = _settings_and_specs(args.file)
    where = args.file or settings.tables_file or "the KafkaIcebergTables instances of kafka_iceberg.defs"
    print(f"{where}: {len(specs)} tables valid: {', '.join(s.name for s in specs)}")
    return OK


def _tables(args) -> int:
    _, specs = _settings_and_specs()
    for s in specs:
        print(
            json.dumps(
                {
                    "name": s.name,
                    "identifier": s.identifier,
                    "topic": s.topic,
                    "owners": list(s.owners),
                    "tags": dict(s.tags),
                    "max_records_per_partition": s.max_records_per_partition,
                    "max_interval_s": s.lag.max_interval_s,
                }
            )
        )
    return OK


def _status(args) -> int:
    """One JSON line per table; exit 1 when a table has lag and no commit for max_interval + grace."""
    # imported here: it imports pyspark, which `lake tables` and `lake validate` do not need
    from kafka_iceberg.catalog.tables import load_catalog, read_state

    settings, specs = _settings_and_specs()
    kafka = quiet_kafka(settings)
    catalog = load_catalog(settings.catalog)
    code, now_ms = OK, int(time.time() * 1000)
    for spec in specs:
        state = read_state(catalog, spec.identifier)
        lag = offset_lag(kafka.watermarks(spec.topic), state.offsets)
        since = None if state.snapshot_timestamp_ms is None else round((now_ms - state.snapshot_timestamp_ms) / 1000, 1)
        late = sum(lag.values()) > 0 and (since is None or since > spec.lag.max_interval_s + spec.lag.grace_s)
        code = FINDING if late else code
        print(
            json.dumps(
                {
                    "table": spec.identifier,
                    "verdict": "STOP" if late else "OK",
                    "committed": state.offsets,
                    "lag": lag,
                    "since_last_commit_s": since,
                    "accepted_gaps": list(state.accepted_gaps),
                }
            )
        )
    return code


def _find(args):

    settings, specs = _settings_and_specs()
    return settings, specs, find_table(specs, args.table)


def _accept_gap(args) -> int:
    # imported here: it imports pyspark, which `lake tables` and `lake validate` do not need
    from kafka_iceberg.batch.pipeline import TableWriter
    from kafka_iceberg.catalog.spark import get_spark
    from kafka_iceberg.catalog.tables import load_catalog

    settings, _, spec = _find(args)
    quiet_kafka(settings).watermarks(spec.topic)  # fail fast (exit 3) before starting Spark when the broker is down
    kafka = KafkaMetadata(KafkaConfig.from_settings(settings))
    catalog = load_catalog(settings.catalog)
    writer = TableWriter(get_spark(settings), settings, spec, kafka, catalog)
    try:
        result = writer.accept_gap(commit_id=f"accept-gap-{uuid.uuid4()}", reason=args.reason)
    except UNREACHABLE_ERRORS:
        raise
    except LakeError as exc:  # nothing to accept, no reason: the operator's input
        return _fail(exc, BAD_INPUT)
    print(json.dumps({"table": result.table, "snapshot_id": result.snapshot_id, "committed_offsets": result.offsets}))
    return OK


def _backfill(args) -> int:
    # imported here: it imports pyspark, which `lake tables` and `lake validate` do not need
    from kafka_iceberg.lake_assets.backfill import backfill_command

    settings, _, spec = _find(args)
    return backfill_command(
        settings, spec, batches=args.batches, force=args.force, wait_s=args.wait, kafka=quiet_kafka(settings)
    )


def _add_replay_parser(sub) -> None:
    rep = sub.add_parser(
        "replay", help="replay a table's offset range into a new table or a branch, optionally validated"
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
    quiet_kafka(settings).watermarks(spec.topic)  # fail fast (exit 3) before starting Spark when the broker is down
    kafka = KafkaMetadata(KafkaConfig.from_settings(settings))
    catalog = load_catalog(settings.catalog)
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
        return _fail(exc, BAD_INPUT)
    print(json.dumps(result.to_dict(settings.catalog.name)))
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
