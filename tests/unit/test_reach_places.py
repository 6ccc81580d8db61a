"""``tests.chaos.reach.DISK_PLACES`` (issue 40, 5.12): the chaos campaign counts a rise of
``globald_swallowed_failures_total`` at these places as the daemon meeting a disk fault, which holds only while each
names a real ``swallowed.record`` place whose ``except`` clause catches OSError and nothing else. A renamed label
would silently never count; a widened clause would count a Kafka error or a bug as the disk fault."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.chaos.reach import DISK_PLACES
from tests.harness import REPO


def _records(tree: ast.AST, handler: ast.ExceptHandler | None = None) -> Iterator[tuple[str, ast.ExceptHandler | None,
                                                                                          int]]:
    """Each ``swallowed.record("<label>", ...)``: its label, the innermost except clause around it, its line."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "record" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "swallowed" and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            yield node.args[0].value, handler, node.lineno
        inner = node if isinstance(node, ast.ExceptHandler) else handler
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            inner = None  # a function defined in a handler does not run inside it
        yield from _records(node, inner)


def disk_place_problems(sources: dict[str, str], places: frozenset[str]) -> list[str]:
    """What is wrong with ``places`` against the modules ``sources`` (name -> text); empty when nothing is."""
    found: dict[str, list[str]] = {p: [] for p in places}
    for name, text in sources.items():
        for label, handler, line in _records(ast.parse(text, filename=name)):
            if label not in found:
                continue
            caught = ast.unparse(handler.type) if handler is not None and handler.type is not None else None
            if caught != "OSError":
                found[label].append(f"{label} at {name}:{line} is not in an `except OSError` clause "
                                    f"(it catches {(caught or 'anything') if handler else 'nothing'})")
            else:
                found[label].append("")
    problems = [f"{p}: no swallowed.record({p!r}, ...) in globald" for p, seen in found.items() if not seen]
    return sorted(problems + [m for seen in found.values() for m in seen if m])


def _globald_sources() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in (REPO / "globald").rglob("*.py")}


def test_every_disk_place_is_a_place_that_catches_only_oserror() -> None:
    assert disk_place_problems(_globald_sources(), DISK_PLACES) == []


def test_the_check_fails_on_a_missing_label_and_on_a_wider_clause() -> None:
    bad = '''
def write():
    try:
        save()
    except Exception as e:
        swallowed.record("status_file", e, log, "x")
    try:
        save()
    except (OSError, KafkaException) as e:
        swallowed.record("snapshot_reply", e, log, "x")
    try:
        save()
    except OSError as e:
        def later():
            swallowed.record("snapshot_stale_mark", e, log, "x")
'''
    problems = disk_place_problems({"bad.py": bad}, DISK_PLACES | {"renamed_place"})
    assert problems == [
        "renamed_place: no swallowed.record('renamed_place', ...) in globald",
        "snapshot_reply at bad.py:10 is not in an `except OSError` clause (it catches (OSError, KafkaException))",
        "snapshot_stale_mark at bad.py:15 is not in an `except OSError` clause (it catches nothing)",
        "status_file at bad.py:6 is not in an `except OSError` clause (it catches Exception)",
    ], problems
