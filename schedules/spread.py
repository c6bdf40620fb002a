"""Maintenance schedules spread over time, so a hundred tables never compact in the same minute.
Plain Python, no Dagster.

Each table gets a slot, a (minute offset 0-59, hour offset 0-23) pair, from the SHA-256 of its
identifier. The minutes are then evened out over all the tables loaded together: taken in hash
order, a table whose minute already holds ``ceil(tables / 60) + 1`` tables moves to the next minute
with room, and tables sharing a minute get distinct hours the same way. The slots are the same on
every load of the same tables; a table added or removed moves only tables whose minute was full.

A cron is spread by its table's slot within its own period: every minute of its minute field moves
by the minute offset (modulo 60) and, when the hour field names hours (a daily, weekly or monthly
cron), every hour moves by the hour offset (modulo 24; a time that passes midnight stays on the
declared day). A minute or hour field of ``*`` is kept, and so are day, month and weekday. All
crons of one table move by the same offsets, so its jobs keep their order and gaps (compact at
02:00 and expire at 03:00 become e.g. 13:41 and 14:41). Crons a table pins (declares on itself:
``MaintenancePolicy.pinned``) run exactly as written.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

from croniter import croniter

from kafka_iceberg.declaration.spec import TableSpec

CRONS = {
    "compact": "compact",
    "expire_snapshots": "expire",
    "remove_orphan_files": "remove_orphans",
    "full_check": "full_check",
}
"""Scheduled job kind -> its ``maintenance:`` declaration field (the cron is ``MaintenancePolicy.<field>_cron``)."""


def _hash(identifier: str) -> int:
    return int.from_bytes(hashlib.sha256(identifier.encode()).digest()[:8], "big")


def spread_slots(identifiers: Iterable[str]) -> dict[str, tuple[int, int]]:
    """Per identifier, its (minute offset 0-59, hour offset 0-23): the hash's, unless that minute
    already holds ``ceil(n / 60) + 1`` of the ``n`` tables (then the next minute with room), and an
    hour no earlier table of the same minute has (while there are hours left)."""
    ids = sorted(set(identifiers), key=lambda i: (_hash(i), i))
    cap = math.ceil(len(ids) / 60) + 1
    minutes: dict[int, list[int]] = {}
    slots = {}
    for ident in ids:
        h = _hash(ident)
        minute = h % 60
        while len(minutes.get(minute, ())) >= cap:
            minute = (minute + 1) % 60
        hours = minutes.setdefault(minute, [])
        hour = (h // 60) % 24
        for _ in range(24 if len(hours) < 24 else 0):
            if hour not in hours:
                break
            hour = (hour + 1) % 24
        hours.append(hour)
        slots[ident] = (minute, hour)
    return slots


def _shift(values: list, by: int, modulo: int) -> str:
    if values == ["*"]:
        return "*"
    return ",".join(str(v) for v in sorted({(int(v) + by) % modulo for v in values}))


def spread_cron(cron: str, slot: tuple[int, int]) -> str:
    """``cron`` (five fields, UTC) moved by ``slot`` (minute, hour offsets) within its period
    (``0 2 * * *`` by (41, 11) -> ``41 13 * * *``; ``*/15 * * * *`` -> ``11,26,41,56 * * * *``)."""
    expanded = croniter.expand(cron)[0]
    fields = cron.split()
    fields[0] = _shift(expanded[0], slot[0], 60)
    fields[1] = _shift(expanded[1], slot[1], 24)
    return " ".join(fields)


def maintenance_crons(specs: Iterable[TableSpec]) -> dict[str, dict[str, str]]:
    """Per table identifier, the cron (UTC) of each scheduled job kind of :data:`CRONS`: the declared
    cron spread by the table's slot among ``specs`` (all the tables of the code location), or as
    declared when the table pins it."""
    specs = list(specs)
    slots = spread_slots(s.identifier for s in specs)
    out = {}
    for spec in specs:
        policy = spec.maintenance
        out[spec.identifier] = {
            kind: getattr(policy, f"{field}_cron")
            if field in policy.pinned
            else spread_cron(getattr(policy, f"{field}_cron"), slots[spec.identifier])
            for kind, field in CRONS.items()
        }
    return out
