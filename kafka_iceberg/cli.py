"""Operator commands: ``python -m kafka_iceberg.cli <command>``.

``accept-gap --table NAME --reason TEXT``
    After data loss (records deleted by retention or ``delete_records`` before the table read
    them), move the table's committed offsets past the gap, explicitly. The gap, the reason
    and the time are written to the snapshot summary (``kafka.accepted-gaps``) and carried
    forward by every later snapshot, so it stays visible. Exit code 0 on success, 2 when there
    is nothing to accept or the table is unknown.

``status``
    Print each declared table's committed offsets, lag and accepted gaps.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid

from kafka_iceberg.catalog import get_spark, load_catalog, read_state
from kafka_iceberg.errors import LakeError
from kafka_iceberg.kafka_client import KafkaConfig, KafkaMetadata
from kafka_iceberg.pipeline import TableWriter
from kafka_iceberg.planning import offset_lag
from kafka_iceberg.settings import load_settings
from kafka_iceberg.spec import load_table_specs


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m kafka_iceberg.cli", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gap = sub.add_parser("accept-gap", help="accept records lost to retention and continue after them")
    gap.add_argument("--table", required=True, help="declared table name or identifier (e.g. flights or nyc.flights)")
    gap.add_argument("--reason", required=True, help="why the loss is accepted (kept in the snapshot summary)")
    sub.add_parser("status", help="committed offsets, lag and accepted gaps of every declared table")
    args = parser.parse_args(argv)

    settings = load_settings()
    specs = load_table_specs(settings.tables_file)
    kafka = KafkaMetadata(KafkaConfig(settings.kafka_bootstrap_servers, settings.kafka_client_config, settings.kafka_timeout_s))
    catalog = load_catalog(settings.catalog)
    if args.command == "status":
        for spec in specs:
            state = read_state(catalog, spec.identifier)
            lag = offset_lag(kafka.watermarks(spec.topic), state.offsets)
            print(json.dumps({"table": spec.identifier, "committed": state.offsets, "lag": lag,
                              "accepted_gaps": list(state.accepted_gaps)}))
        return 0
    matches = [s for s in specs if args.table in (s.name, s.identifier)]
    if not matches:
        print(f"unknown table {args.table!r}; declared: {[s.name for s in specs]}", file=sys.stderr)
        return 2
    writer = TableWriter(get_spark(settings), settings, matches[0], kafka, catalog)
    try:
        result = writer.accept_gap(commit_id=f"accept-gap-{uuid.uuid4()}", reason=args.reason)
    except LakeError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(json.dumps({"table": result.table, "snapshot_id": result.snapshot_id, "committed_offsets": result.offsets}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
