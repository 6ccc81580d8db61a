"""Avro binary checked against its writer schema before fastavro reads it: what the specification forbids, and what
one value may decode to.

Why a pass of its own: fastavro is lenient where the bytes lie, and what globald serves is globald's promise.
- An array or map block count is believed: ``array<null>`` (or of an empty record, or ``fixed`` of size 0) items
  take no bytes, so a count of 3e9 is contradicted by nothing and fastavro builds 3e9 Python objects, in the
  daemon's decode process, ``get --decode`` and every Spark worker alike.
- A negative enum index reads as a symbol (Python's negative indexing), a varint of 11 bytes as -2**63, a
  boolean byte of 2 as true.

``validate(program, payload, start, limits)`` walks the payload once, driven by the writer schema compiled by
``compile_schema``: iteratively (an explicit stack, never Python recursion, so a recursive writer schema cannot
overflow a stack), counting every array item and map entry of the value against ``Limits.items`` before a
single one is read, and the nesting against ``Limits.depth``. It raises ``DecodeError`` (one value's decode
error, never the process's) for:
- enum index or union branch outside the schema's;
- an int varint over 5 bytes or 32 bits, a long varint over 10 bytes or 64 bits;
- a boolean byte other than 0 and 1;
- a negative length, or one (or a block's items at their smallest size) past the end of the payload;
- more items than ``Limits.items``, nesting deeper than ``Limits.depth``; bytes left after the value.
What it does not check is left to fastavro, which refuses it (invalid UTF-8 in a string). Strings and bytes
decode to at most the payload's own bytes (every length is checked against what is left), so the bound on a
value's bytes is the record's size, which the broker's ``message.max.bytes`` bounds: items are what amplify.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from globald.typed.arrow import DecodeError

# Node kinds.
NULL, BOOLEAN, INT, LONG, FLOAT, DOUBLE, BYTES, STRING, FIXED, ENUM, ARRAY, MAP, RECORD, UNION = range(14)
_PRIMITIVE = {"null": NULL, "boolean": BOOLEAN, "int": INT, "long": LONG, "float": FLOAT, "double": DOUBLE,
              "bytes": BYTES, "string": STRING}
DEFAULT_ITEMS = 1_000_000
DEFAULT_DEPTH = 64


@dataclass(frozen=True)
class Limits:
    """What one value may decode to: ``items`` array items and map entries in all (``[tables.value] max_items``),
    nested ``depth`` containers deep (a non-recursive schema cannot go deeper than itself; a recursive writer
    schema could, as deep as its data says)."""

    items: int = DEFAULT_ITEMS
    depth: int = DEFAULT_DEPTH


class Node:
    """One type of the writer schema. ``fixed``: the bytes a value of it always takes (-1: it varies); ``least``: the
    fewest bytes a value of it can take, which bounds how many items a block may claim."""

    __slots__ = ("children", "fixed", "kind", "least", "size")

    def __init__(self, kind: int, size: int = 0) -> None:
        self.kind = kind
        self.size = size  # fixed: its size; enum: its symbol count
        self.children: list[Node] = []  # record fields; union branches; array items or map values (one)
        self.fixed = -1
        self.least = 0


class _Compiler:
    def __init__(self) -> None:
        self.named: dict[str, Node] = {}

    def node(self, s: Any, namespace: str) -> Node:
        if isinstance(s, str):
            if s in _PRIMITIVE:
                return Node(_PRIMITIVE[s])
            full = s if "." in s or not namespace else f"{namespace}.{s}"
            found = self.named.get(full, self.named.get(s))
            if found is None:
                raise ValueError(f"unknown type name {s!r}")
            return found
        if isinstance(s, list):
            union = Node(UNION)
            union.children = [self.node(b, namespace) for b in s]
            if not union.children:
                raise ValueError("an empty union")
            return union
        if not isinstance(s, dict):
            raise ValueError(f"not an Avro schema: {s!r}")
        kind = s.get("type")
        if kind in ("record", "error", "enum", "fixed"):
            name = str(s["name"])
            inner = str(s.get("namespace", name.rpartition(".")[0] if "." in name else namespace))
            full = name if "." in name else f"{inner}.{name}".lstrip(".")
            if kind == "enum":
                n = Node(ENUM, len(s["symbols"]))
            elif kind == "fixed":
                n = Node(FIXED, int(s["size"]))
            else:
                n = Node(RECORD)
            self.named[full] = n  # before the fields: a field may name its own record (recursive)
            self.named.setdefault(name, n)
            if kind in ("record", "error"):
                n.children = [self.node(f["type"], inner) for f in s["fields"]]
            return n
        if kind == "array":
            n = Node(ARRAY)
            n.children = [self.node(s["items"], namespace)]
            return n
        if kind == "map":
            n = Node(MAP)
            n.children = [self.node(s["values"], namespace)]
            return n
        return self.node(kind, namespace)  # {"type": "long", "logicalType": ...} and the like


_FIXED_SIZE = {NULL: 0, FLOAT: 4, DOUBLE: 8}
_LEAST = {BOOLEAN: 1, INT: 1, LONG: 1, BYTES: 1, STRING: 1, ENUM: 1, ARRAY: 1, MAP: 1}


def _sizes(root: Node) -> None:
    """Fill ``fixed`` and ``least`` of every node. A node met again while open (a recursive record) counts as taking
    0 bytes: still a lower bound."""
    done: set[int] = set()

    def visit(n: Node, open_: set[int]) -> None:  # schema depth, not data depth: bounded by the schema file
        if id(n) in done or id(n) in open_:
            return
        open_.add(id(n))
        for c in n.children:
            visit(c, open_)
        open_.discard(id(n))
        done.add(id(n))
        if n.kind in _FIXED_SIZE:
            n.fixed = n.least = _FIXED_SIZE[n.kind]
        elif n.kind == FIXED:
            n.fixed = n.least = n.size
        elif n.kind == RECORD:
            sizes = [c.fixed for c in n.children]
            n.fixed = sum(sizes) if all(x >= 0 for x in sizes) and all(id(c) in done for c in n.children) else -1
            n.least = sum(c.least for c in n.children)
        elif n.kind == UNION:
            n.least = 1 + min(c.least for c in n.children)
        else:
            n.least = _LEAST[n.kind]

    visit(root, set())


def compile_schema(schema: Any) -> Node:
    """The writer schema (parsed JSON) as the tree ``validate`` walks; ValueError for what is not an Avro schema."""
    try:
        root = _Compiler().node(schema, "")
    except (KeyError, TypeError) as e:
        raise ValueError(f"not an Avro schema: {type(e).__name__}: {e}") from None
    _sizes(root)
    return root


def _varint(buf: bytes, pos: int, end: int, most: int, what: str) -> tuple[int, int]:
    """(zigzag-decoded value, next position) of a varint of at most ``most`` bytes (5: int, 10: long)."""
    raw = shift = 0
    start = pos
    while True:
        if pos >= end:
            raise DecodeError(f"truncated or corrupt Avro payload (it ends in a {what} at byte {start})")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if pos - start >= most:
            raise DecodeError(f"Avro {what} varint longer than {most} bytes at byte {start}")
    if raw >> (32 if most == 5 else 64):
        raise DecodeError(f"Avro {what} varint over {32 if most == 5 else 64} bits at byte {start}")
    return (raw >> 1) ^ -(raw & 1), pos


def validate(root: Node, buf: bytes, start: int, limits: Limits) -> int:
    """The array items and map entries of the value (what its decoding may amplify to, beyond its bytes); raise
    DecodeError unless ``buf[start:]`` is exactly one value of the writer schema ``root`` within ``limits`` (the
    module's docstring lists what is checked). Time and memory: linear in the payload and the items it holds, which
    ``limits.items`` bounds; items of a fixed size are skipped in one step."""
    end = len(buf)
    pos = start
    items = 0
    most_items, most_depth = limits.items, limits.depth
    # Entries: (node, depth, left). left > 0: the rest of an array block (node: the array) or, with the node's
    # kind MAP, of a map block; left == 0: one value of node.
    stack: list[tuple[Node, int, int]] = [(root, 0, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth, left = pop()
        kind = node.kind
        if left:  # one more item of a block: the item, then (when more are left) the rest of the block
            child = node.children[0]
            push((node, depth, left - 1))  # left - 1 == 0: the block's end, where the next block count is read
            push((child, depth + 1, 0))
            if kind == MAP:
                n, pos = _varint(buf, pos, end, 10, "map key length")
                if n < 0 or n > end - pos:
                    raise DecodeError(f"Avro map key length {n} at byte {pos} (payload of {end - start} bytes)")
                pos += n
            continue
        if node.fixed >= 0:
            pos += node.fixed
            if pos > end:
                raise DecodeError(f"truncated or corrupt Avro payload (it ends before its value, {end - start} bytes)")
            continue
        if kind in (INT, LONG, ENUM):
            if pos < end and buf[pos] < 0x80:  # the common one-byte varint
                value = (buf[pos] >> 1) ^ -(buf[pos] & 1)
                pos += 1
            else:
                value, pos = _varint(buf, pos, end, 10 if kind == LONG else 5, "long" if kind == LONG else "int")
            if kind == ENUM and not 0 <= value < node.size:
                raise DecodeError(f"Avro enum index {value} outside the writer schema's {node.size} symbols")
        elif kind in (STRING, BYTES):
            n, pos = _varint(buf, pos, end, 10, "length")
            if n < 0 or n > end - pos:
                raise DecodeError(f"Avro {'string' if kind == STRING else 'bytes'} length {n} at byte {pos} "
                                  f"(payload of {end - start} bytes)")
            pos += n
        elif kind == BOOLEAN:
            if pos >= end:
                raise DecodeError(f"truncated or corrupt Avro payload (it ends before its value, {end - start} bytes)")
            if buf[pos] > 1:
                raise DecodeError(f"Avro boolean byte {buf[pos]} at byte {pos} (0 or 1)")
            pos += 1
        else:  # RECORD, UNION, ARRAY, MAP
            if depth >= most_depth:
                raise DecodeError(f"Avro value nested deeper than {most_depth}")
            if kind == RECORD:
                for child in reversed(node.children):
                    push((child, depth + 1, 0))
            elif kind == UNION:
                branch, pos = _varint(buf, pos, end, 10, "union index")
                if not 0 <= branch < len(node.children):
                    raise DecodeError(f"Avro union index {branch} outside the writer schema's "
                                      f"{len(node.children)} branches")
                push((node.children[branch], depth + 1, 0))
            else:
                count, pos = _varint(buf, pos, end, 10, "block count")
                if count == 0:
                    continue
                if count < 0:  # a block with its size in bytes: the size is checked, then the items one by one
                    count = -count
                    size, pos = _varint(buf, pos, end, 10, "block size")
                    if size < 0 or size > end - pos:
                        raise DecodeError(f"Avro block size {size} at byte {pos} (payload of {end - start} bytes)")
                items += count
                if items > most_items:
                    raise DecodeError(f"Avro value of more than {most_items} array items and map entries (a block "
                                      f"claims {count}): over max_items")
                child = node.children[0]
                least = child.least + (1 if kind == MAP else 0)
                if count * least > end - pos:
                    raise DecodeError(f"Avro block of {count} items at byte {pos}: more than the {end - pos} bytes "
                                      "left can hold")
                if kind == ARRAY and child.fixed >= 0:  # items of one size (null: none): skipped at once
                    pos += count * child.fixed
                    push((node, depth, 0))
                else:
                    push((node, depth, count))
    if pos != end:
        raise DecodeError(f"{end - pos} bytes left after the record: not written with this schema")
    return items
