"""Can the reader schema read what each writer schema writes? Avro's schema resolution, checked on the schemas alone.

Why: a reader schema that cannot read a writer schema makes every value of that writer a decode error at run
time; ``check-config`` and ``run`` (``check_readers``) refuse it instead, naming the writer file and the field.
The rules are the specification's ("Schema Resolution"), as fastavro applies them when it reads:
- primitives alike, or promoted: int to long, float or double; long to float or double; float to double;
  string to bytes and bytes to string;
- records, enums and fixed of the same unqualified name (or a reader alias naming the writer's);
- a reader field the writer lacks needs a default (a writer field the reader lacks is skipped), matched by name or
  a reader field alias;
- every writer enum symbol in the reader's symbols, unless the reader's enum has a default; fixed of one size;
- arrays by their items, maps by their values;
- every branch of a writer union readable by the reader (a union: the first branch that matches it).
Where the specification resolves at run time (a union branch or an enum symbol only some values take), this is
stricter: it asks that every value the writer schema allows be readable.

Pure Python (json only): ``run`` checks without importing a decoding library into the daemon.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from globald.settings.typed_spec import SchemaError, read_schema_file, writer_files

if TYPE_CHECKING:
    from globald.settings.config import Config
    from globald.settings.typed_spec import ValueFormat

PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
PROMOTIONS = {("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"), ("long", "double"),
              ("float", "double"), ("string", "bytes"), ("bytes", "string")}
NAMED = ("record", "error", "enum", "fixed")


class Incompatible(ValueError):
    """The reader cannot read what the writer writes at ``path`` (a dotted field path, empty at the top)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{'field ' + path if path else 'the record'}: {reason}")


def _names(schema: Any) -> dict[str, dict[str, Any]]:
    """Every named type of ``schema`` by full and by short name."""
    found: dict[str, dict[str, Any]] = {}
    todo: list[tuple[Any, str]] = [(schema, "")]
    while todo:
        s, namespace = todo.pop()
        if isinstance(s, list):
            todo.extend((b, namespace) for b in s)
        elif isinstance(s, dict):
            kind = s.get("type")
            if kind in NAMED:
                name = str(s["name"])
                inner = str(s.get("namespace", name.rpartition(".")[0] if "." in name else namespace))
                full = name if "." in name else f"{inner}.{name}".lstrip(".")
                found[full] = s
                found.setdefault(_short(full), s)
                todo.extend((f["type"], inner) for f in s.get("fields", ()))
            elif kind == "array":
                todo.append((s["items"], namespace))
            elif kind == "map":
                todo.append((s["values"], namespace))
            elif isinstance(kind, dict | list):
                todo.append((kind, namespace))
    return found


def _short(name: str) -> str:
    return name.rpartition(".")[2]


class _Resolver:
    def __init__(self, writer: Any, reader: Any) -> None:
        self.w_names, self.r_names = _names(writer), _names(reader)
        self.seen: set[tuple[int, int]] = set()

    def deref(self, s: Any, names: dict[str, dict[str, Any]]) -> Any:
        """The schema ``s`` stands for: a name looked up, ``{"type": ...}`` around a primitive or a name unwrapped."""
        while True:
            if isinstance(s, str):
                if s in PRIMITIVES:
                    return s
                found = names.get(s, names.get(_short(s)))
                if found is None:
                    raise ValueError(f"unknown type name {s!r}")
                return found
            if isinstance(s, dict) and s.get("type") not in (*NAMED, "array", "map"):
                s = s["type"]  # {"type": "long", "logicalType": ...}, {"type": "Name"}, {"type": [...]}
            else:
                return s

    @staticmethod
    def kind(s: Any) -> str:
        if isinstance(s, str):
            return s
        if isinstance(s, list):
            return "union"
        return "record" if s["type"] == "error" else str(s["type"])

    def matches(self, w: Any, r: Any) -> bool:
        """Whether a reader union would pick ``r`` for ``w``: the same kind (and name), or a promotion."""
        wk, rk = self.kind(w), self.kind(r)
        if wk != rk:
            return (wk, rk) in PROMOTIONS
        return wk not in ("record", "enum", "fixed") or self.same_name(w, r)

    @staticmethod
    def same_name(w: dict[str, Any], r: dict[str, Any]) -> bool:
        wanted = _short(str(w["name"]))
        return wanted == _short(str(r["name"])) or wanted in {_short(str(a)) for a in r.get("aliases", ())}

    def resolve(self, w: Any, r: Any, path: str) -> None:
        w, r = self.deref(w, self.w_names), self.deref(r, self.r_names)
        wk, rk = self.kind(w), self.kind(r)
        if wk == "union":
            for branch in w:
                self.resolve(branch, r, path)
            return
        if rk == "union":
            for branch in r:
                b = self.deref(branch, self.r_names)
                if self.matches(w, b):
                    self.resolve(w, b, path)
                    return
            raise Incompatible(path, f"the writer's {self.describe(w)} matches no branch of the reader's union "
                                     f"{[self.describe(self.deref(b, self.r_names)) for b in r]}")
        if wk != rk:
            if (wk, rk) in PROMOTIONS:
                return
            raise Incompatible(path, f"the writer's {self.describe(w)} cannot be read as {self.describe(r)}")
        if wk in ("record", "enum", "fixed") and not self.same_name(w, r):
            raise Incompatible(path, f"the writer's {wk} {w['name']} is not the reader's {r['name']} (nor one of "
                                     "its aliases)")
        if wk == "record":
            self.record(w, r, path)
        elif wk == "enum":
            missing = [s for s in w["symbols"] if s not in r["symbols"]]
            if missing and "default" not in r:
                raise Incompatible(path, f"the writer's enum {w['name']} has symbols {missing} that the reader's "
                                         "lacks, and the reader's enum has no default")
        elif wk == "fixed" and int(w["size"]) != int(r["size"]):
            raise Incompatible(path, f"fixed {w['name']} of {w['size']} bytes read as {r['size']} bytes")
        elif wk == "array":
            self.resolve(w["items"], r["items"], f"{path}[]")
        elif wk == "map":
            self.resolve(w["values"], r["values"], f"{path}{{}}")

    def record(self, w: dict[str, Any], r: dict[str, Any], path: str) -> None:
        if (id(w), id(r)) in self.seen:  # a recursive type, being resolved further up
            return
        self.seen.add((id(w), id(r)))
        by_name = {f["name"]: f for f in w["fields"]}
        for field in r["fields"]:
            name = field["name"]
            found = by_name.get(name) or next((by_name[a] for a in field.get("aliases", ()) if a in by_name), None)
            at = f"{path}.{name}".lstrip(".")
            if found is not None:
                self.resolve(found["type"], field["type"], at)
            elif "default" not in field:
                raise Incompatible(at, "the writer schema has no such field and the reader's has no default")

    def describe(self, s: Any) -> str:
        kind = self.kind(s)
        return f"{kind} {s['name']}" if kind in ("record", "enum", "fixed") else kind


def resolve(writer: Any, reader: Any) -> None:
    """Raise Incompatible (naming the field) unless ``reader`` can read every value ``writer`` allows; both are
    parsed JSON schemas. ValueError for a schema this cannot follow (a type name it does not define)."""
    try:
        _Resolver(writer, reader).resolve(writer, reader, "")
    except Incompatible:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"not an Avro schema ({type(e).__name__}: {e})") from None


def check_format(fmt: ValueFormat, where: str, reader: Any | None = None) -> None:
    """SchemaError naming ``where.writer_schemas``, the writer file and the field, for the first writer schema of
    ``fmt`` (Avro with Confluent framing) its reader schema cannot read; ``reader``: the reader already parsed."""
    if fmt.format != "avro" or fmt.writer_schemas is None or fmt.schema is None:
        return
    if reader is None:
        reader = _json(fmt.schema, f"{where}.schema")
    for path in writer_files(fmt, where).values():
        try:
            resolve(_json(path, f"{where}.writer_schemas"), reader)
        except ValueError as e:
            raise SchemaError(f"{where}.writer_schemas", f"the reader schema {fmt.schema} cannot read writer "
                                                         f"schema {path}: {e}") from None


def check_readers(config: Config) -> None:
    """``check_format`` for every table's value and key: what ``run`` checks before it starts."""
    for i, t in enumerate(config.tables):
        for section, fmt in (("key", t.key), ("value", t.value)):
            if fmt is not None:
                check_format(fmt, f"tables[{i}].{section}")


def _json(path: Any, where: str) -> Any:
    try:
        return json.loads(read_schema_file(path, where))
    except ValueError as e:
        raise SchemaError(where, f"{path} is not a valid Avro schema (JSON: {e})") from None
