"""The claims of docs/architecture.md that a reading of the code can check, checked by reading the code (its AST).

- "Every write to a store goes through one function (``store/writes.py``)": no other module calls a write method
  on a RocksDB handle (``db``, ``self.db``, ``self._db``).
- "Every file replaced or renamed on disk goes through ``store/durable.py``": no other module calls ``os.rename`` or
  ``os.replace``.
- "The names are declared once, in ``store/names.py``": no other module spells a reserved prefix or suffix.
- "A table's snapshot state changes only in ``snapshot/table_state.py``": no other module assigns a field of a
  ``SnapshotTable`` or reaches into its private ones.
- The "On disk" tree names every work-in-progress directory a table or a snapshot can leave behind.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import globald
from globald.snapshot.table_state import SnapshotTable
from globald.store import names

PACKAGE_ROOT = Path(globald.__file__).parent
ARCHITECTURE = PACKAGE_ROOT.parent / "docs" / "architecture.md"
# The dot-prefixes of work in progress and leftovers, and the typed tables' columnar file (store/names.py).
RESERVED = (".tmp-", ".trash-", ".build-", ".import-", ".replaced-", ".bootstrap-", ".dropped-", "columnar-", ".arrow")


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        rel = path.relative_to(PACKAGE_ROOT).as_posix()
        yield rel, ast.parse(path.read_text(encoding="utf-8"), filename=rel)


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes: prose may name what the code may not spell."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def store_writes_outside_writes() -> list[str]:
    found = []
    for rel, tree in _modules():
        if rel == "store/writes.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("write", "put", "delete", "delete_range") \
                    and ast.unparse(node.func.value) in ("db", "self.db", "self._db"):
                found.append(f"{rel}:{node.lineno} {ast.unparse(node.func)}")
    return found


def renames_outside_durable() -> list[str]:
    found = []
    for rel, tree in _modules():
        if rel == "store/durable.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.rename", "os.replace"):
                found.append(f"{rel}:{node.lineno} {ast.unparse(node.func)}")
    return found


def reserved_names_outside_names() -> list[str]:
    found = []
    for rel, tree in _modules():
        if rel == "store/names.py":
            continue
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                    and any(r in node.value for r in RESERVED):
                found.append(f"{rel}:{node.lineno} {node.value!r}")
    return found


def snapshot_table_fields_changed_outside_table_state() -> list[str]:
    private = {f for f in SnapshotTable.__slots__ if f.startswith("_")}
    fields = private | {f.lstrip("_") for f in SnapshotTable.__slots__}
    found = []
    for rel, tree in _modules():
        # Its instances live in the snapshot package, and reach only modules that name the class.
        names_it = rel.startswith("snapshot/") or "SnapshotTable" in ast.unparse(tree)
        if rel == "snapshot/table_state.py" or not names_it:
            continue
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            assigned = [t for t in flat if isinstance(t, ast.Attribute) and t.attr in fields]
            reached = [node] if isinstance(node, ast.Attribute) and node.attr in private else []
            for t in assigned + reached:
                if isinstance(t, ast.Attribute) and ast.unparse(t.value) != "self":
                    found.append(f"{rel}:{t.lineno} {ast.unparse(t)}")
    return found


def test_every_store_write_goes_through_writes() -> None:
    assert store_writes_outside_writes() == []


def test_every_rename_goes_through_durable() -> None:
    assert renames_outside_durable() == []


def test_reserved_names_are_spelled_only_in_names() -> None:
    assert reserved_names_outside_names() == []


def test_snapshot_table_state_changes_only_in_table_state() -> None:
    assert snapshot_table_fields_changed_outside_table_state() == []


def test_the_on_disk_tree_names_every_work_in_progress_directory() -> None:
    tree = ARCHITECTURE.read_text().split("## On disk", 1)[1].split("```")[1]
    for prefix in (names.IMPORT_PREFIX, names.REPLACED_PREFIX, names.BOOTSTRAP_PREFIX, names.TMP_PREFIX,
                   names.SNAPSHOT_BUILD_PREFIX, names.TRASH_PREFIX, names.SNAPSHOT_DROPPED_PREFIX):
        assert f"/{prefix}<" in tree, prefix
