"""The ``consistent_cdc`` rehearsal's source: a PostgreSQL shop whose invariants span tables, its SQL
workload, the invariant checks, and a reader that checks them on the lake while it is written.

Tables (:data:`TABLES`): ``orders`` (``total``), ``order_lines`` (``amount``), ``stock`` (``qty`` per
warehouse and item), ``moves`` (one row per stock move) and ``customers`` (orders placed). Invariants:

- **orders**: every order's ``total`` equals the sum of its lines' ``amount``, and no line lacks its order;
- **stock**: per item, the quantity over all warehouses is :data:`START_QTY` times :data:`WAREHOUSES`
  (conserved), and every stock row equals :data:`START_QTY` plus the moves into it minus those out of it
  (the ledger ``moves`` agrees with ``stock``).

Each workload transaction keeps both (one order with its lines, or one move between two warehouses with
its ledger row), so any read of the tables at one source transaction boundary satisfies them, and a read
of the tables one by one at different moments can break them.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from devtools.rehearsal.cdc import Rounds
from devtools.services import cdc_source

WAREHOUSES, ITEMS, START_QTY, CUSTOMERS = 4, 10, 1000, 20

# table -> (key columns, [(column, PostgreSQL type, Iceberg type)])
TABLES: dict[str, tuple[list[str], list[tuple[str, str, str]]]] = {
    "orders": (["id"], [("id", "bigint", "long"), ("customer", "bigint", "long"), ("total", "bigint", "long")]),
    "order_lines": (
        ["order_id", "line_no"],
        [("order_id", "bigint", "long"), ("line_no", "integer", "int"), ("amount", "bigint", "long")],
    ),
    "stock": (
        ["warehouse", "item"],
        [("warehouse", "integer", "int"), ("item", "integer", "int"), ("qty", "bigint", "long")],
    ),
    "moves": (
        ["id"],
        [
            ("id", "bigint", "long"),
            ("item", "integer", "int"),
            ("src", "integer", "int"),
            ("dst", "integer", "int"),
            ("qty", "bigint", "long"),
        ],
    ),  # fmt: skip
    "customers": (["id"], [("id", "bigint", "long"), ("orders", "bigint", "long")]),
}


def ddl() -> str:
    """CREATE TABLE statements of :data:`TABLES` (empty tables: the capture starts before any row)."""
    out = []
    for name, (keys, cols) in TABLES.items():
        body = ", ".join(f"{c} {t}" + (" NOT NULL" if c in keys else "") for c, t, _ in cols)
        out.append(f"CREATE TABLE {name} ({body}, PRIMARY KEY ({', '.join(keys)}));")
    return "\n".join(out)


def initial_rows_sql() -> str:
    """One transaction loading the stock (:data:`START_QTY` per warehouse and item) and the customers."""
    stock = ", ".join(f"({w}, {i}, {START_QTY})" for w in range(WAREHOUSES) for i in range(ITEMS))
    customers = ", ".join(f"({c}, 0)" for c in range(CUSTOMERS))
    return f"BEGIN; INSERT INTO stock VALUES {stock}; INSERT INTO customers VALUES {customers}; COMMIT;"


def iceberg_schema(table: str) -> list[dict]:
    """The declared schema of ``table`` (key columns required)."""
    keys, cols = TABLES[table]
    return [{"name": c, "type": t, **({"required": True} if c in keys else {})} for c, _, t in cols]


class ShopWorkload(Rounds):
    """Rounds of real SQL on the shop until :meth:`stop` (:class:`~devtools.rehearsal.cdc.Rounds`): per round
    ``orders_per_round`` order transactions (a new order with 1-4 lines; a line's amount changed; a line
    added; a line deleted; an order deleted with its lines) and ``moves_per_round`` stock moves, each its own
    transaction, then ``pause_s`` seconds of rest. ``rounds``/``transactions`` count what finished; ``errors``
    holds a failure (it stops the thread)."""

    def __init__(self, db, seed: int, pause_s: float, orders_per_round: int = 4, moves_per_round: int = 4):
        super().__init__("shop-workload", pause_s)
        self.db, self.rng = db, random.Random(seed)
        self.per_round = (orders_per_round, moves_per_round)
        self.orders: dict[int, int] = {}  # live order id -> lines
        self.next_order = self.next_move = 1
        self.transactions = 0

    def round(self) -> None:
        orders = [self._order_tx() for _ in range(self.per_round[0])]
        moves = [self._move_tx() for _ in range(self.per_round[1])]
        txs = [tx for pair in zip(orders, moves) for tx in pair] + orders[len(moves) :] + moves[len(orders) :]
        cdc_source.run_sql(self.db, "\n".join(txs))
        self.transactions += len(txs)

    def _order_tx(self) -> str:
        rng = self.rng
        kind = "new" if len(self.orders) < 30 else rng.choice(["new", "change", "add", "drop_line", "delete"])
        if kind == "new":
            oid, n = self.next_order, rng.randint(1, 4)
            self.next_order += 1
            self.orders[oid] = n
            amounts = [rng.randint(1, 500) for _ in range(n)]
            lines = ", ".join(f"({oid}, {i + 1}, {a})" for i, a in enumerate(amounts))
            cust = rng.randrange(CUSTOMERS)
            return (
                f"BEGIN; INSERT INTO orders VALUES ({oid}, {cust}, {sum(amounts)}); "
                f"INSERT INTO order_lines VALUES {lines}; "
                f"UPDATE customers SET orders = orders + 1 WHERE id = {cust}; COMMIT;"
            )
        oid = rng.choice(sorted(self.orders))
        if kind == "delete":
            del self.orders[oid]
            return (
                f"BEGIN; DELETE FROM order_lines WHERE order_id = {oid}; DELETE FROM orders WHERE id = {oid}; COMMIT;"
            )
        if kind == "add":
            self.orders[oid] += 1
            change = f"INSERT INTO order_lines VALUES ({oid}, {self.orders[oid]}, {rng.randint(1, 500)});"
        elif kind == "drop_line" and self.orders[oid] > 1:
            change = f"DELETE FROM order_lines WHERE order_id = {oid} AND line_no = {self.orders[oid]};"
            self.orders[oid] -= 1
        else:
            line = rng.randint(1, self.orders[oid])
            change = f"UPDATE order_lines SET amount = amount + {rng.randint(1, 50)} WHERE order_id = {oid} AND line_no = {line};"
        total = f"(SELECT sum(amount) FROM order_lines WHERE order_id = {oid})"
        return f"BEGIN; {change} UPDATE orders SET total = {total} WHERE id = {oid}; COMMIT;"

    def _move_tx(self) -> str:
        rng = self.rng
        item, (src, dst), qty = rng.randrange(ITEMS), rng.sample(range(WAREHOUSES), 2), rng.randint(1, 40)
        mid = self.next_move
        self.next_move += 1
        return (
            f"BEGIN; UPDATE stock SET qty = qty - {qty} WHERE warehouse = {src} AND item = {item}; "
            f"INSERT INTO moves VALUES ({mid}, {item}, {src}, {dst}, {qty}); "
            f"UPDATE stock SET qty = qty + {qty} WHERE warehouse = {dst} AND item = {item}; COMMIT;"
        )


def orders_broken(orders: list[dict], lines: list[dict]) -> str | None:
    """Why ``orders`` and ``order_lines`` rows (dicts of columns) break the orders invariant; None if they hold."""
    sums: dict[int, int] = defaultdict(int)
    for line in lines:
        sums[line["order_id"]] += line["amount"]
    ids = set()
    for order in orders:
        ids.add(order["id"])
        if order["total"] != sums.get(order["id"], 0):
            return f"order {order['id']}: total {order['total']} != sum of lines {sums.get(order['id'], 0)}"
    orphans = set(sums) - ids
    return f"lines of missing orders {sorted(orphans)[:5]}" if orphans else None


def stock_broken(stock: list[dict], moves: list[dict]) -> str | None:
    """Why ``stock`` and ``moves`` rows break the stock invariant (conserved per item, equal to the
    ledger); None if they hold (an empty stock with no moves holds: nothing loaded yet)."""
    if not stock:
        return f"{len(moves)} moves but no stock" if moves else None
    if len(stock) != WAREHOUSES * ITEMS:
        return f"{len(stock)} stock rows, not {WAREHOUSES * ITEMS}"
    ledger: dict[tuple[int, int], int] = defaultdict(int)
    for m in moves:
        ledger[(m["src"], m["item"])] -= m["qty"]
        ledger[(m["dst"], m["item"])] += m["qty"]
    per_item: dict[int, int] = defaultdict(int)
    for row in stock:
        per_item[row["item"]] += row["qty"]
        want = START_QTY + ledger.get((row["warehouse"], row["item"]), 0)
        if row["qty"] != want:
            return f"stock ({row['warehouse']}, {row['item']}) = {row['qty']}, ledger says {want}"
    wrong = {i: q for i, q in per_item.items() if q != START_QTY * WAREHOUSES}
    return f"item totals not conserved: {wrong}" if wrong else None


@dataclass
class ReadTally:
    """What the reader checked: reads, distinct positions (snapshot ids of every table), broken reads
    and the first few reasons."""

    checked: int = 0
    broken: int = 0
    positions: set = field(default_factory=set)
    reasons: list = field(default_factory=list)
    errors: int = 0

    def add(self, position: tuple, *why: str | None) -> None:
        self.checked += 1
        self.positions.add(position)
        bad = [w for w in why if w]
        if bad:
            self.broken += 1
            if len(self.reasons) < 5:
                self.reasons.append("; ".join(bad))


def _rows(table, snapshot_id: int | None) -> list[dict]:
    if snapshot_id is None:
        return []
    return table.scan(snapshot_id=snapshot_id).to_arrow().to_pylist()


class InvariantReader(threading.Thread):
    """Polls the lake until :meth:`stop`, on a catalog of its own (``settings.catalog``). Each round:
    the group's consistent view (:func:`kafka_iceberg.catalog.group_view.read_group`, what
    ``lake_reader.group`` uses) checked for both invariants (``group``), then the tables one by one at
    their current snapshots, ``gap_s`` seconds apart within each invariant's pair (orders, sleep,
    order_lines; stock, sleep, moves), checked the same way (``single``). ``idents``: table -> identifier."""

    def __init__(self, settings, idents: dict[str, str], gap_s: float = 1.0, pause_s: float = 0.5):
        super().__init__(daemon=True, name="invariant-reader")
        self.settings, self.idents, self.gap_s, self.pause_s = settings, idents, gap_s, pause_s
        self.group, self.single = ReadTally(), ReadTally()
        self.errors: list[str] = []
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(300)

    def run(self) -> None:
        from kafka_iceberg.catalog.tables import load_catalog

        catalog = load_catalog(self.settings.catalog)
        while not self._halt.is_set():
            try:
                self._group_round(catalog)
                self._single_round(catalog)
            except Exception as exc:  # noqa: BLE001 - counted; a reader error is not an invariant break
                self.group.errors += 1
                if len(self.errors) < 5:
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            self._halt.wait(self.pause_s)

    def _group_round(self, catalog) -> None:
        from kafka_iceberg.catalog.group_view import read_group
        from kafka_iceberg.errors import ConfigError

        names = list(self.idents)
        try:
            read = read_group(catalog, [self.idents[n] for n in names])
        except ConfigError:  # no group commit yet
            return
        rows = {n: _rows(*read[self.idents[n]]) for n in names}
        position = tuple(read[self.idents[n]][1] for n in names)
        self.group.add(
            position,
            orders_broken(rows["orders"], rows["order_lines"]),
            stock_broken(rows["stock"], rows["moves"]),
        )

    def _single_round(self, catalog) -> None:
        from kafka_iceberg.catalog.tables import load_table

        for first, second, check in (("orders", "order_lines", orders_broken), ("stock", "moves", stock_broken)):
            seen = []
            for n, name in enumerate((first, second)):
                if n:
                    time.sleep(self.gap_s)
                table = load_table(catalog, self.idents[name])
                snap = table.current_snapshot() if table is not None else None
                seen.append((snap.snapshot_id if snap else None, _rows(table, snap.snapshot_id if snap else None)))
            if seen[0][0] is None and seen[1][0] is None:
                continue
            self.single.add((first, seen[0][0], seen[1][0]), check(seen[0][1], seen[1][1]))


__all__ = [
    "TABLES",
    "InvariantReader",
    "ReadTally",
    "ShopWorkload",
    "ddl",
    "iceberg_schema",
    "initial_rows_sql",
    "orders_broken",
    "stock_broken",
]
