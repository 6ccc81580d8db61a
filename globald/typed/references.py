"""References between schemas, resolved so that each schema stands alone (the registry's cache files,
``globald.typed.registry``): Avro named types inlined at their first use, JSON Schema ``$ref``s replaced by what
they name. Pure functions on schemas as JSON."""

from __future__ import annotations

from typing import Any

AVRO_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


# The well-known types a Protobuf schema imports without a reference (Confluent's clients treat them as built in).
WELL_KNOWN = ("any", "duration", "empty", "field_mask", "struct", "timestamp", "wrappers")
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


def proto_file(name: str, serialized: str | None) -> bytes:
    """The FileDescriptorProto of a registry schema in its ``format=serialized`` form (base64), renamed to
    ``name``: the reference name its importers use (Confluent's deserializer renames it the same way)."""
    import base64
    import binascii

    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError as ProtoDecodeError

    try:
        proto = descriptor_pb2.FileDescriptorProto.FromString(base64.standard_b64decode((serialized or "").encode()))
    except (binascii.Error, ValueError, ProtoDecodeError) as e:
        raise ValueError(f"{name}: not a serialized FileDescriptorProto ({e})") from None
    proto.name = name
    return proto.SerializeToString()


def proto_descriptor_set(files: dict[str, bytes]) -> bytes:
    """A FileDescriptorSet of ``files`` (name -> FileDescriptorProto, imports before their importers) with the
    well-known types they import (google/protobuf/*, never sent as references) put first, checked by building it
    into a pool as a reader will: ValueError says what is missing."""
    import importlib

    from google.protobuf import descriptor_pb2, descriptor_pool

    for name in WELL_KNOWN:  # each module adds its file to the runtime's default pool
        importlib.import_module(f"google.protobuf.{name}_pb2")

    protos = [descriptor_pb2.FileDescriptorProto.FromString(b) for b in files.values()]
    known = descriptor_pool.Default()
    out = descriptor_pb2.FileDescriptorSet()
    for dep in sorted({d for p in protos for d in p.dependency if d not in files}):
        try:
            known.FindFileByName(dep).CopyToProto(out.file.add())
        except KeyError:
            raise ValueError(f"imports {dep}, which no reference names and which is not a well-known type") from None
    out.file.extend(protos)
    pool = descriptor_pool.DescriptorPool()
    try:
        for f in out.file:
            pool.Add(f)
        pool.FindFileByName(protos[-1].name)
    except Exception as e:  # the runtime raises several kinds for an inconsistent set
        raise ValueError(f"{type(e).__name__}: {e}") from None
    return out.SerializeToString()
