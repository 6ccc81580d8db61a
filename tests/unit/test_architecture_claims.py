"""The claims of docs/architecture.md that a reading of the code can check, checked by reading the code (its AST).

- "Every write to a store goes through one function (``store/writes.py``)": no other module writes to a RocksDB
  database or column family, whatever the name it is held by (a handle is followed from its open, its family lookup
  or its annotation through the names it is given).
- "Nothing outside ``store/`` opens RocksDB" (``store/offline.py`` is the door of the stores the daemon does not
  own): no other package imports rocksdict, opens a database, makes a batch or looks up a column family.
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


# rocksdict's types whose instances write: a database (or one of its families, also an Rdict) and, outside store/,
# a batch (inside, a batch is staged there and written by writes.write; outside, none is made at all).
_DATABASES = ("Rdict",)
_BATCHES = ("WriteBatch",)
_FAMILY_LOOKUPS = ("get_column_family", "get_column_family_handle", "create_column_family")
_WRITES = ("write", "put", "delete", "delete_range", "merge", "ingest_external_file", "__setitem__", "__delitem__")
# Calls that reach RocksDB itself: its types made, and families looked up, created or dropped (a change of the
# database's shape, which store/ makes: writes.write carries data only).
_ROCKSDB_CALLS = ("Rdict", "WriteBatch", "SstFileWriter", "Checkpoint", "ColumnFamily", "drop_column_family",
                  *_FAMILY_LOOKUPS)


def _is_handle(node: ast.expr, held: set[str], types: tuple[str, ...]) -> bool:
    """Whether ``node`` is a RocksDB handle of ``types``: opened or looked up right there, a name that holds one,
    or one of the names the store's own code gives its database (``db``, ``*.db``, ``*._db``)."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        return name in types or name in _FAMILY_LOOKUPS
    if (isinstance(node, ast.Name) and node.id == "db") or (isinstance(node, ast.Attribute)
                                                             and node.attr in ("db", "_db")):
        return True
    return ast.unparse(node) in held


def _annotated(annotation: ast.expr | None, types: tuple[str, ...]) -> bool:
    return annotation is not None and any(t in ast.unparse(annotation) for t in types)


def _handles(tree: ast.Module, types: tuple[str, ...]) -> set[str]:
    """The names (as written: ``rd``, ``self._meta``) that hold a RocksDB handle of ``types`` somewhere in the
    module: assigned one (an open, a family lookup, another such name), bound by ``with ... as``, or annotated."""
    held: set[str] = set()
    while True:
        before = len(held)
        for node in ast.walk(tree):
            pairs: list[tuple[ast.expr, ast.expr | None, ast.expr | None]] = []
            if isinstance(node, ast.Assign):
                pairs = [(t, node.value, None) for t in node.targets]
            elif isinstance(node, ast.AnnAssign):
                pairs = [(node.target, node.value, node.annotation)]
            elif isinstance(node, ast.NamedExpr):
                pairs = [(node.target, node.value, None)]
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                pairs = [(node.optional_vars, node.context_expr, None)]
            elif isinstance(node, ast.arg) and _annotated(node.annotation, types):
                held.add(node.arg)
            for target, value, annotation in pairs:
                if _annotated(annotation, types) or (value is not None and _is_handle(value, held, types)):
                    held.add(ast.unparse(target))
        if len(held) == before:
            return held


def rocksdb_writes(rel: str, tree: ast.Module) -> list[str]:
    """The writes to a RocksDB database or family in module ``rel`` (relative to the package) made past
    ``writes.write``: a write method called, or an item set or deleted, on a handle whatever its name."""
    types = _DATABASES if rel.startswith("store/") else _DATABASES + _BATCHES
    held = _handles(tree, types)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _WRITES \
                and _is_handle(node.func.value, held, types):
            found.append(f"{rel}:{node.lineno} {ast.unparse(node.func)}")
        targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else \
            [node.target] if isinstance(node, ast.AugAssign) else []
        found += [f"{rel}:{t.lineno} {ast.unparse(t)}" for t in targets
                  if isinstance(t, ast.Subscript) and _is_handle(t.value, held, types)]
    return found


def rocksdb_reached(rel: str, tree: ast.Module) -> list[str]:
    """What in module ``rel`` reaches RocksDB itself: an import of rocksdict, an open, a batch, a family lookup."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found += [f"{rel}:{node.lineno} import {m}" for m in modules if m.split(".")[0] == "rocksdict"]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in _ROCKSDB_CALLS:
                found.append(f"{rel}:{node.lineno} {ast.unparse(func)}")
    return found


def store_writes_outside_writes() -> list[str]:
    return [w for rel, tree in _modules() if rel != "store/writes.py" for w in rocksdb_writes(rel, tree)]


def rocksdb_outside_store() -> list[str]:
    return [r for rel, tree in _modules() if not rel.startswith("store/") for r in rocksdb_reached(rel, tree)]


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


def test_nothing_outside_store_opens_rocksdb() -> None:
    assert rocksdb_outside_store() == []


# What export/bootstrap.py did before store/offline.py (its receiver is not named db, so the first guard missed
# it), and the same writes through other names: every one is flagged.
_KNOWN_BAD = """
from rocksdict import Rdict, WriteBatch

def stamp_closed(path, opts):
    rd = Rdict(str(path), opts, column_families={"meta": opts})
    rd.get_column_family("meta")[b"status"] = b"clean"
    meta = rd.get_column_family("meta")
    del meta[b"topic"]
    handle = rd.get_column_family_handle("values")
    batch = WriteBatch(raw_mode=True)
    batch.put(b"k", b"v", handle)
    with Rdict(str(path)) as other:
        other.write(batch)
    store = rd
    store.put(b"k", b"v")


def annotated(family: Rdict) -> None:
    family.delete(b"k")
"""


def test_the_guards_flag_a_known_bad_module() -> None:
    tree = ast.parse(_KNOWN_BAD)
    assert sorted(rocksdb_writes("export/bad.py", tree)) == sorted([
        "export/bad.py:6 rd.get_column_family('meta')[b'status']", "export/bad.py:8 meta[b'topic']",
        "export/bad.py:11 batch.put", "export/bad.py:13 other.write", "export/bad.py:15 store.put",
        "export/bad.py:19 family.delete"])
    assert sorted(rocksdb_reached("export/bad.py", tree)) == sorted([
        "export/bad.py:2 import rocksdict", "export/bad.py:5 Rdict", "export/bad.py:6 rd.get_column_family",
        "export/bad.py:7 rd.get_column_family", "export/bad.py:9 rd.get_column_family_handle",
        "export/bad.py:10 WriteBatch", "export/bad.py:12 Rdict"])


def test_the_guards_pass_the_offline_door_and_other_puts() -> None:
    good = ast.parse("""
from globald.store.offline import open_offline

def build(path, options, jobs):
    with open_offline(path, options) as store:
        store.put_meta({b"k": b"v"}, "build")
        b = store.values_batch()
        b.put(b"k", b"v")
        store.write(lambda: b, "build")
    jobs.put(path)
""")
    assert rocksdb_writes("snapshot/good.py", good) == []
    assert rocksdb_reached("snapshot/good.py", good) == []


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
