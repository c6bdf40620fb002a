"""Where a consistency group's micro-batch may end: at a source transaction boundary, from Debezium's
transaction metadata (``provide.transaction.metadata``).

Debezium writes a BEGIN and an END event per source transaction to ``<prefix>.transaction``; the END
carries the transaction ``id`` and its ``event_count`` per ``data_collection`` (``public.orders``).
Every change event carries ``transaction: {"id", "total_order", "data_collection_order"}``; snapshot
reads carry none. The PostgreSQL connector writes ids as ``<xid>:<lsn>`` with the LSN of the event at
hand, so one transaction's BEGIN, change events and END carry different ids (``734:30731744``,
``734:30731976``, ``734:30740168``): a transaction is known by :func:`transaction_key`, its xid there. The END events are in commit order, and on each partition of a change topic a
transaction's events precede those of every transaction committed after it.

:func:`plan_group_cut` is pure: given the END events read after the group's committed position and the
transaction ids of the change events in each member's scanned offset ranges, it returns per member
partition the end offset that splits no transaction: the longest prefix of ENDs whose events were all
read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kafka_iceberg.errors import LakeError

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class TransactionEnd:
    """One END event of the transaction topic: transaction ``id``, where it was read (``partition``,
    ``offset`` of the transaction topic) and ``counts``: data collection (``schema.table``) -> change
    events (records) the transaction wrote to it."""

    id: str
    partition: int
    offset: int
    counts: Mapping[str, int]


@dataclass(frozen=True)
class GroupCut:
    """Where a group's micro-batch ends. ``ends``: (topic, partition) -> end offset (exclusive) for every
    scanned partition; ``transactions``: the transactions included, in commit order; ``position``: the
    transaction topic's next offset per partition after them (the group's new source position, the
    given ``start`` where none was included); ``waiting_for``: the first transaction whose change events
    were not all read (None when every END was included)."""

    ends: Mapping[TopicPartition, int]
    transactions: tuple[str, ...]
    position: Mapping[int, int]
    waiting_for: str | None


_PG_ID = re.compile(r"(\d+):\d+")


def transaction_key(txid: str) -> str:
    """What identifies a source transaction in a Debezium transaction id: the xid of a PostgreSQL id
    ``<xid>:<lsn>`` (its LSN part is the LSN of each event, so it differs between the BEGIN, the change
    events and the END of one transaction); any other id (MySQL GTID or binlog position, SQL Server,
    Oracle) whole."""
    match = _PG_ID.fullmatch(txid)
    return match.group(1) if match else txid


def parse_end(value: Mapping | None, partition: int, offset: int) -> TransactionEnd | None:
    """The :class:`TransactionEnd` of a transaction-topic record value (a decoded JSON object, with or
    without the ``{"schema", "payload"}`` wrapper); None for a BEGIN event or an empty value. Its ``id``
    is the :func:`transaction_key` of the event's id."""
    payload = _payload(value)
    if not payload or str(payload.get("status", "")).upper() != "END":
        return None
    counts = {str(c["data_collection"]): int(c["event_count"]) for c in payload.get("data_collections") or ()}
    return TransactionEnd(transaction_key(str(payload["id"])), partition, offset, counts)


def change_transaction(value: Mapping | None) -> str | None:
    """The :func:`transaction_key` of the ``transaction.id`` of a Debezium change event value (decoded
    JSON, wrapped or not); None for an event outside a transaction (snapshot reads) or a tombstone."""
    payload = _payload(value)
    block = (payload or {}).get("transaction")
    if not isinstance(block, Mapping) or block.get("id") is None:
        return None
    return transaction_key(str(block["id"]))


def _payload(value: Mapping | None) -> Mapping | None:
    if isinstance(value, Mapping) and "payload" in value and "schema" in value:
        return value["payload"]
    return value


def plan_group_cut(
    prefix: str,
    ends: Sequence[TransactionEnd],
    changes: Mapping[TopicPartition, Sequence[tuple[int, str | None]]],
    scanned: Mapping[TopicPartition, tuple[int, int]],
    start: Mapping[int, int],
) -> GroupCut:
    """The end offsets of a group's micro-batch that split no source transaction.

    Args:
        prefix: the Debezium topic prefix; data collection ``s.t`` is topic ``<prefix>.s.t``.
        ends: END events read after the group's committed position, in transaction-topic order.
        changes: (topic, partition) -> (offset, transaction id or None) of each change event read, in
            offset order, from the member's committed offset.
        scanned: (topic, partition) -> the half-open offset range ``changes`` covers (offsets).
        start: the transaction topic's committed next offset per partition.

    Raises:
        LakeError: a partition holds an event of an included transaction after one of a transaction
            that is not included (the source order Debezium guarantees is broken).
    """
    seen: dict[str, dict[str, int]] = {}
    for (topic, _p), events in changes.items():
        for _offset, txid in events:
            if txid is not None:
                per = seen.setdefault(txid, {})
                per[topic] = per.get(topic, 0) + 1
    included: list[TransactionEnd] = []
    waiting_for = None
    for end in ends:
        wanted = {f"{prefix}.{c}": n for c, n in end.counts.items() if f"{prefix}.{c}" in _topics(scanned)}
        if any(seen.get(end.id, {}).get(topic, 0) < n for topic, n in wanted.items()):
            waiting_for = end.id
            break
        included.append(end)
    ids = {e.id for e in included}
    cut = {tp: _cut(tp, changes.get(tp, ()), scanned[tp][1], ids) for tp in scanned}
    position = dict(start)
    for end in included:
        position[end.partition] = max(position.get(end.partition, 0), end.offset + 1)
    return GroupCut(cut, tuple(e.id for e in included), position, waiting_for)


def _topics(scanned: Mapping[TopicPartition, tuple[int, int]]) -> set[str]:
    return {topic for topic, _p in scanned}


def _cut(tp: TopicPartition, events: Sequence[tuple[int, str | None]], scanned_end: int, ids: set[str]) -> int:
    """The first offset of ``events`` whose transaction is not included (``scanned_end`` if none)."""
    for n, (offset, txid) in enumerate(events):
        if txid is not None and txid not in ids:
            late = [o for o, t in events[n:] if t in ids]
            if late:
                raise LakeError(
                    f"{tp[0]}[{tp[1]}]: offset {late[0]} belongs to a transaction committed before the one at "
                    f"offset {offset}; the change events are not in source commit order"
                )
            return offset
    return scanned_end


__all__ = ["GroupCut", "TransactionEnd", "change_transaction", "parse_end", "plan_group_cut", "transaction_key"]
