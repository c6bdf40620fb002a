"""The write path's phases pass values, not a shared cache: :class:`~kafka_iceberg.batch.context.Lake`
holds connections and counters only, no phase module stores anything on it, and the table the
branch commit returned reaches the read, write and publish phases through their parameters and the
frozen values of kafka_iceberg/batch/types.py. (tests/test_write_path.py counts the metadata loads
this saves.)"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

from kafka_iceberg.batch import read, types, write
from kafka_iceberg.batch.context import Lake

BATCH = Path(__file__).resolve().parent.parent / "kafka_iceberg" / "batch"


def test_lake_holds_connections_and_counters_not_table_metadata():
    fields = {f.name for f in dataclasses.fields(Lake)}
    # java_tables: Py4J handles whose every use refreshes the metadata first (Lake.java_table)
    assert fields == {"spark", "settings", "kafka", "catalog", "crash_hook", "metadata_loads", "java_tables"}


def _stores_on_lake(tree: ast.AST) -> list[str]:
    """Assignments (plain, augmented, subscripted or by a mutating call) to anything reached from a name ``lake``."""

    def rooted_at_lake(node) -> bool:
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return isinstance(node, ast.Name) and node.id == "lake"

    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            mutators = {"append", "update", "setdefault", "pop", "__setitem__", "clear", "extend"}
            obj = node.func.value
            if node.func.attr in mutators and isinstance(obj, ast.Attribute) and rooted_at_lake(obj):
                if obj.attr != "metadata_loads":
                    found.append(ast.unparse(node))
        for target in targets:
            if isinstance(target, (ast.Attribute, ast.Subscript)) and rooted_at_lake(target):
                found.append(ast.unparse(target))
    return found


def test_no_phase_stores_state_on_the_lake():
    stores = {}
    for path in sorted(BATCH.glob("*.py")):
        if path.name == "context.py":  # Lake's own methods
            continue
        found = _stores_on_lake(ast.parse(path.read_text()))
        if found:
            stores[path.name] = found
    assert stores == {}
    assert _stores_on_lake(ast.parse("lake.loaded[identifier] = table\nlake.cache.update(x)")), "the check can fail"


def test_the_committed_table_flows_through_the_phase_signatures():
    assert inspect.signature(write.create_branch).return_annotation == "AttemptBranch"
    assert "table" in {f.name for f in dataclasses.fields(types.AttemptBranch)}
    assert "table" in inspect.signature(read.read_batch).parameters
    assert inspect.signature(write.write_attempt).parameters["attempt"].annotation == "AttemptBranch"
    assert "table" in {f.name for f in dataclasses.fields(types.WrittenAttempt)}
    assert "table" in {f.name for f in dataclasses.fields(types.WritePlan)}
    for value in (types.AttemptBranch, types.WrittenAttempt, types.WritePlan):
        assert value.__dataclass_params__.frozen
