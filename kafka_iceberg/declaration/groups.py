"""Consistency groups in the declaration (``consistency_group:``, docs/cdc.md#consistency-groups): the
Debezium tables of one source whose micro-batches end at a source transaction boundary and commit
together. No Spark."""

from __future__ import annotations

from collections.abc import Sequence

from kafka_iceberg.errors import ConfigError


def group_of(spec) -> str | None:
    """The consistency group of a table spec (a :class:`~kafka_iceberg.declaration.spec.TableSpec`), or None."""
    return spec.upsert.consistency_group if spec.upsert is not None else None


def source_prefix(topic: str) -> str:
    """The Debezium topic prefix of a change-event topic ``<prefix>.<schema>.<table>`` (``shop`` for
    ``shop.public.orders``); the topic itself when it has fewer than three parts."""
    parts = topic.split(".")
    return ".".join(parts[:-2]) if len(parts) >= 3 else topic


def transaction_topic(prefix: str) -> str:
    """The topic Debezium writes its transaction metadata to (``provide.transaction.metadata``) for
    the connector of topic prefix ``prefix``: ``<prefix>.transaction``."""
    return f"{prefix}.transaction"


def groups(specs: Sequence) -> dict[str, list]:
    """Group name -> its member specs, in declaration order."""
    out: dict[str, list] = {}
    for spec in specs:
        name = group_of(spec)
        if name is not None:
            out.setdefault(name, []).append(spec)
    return out


def member_identifiers(specs: Sequence) -> dict[str, tuple[str, ...]]:
    """Group name -> the identifiers of its member tables, in declaration order (:func:`groups`)."""
    return {name: tuple(s.identifier for s in members) for name, members in groups(specs).items()}


def assignment_units(specs: Sequence) -> list[list]:
    """``specs`` as the units a worker assignment deals out, sorted by their first identifier: each
    consistency group's members together (one worker serves a group), every other table alone."""
    units: dict[str, list] = {}
    for spec in sorted(specs, key=lambda s: s.identifier):
        units.setdefault(f"group:{group_of(spec)}" if group_of(spec) else spec.identifier, []).append(spec)
    return sorted(units.values(), key=lambda unit: unit[0].identifier)


def check_groups(specs: Sequence, where: str) -> None:
    """ConfigError (prefixed ``where``) when a group's members are not of one Debezium source (their
    topics' prefixes differ). Each member is already checked to be ``mode: upsert`` with ``cdc: debezium``."""
    for name, members in groups(specs).items():
        prefixes = sorted({source_prefix(s.topic) for s in members})
        if len(prefixes) > 1:
            raise ConfigError(
                f"{where}: consistency_group {name!r} mixes Debezium sources (topic prefixes {prefixes}); "
                "a group's tables come from one connector"
            )


__all__ = [
    "assignment_units",
    "check_groups",
    "group_of",
    "groups",
    "member_identifiers",
    "source_prefix",
    "transaction_topic",
]
