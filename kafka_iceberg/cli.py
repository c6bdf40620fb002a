"""Operator commands: ``python -m kafka_iceberg.cli <command>``.

``accept-gap --table NAME --reason TEXT``
    After data loss (records deleted by retention or ``delete_records`` before the table read
    them), move the table's committed offsets past the gap, explicitly. The gap, the reason
    and the time are written to the snapshot summary (``kafka.accepted-gaps``) and carried
    forward by every later snapshot, so it stays visible. Exit code 0 on success, 2 when there
    is nothing to accept or the table is unknown.

``status``
    Print each declared table's committed offsets, lag and accepted gaps.

``replay --table NAME (--from P:O,...|earliest | --from-time T | --from-snapshot ID) [--to P:O,... | --to-time T]
[--into NS.TABLE | --branch NAME] [--validate] [--max-records-per-partition N] [--max-batches N]``
    Replay the table's Kafka offset range ``[from, to)`` into a new table or into branch
    ``replay_<NAME>`` of the table (created at snapshot ``--from-snapshot``), in micro-batches,
    exactly once; a rerun resumes. ``--to`` defaults to the table's committed offsets. Times are
    ISO-8601 or ms since epoch. With ``--validate``, compare with the table over the same offsets.
    Prints the result as JSON. Exit code 0 on success (and a match), 1 when validation finds a
    mismatch, 2 on bad input (unknown table, malformed or impossible range, records deleted by
    retention, a conflicting target), 3 on any other failure (cluster, catalog, Spark).
    See docs/operations.md#replay-and-rebuild.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
import uuid

from kafka_iceberg.catalog import get_spark, load_catalog, read_state
from kafka_iceberg.errors import ConfigError, DataLossError, LakeError, OffsetsAheadError, TopicNotFoundError
from kafka_iceberg.kafka_client import KafkaConfig, KafkaMetadata
from kafka_iceberg.pipeline import TableWriter
from kafka_iceberg.planning import offset_lag
from kafka_iceberg.settings import load_settings
from kafka_iceberg.spec import find_table, load_table_specs


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m kafka_iceberg.cli", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gap = sub.add_parser("accept-gap", help="accept records lost to retention and continue after them")
    gap.add_argument("--table", required=True, help="declared table name or identifier (e.g. flights or nyc.flights)")
    gap.add_argument("--reason", required=True, help="why the loss is accepted (kept in the snapshot summary)")
    sub.add_parser("status", help="committed offsets, lag and accepted gaps of every declared table")
    _add_replay_parser(sub)
    args = parser.parse_args(argv)

    settings = load_settings()
    specs = load_table_specs(settings.tables_file)
    kafka = KafkaMetadata(KafkaConfig.from_settings(settings))
    catalog = load_catalog(settings.catalog)
    if args.command == "status":
        for spec in specs:
            state = read_state(catalog, spec.identifier)
            lag = offset_lag(kafka.watermarks(spec.topic), state.offsets)
            print(json.dumps({"table": spec.identifier, "committed": state.offsets, "lag": lag,
                              "accepted_gaps": list(state.accepted_gaps)}))
        return 0
    try:
        spec = find_table(specs, args.table)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if args.command == "replay":
        return _replay(args, settings, spec, [s.identifier for s in specs], kafka, catalog)
    writer = TableWriter(get_spark(settings), settings, spec, kafka, catalog)
    try:
        result = writer.accept_gap(commit_id=f"accept-gap-{uuid.uuid4()}", reason=args.reason)
    except LakeError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(json.dumps({"table": result.table, "snapshot_id": result.snapshot_id, "committed_offsets": result.offsets}))
    return 0


def _add_replay_parser(sub) -> None:
    rep = sub.add_parser("replay", help="replay a table's offset range into a new table or a branch, optionally validated")
    rep.add_argument("--table", required=True, help="declared table name or identifier (e.g. flights or nyc.flights)")
    start = rep.add_mutually_exclusive_group(required=True)
    start.add_argument("--from", dest="from_offsets", metavar="P:O,...",
                       help='start offsets per partition (only these partitions), e.g. 0:100,1:250; or "earliest"')
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


_BAD_INPUT = (ConfigError, DataLossError, OffsetsAheadError, TopicNotFoundError)


def _replay(args, settings, spec, declared: list[str], kafka, catalog) -> int:
    """The ``replay`` command; returns the exit code (0 ok, 1 mismatch, 2 bad input, 3 failure)."""
    from kafka_iceberg.replay import ReplayError, ReplayRequest, run_replay

    try:
        request = ReplayRequest.from_strings(
            from_offsets=args.from_offsets, from_time=args.from_time, from_snapshot=args.from_snapshot,
            to_offsets=args.to_offsets, to_time=args.to_time, into=args.into, branch=args.branch,
            validate=args.validate, max_records_per_partition=args.max_records_per_partition,
            max_batches=args.max_batches,
        )
        result = run_replay(get_spark(settings), settings, spec, request, kafka=kafka, catalog=catalog,
                            commit_id=f"replay-{uuid.uuid4()}", declared=declared,
                            progress=lambda line: print(line, file=sys.stderr))
    except (ReplayError, *_BAD_INPUT) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except Exception:  # noqa: BLE001 - an exit code apart from the mismatch's 1
        traceback.print_exc()
        return 3
    print(json.dumps(result.to_dict(settings.catalog.name)))
    return 1 if result.validation is not None and not result.validation.valid else 0


if __name__ == "__main__":
    sys.exit(main())
