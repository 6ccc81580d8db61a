"""References between schemas, resolved so that each schema stands alone (the registry's cache files,
``globald.typed.registry``): Avro named types inlined at their first use, JSON Schema ``$ref``s replaced by what
they name. Pure functions on schemas as JSON."""

from __future__ import annotations

from typing import Any

AVRO_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


MAX_REF_DEPTH = 64  # a recursive JSON Schema has no column type: refused past this depth


def dereference(node: Any, root: Any, docs: dict[str, Any], depth: int) -> Any:
    """``node`` with every ``$ref`` replaced: ``#/a/b`` by that place in ``root``, ``name#/a`` or ``name`` by
    that place in the referenced document ``docs[name]``."""
    if isinstance(node, list):
        return [dereference(v, root, docs, depth) for v in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str):
        if depth > MAX_REF_DEPTH:
            raise ValueError(f"$ref {ref!r} nested over {MAX_REF_DEPTH} deep (a recursive schema?)")
        name, _, pointer = ref.partition("#")
        target_root = root if not name else docs[name]
        target = target_root
        for part in (p for p in pointer.split("/") if p):
            part = part.replace("~1", "/").replace("~0", "~")
            target = target[int(part)] if isinstance(target, list) else target[part]
        rest = {k: v for k, v in node.items() if k != "$ref"}
        resolved = dereference(target, target_root, docs, depth + 1)
        return {**resolved, **dereference(rest, root, docs, depth)} if isinstance(resolved, dict) else resolved
    return {k: dereference(v, root, docs, depth) for k, v in node.items()}


def inline(schema: Any, named: dict[str, Any], seen: set[str] | None = None, namespace: str = "") -> Any:
    """An Avro schema (as JSON) with each name of ``named`` (a reference's full name -> its schema) replaced by its
    definition where first used; later uses stay names, as Avro requires."""
    seen = set() if seen is None else seen
    if isinstance(schema, str):
        if schema in AVRO_PRIMITIVES:
            return schema
        full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
        key = full if full in named else schema if schema in named else None
        if key is None or key in seen:
            return schema
        seen.add(key)
        return inline(named[key], named, seen, key.rpartition(".")[0])
    if isinstance(schema, list):
        return [inline(b, named, seen, namespace) for b in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    name = out.get("name")
    if isinstance(name, str) and out.get("type") in ("record", "error", "enum", "fixed"):
        namespace = name.rpartition(".")[0] if "." in name else out.get("namespace", namespace)
        seen.add(name if "." in name else f"{namespace}.{name}".lstrip("."))
    if "fields" in out:
        out["fields"] = [{**f, "type": inline(f["type"], named, seen, namespace)} for f in out["fields"]]
    for part in ("items", "values"):
        if part in out:
            out[part] = inline(out[part], named, seen, namespace)
    if isinstance(out.get("type"), dict | list) or (isinstance(out.get("type"), str) and "fields" not in out
                                                    and out["type"] not in ("enum", "fixed", "array", "map")):
        out["type"] = inline(out["type"], named, seen, namespace)
    return out
