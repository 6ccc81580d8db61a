"""The reading commands: ``get``, ``dump`` and ``snapshots``. None takes the daemon's lock or changes anything.

``get`` and ``dump`` answer from one consistent version of a table (``globald.cli.readview``); exit codes
follow ``globald.common.exitcodes``: a key or table that is absent is NOT_FOUND, a version that cannot be served
now UNAVAILABLE.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from itertools import islice
from typing import TYPE_CHECKING, Any

from globald.common import exitcodes
from globald.common.errors import GlobaldError, UsageError
from globald.settings import config as configmod

if TYPE_CHECKING:
    from globald.cli.readview import ReadView
    from globald.typed.arrow import Decoder

# How dump writes keys and values. base64 is exact for any bytes; text is readable for UTF-8 keys and values.
DUMP_FORMATS = ("base64", "text")
DECODE_HELP = ("decode the value (and the key) by the table's [tables.value] / [tables.key] format and print it as "
               "JSON: timestamps and dates ISO 8601, decimals as strings, bytes base64; a value that does not decode "
               "is null with an \"error\" saying why (on_error = \"fail\": exit 5 naming the key). get --decode on a "
               "table whose [tables.key] is typed takes KEY as the decoded key (its text; an integer key its decimal "
               "text) and finds it by decoding every key of the table (with --as-of: every stored key's version "
               "then, tombstones included, merged: the as-of fold over the decoded key)")
DECODE_BATCH = 4096  # records decoded per Arrow batch by dump --decode
AS_OF_HELP = ("answer as of this record time, from a versioned table's history ([[tables]] history; docs/as-of.md): "
              "ISO 8601 (2026-11-29T17:00:00Z; without a zone, UTC) or epoch milliseconds. The answer is the record "
              "with the greatest (timestamp, offset) at or before TIME; a tombstone there is absent. A TIME before "
              "the table's history since is refused (exit 3), never guessed")


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _text_or_b64(doc: dict[str, Any], field: str, data: bytes) -> None:
    """``field`` as a JSON string when ``data`` is UTF-8, else ``field_base64``: a reader never guesses."""
    try:
        doc[field] = data.decode("utf-8")
    except UnicodeDecodeError:
        doc[f"{field}_base64"] = _b64(data)


def dump_lines(items: Iterator[tuple[bytes, bytes, int]], fmt: str = "base64") -> Iterator[str]:
    """One JSON object per record. ``text``: non-ASCII stays as it is; quotes, backslashes and control characters
    are escaped as JSON escapes them (\\", \\\\, \\n, \\t, \\u001b)."""
    for key, value, ts in items:
        if fmt == "text":
            doc: dict[str, Any] = {}
            _text_or_b64(doc, "key", key)
            _text_or_b64(doc, "value", value)
            doc["timestamp"] = ts
            yield json.dumps(doc, ensure_ascii=False)
        else:
            yield json.dumps({"key": _b64(key), "value": _b64(value), "timestamp": ts})


def decoded_lines(items: Iterable[tuple[bytes, bytes, int]], keys: Decoder, values: Decoder,
                  origin: Callable[[bytes, bytes, int], tuple[int, int] | None] | None = None) -> Iterator[str]:
    """``dump --decode``: one JSON object per record, key and value decoded (a raw key as text, or key_base64)."""
    import pyarrow as pa

    from globald.typed.arrow import RecordContext, jsonable, python_rows

    records = iter(items)
    while batch := list(islice(records, DECODE_BATCH)):
        raw_keys = [k for k, _, _ in batch]
        context = RecordContext(keys=raw_keys, origin=None if origin is None else
                                lambda row, batch=batch: origin(*batch[row]))  # type: ignore[misc]
        shown_keys = (python_rows(keys.decode(pa.array(raw_keys, pa.binary()), context).values) if keys.typed
                      else None)
        decoded = values.decode(pa.array([v for _, v, _ in batch], pa.binary()), context)
        rows, errors = python_rows(decoded.values), decoded.errors.to_pylist()
        for i, (key, _, ts) in enumerate(batch):
            doc: dict[str, Any] = {}
            if shown_keys is None:
                _text_or_b64(doc, "key", key)
            else:
                doc["key"] = jsonable(shown_keys[i])
            doc["value"] = jsonable(rows[i])
            if errors[i] is not None:
                doc["error"] = errors[i]
            doc["timestamp"] = ts
            yield json.dumps(doc, ensure_ascii=False)


def _decoders(cfg: configmod.Config, table: str, decode: bool) -> tuple[Decoder, Decoder] | None:
    if not decode:
        return None
    from globald.typed import load_table

    return load_table(cfg, table)


def _consistent_view(cfg: configmod.Config, table: str) -> ReadView | None:
    """The version get and dump answer from; None, once the reason is printed, when none can be served now."""
    from globald.cli import readview

    try:
        return readview.open_view(cfg, table)
    except readview.TableUnavailableError as e:
        print(f"globald: {e}", file=sys.stderr)
        return None


def _announce(view: ReadView, as_json: bool) -> None:
    """Where the answer comes from, on stderr: stdout stays the answer alone (dump's stays pure JSON lines)."""
    if as_json:
        print(json.dumps(view.describe(), sort_keys=True), file=sys.stderr)
        return
    note = view.note()
    if note:
        print(note, file=sys.stderr)


def cmd_dump(args: argparse.Namespace) -> int:
    from globald.cli import readview

    cfg = configmod.load(args.config)
    table = cfg.table(args.table)
    decoders = _decoders(cfg, table.name, args.decode)  # a bad schema is exit 2 before anything is opened
    at = parse_time(args.as_of)
    view = (readview.open_snapshot_view(cfg, table.name, args.snapshot) if args.snapshot is not None
            else _consistent_view(cfg, table.name))
    if view is None:
        return exitcodes.UNAVAILABLE
    with view:
        if _as_of_refused(view, at):
            return exitcodes.UNAVAILABLE
        _announce(view, args.json)
        out, written = sys.stdout, 0
        try:
            items = view.items() if at is None else view.items_as_of(at)
            lines = (dump_lines(items, args.format) if decoders is None
                     else decoded_lines(items, *decoders, view.origin))
            for line in lines:
                out.write(line + "\n")
                written += 1
        except GlobaldError as e:  # lines already written cannot be taken back: say they are not the table
            raise GlobaldError(f"dump of {table.name} incomplete after {written} record(s), discard it: {e}") from None
    return exitcodes.OK


def parse_key(text: str, fmt: str) -> bytes:
    try:
        if fmt == "base64":
            return base64.b64decode(text, validate=True)
        if fmt == "hex":
            return bytes.fromhex(text)
    except (ValueError, binascii.Error) as e:
        raise UsageError(f"KEY {text!r} is not valid {fmt} (--key-format {fmt}): {e}") from None
    return text.encode("utf-8")


def _timestamp_text(ts: int) -> str:
    from globald.store.history import time_text

    return "none (the record carried no timestamp)" if ts < 0 else time_text(ts)


def parse_time(text: str | None) -> int | None:
    """``--as-of``'s TIME as epoch milliseconds: digits are milliseconds, else ISO 8601 (UTC without a zone)."""
    if text is None:
        return None
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--as-of {text!r} is neither ISO 8601 (2026-11-29T17:00:00Z) nor epoch milliseconds"
                         ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000) if when.microsecond == 0 else (
        int(when.replace(microsecond=0).timestamp()) * 1000 + when.microsecond // 1000)


def _as_of_refused(view: ReadView, at: int | None) -> bool:
    """Print why ``view`` cannot answer as of ``at``, one line on stderr; False when it can (or no --as-of)."""
    why = None if at is None else view.history_refusal(at)
    if why is not None:
        print(f"globald: {why}", file=sys.stderr)
    return why is not None


def cmd_get(args: argparse.Namespace) -> int:
    cfg = configmod.load(args.config)
    table = cfg.table(args.table)
    key = parse_key(args.key, args.key_format)
    decoders = _decoders(cfg, table.name, args.decode)
    at = parse_time(args.as_of)
    view = _consistent_view(cfg, table.name)
    if view is None:
        return exitcodes.UNAVAILABLE
    with view:
        if _as_of_refused(view, at):
            return exitcodes.UNAVAILABLE
        if decoders is not None and decoders[0].typed:
            key, found = _find_decoded(view, key, decoders[0], at)
        else:
            found = view.get(key) if at is None else view.as_of(key, at)
        if decoders is not None and found is not None:  # inside: an error's origin is read from the same view
            _announce(view, as_json=False)
            return _print_decoded(view, key, found, decoders[1], args.json)
    _announce(view, as_json=False)
    if args.json:
        doc: dict[str, Any] = {**view.describe(), "key_base64": _b64(key), "found": found is not None}
        if at is not None:
            doc["as_of"] = at
        if found is not None:
            value, ts = found
            doc.update(value_base64=_b64(value), timestamp=ts)
            try:
                doc["value"] = value.decode("utf-8")
            except UnicodeDecodeError:
                doc["value"] = None
        print(json.dumps(doc, sort_keys=True))
    elif found is None:
        print(f"{table.name}: key {args.key!r} not found", file=sys.stderr)
    else:
        value, ts = found
        try:
            shown = value.decode("utf-8")
        except UnicodeDecodeError:
            shown = f"(binary, {len(value)} bytes) base64:{_b64(value)}"
        print(f"value:     {shown}")
        print(f"timestamp: {_timestamp_text(ts)}")
        if decoders is None and table.value is not None and table.value.typed:
            # On stderr: a script reading stdout gets the stored bytes as before; a person learns the flag exists.
            print(f"globald: {table.name}'s values are {table.value.format} (the stored bytes are shown): add "
                  "--decode to print them decoded", file=sys.stderr)
    return exitcodes.OK if found is not None else exitcodes.NOT_FOUND


def _find_decoded(view: ReadView, wanted: bytes, keys: Decoder, at: int | None = None
                  ) -> tuple[bytes, tuple[bytes, int] | None]:
    """(stored key, (value, timestamp)) of the record whose decoded key is ``wanted``: the store is keyed by the raw
    bytes, so every key is decoded (a scan). Of stored keys decoding alike the latest is answered, as in Spark;
    ``at``: of their versions in force then, tombstones included (the as-of fold over the decoded key)."""
    from globald.typed.keys import find_decoded, require_canonical

    require_canonical(keys, view.table)
    record, shadowed = find_decoded(view.items() if at is None else view.versions_as_of(at), keys, wanted)
    if record is None or record[1] is None:  # absent, or (as of a time) deleted then
        return wanted if record is None else record[0], None
    if shadowed:
        print(f"globald: {shadowed} other stored key(s) of {view.table} decode to the same key; answering the one "
              "with the latest timestamp", file=sys.stderr)
    return record[0], (record[1], record[2])


def _print_decoded(view: ReadView, key: bytes, found: tuple[bytes, int], values: Decoder, as_json: bool) -> int:
    """``get --decode``: the value decoded, as JSON; one that does not decode is null with the reason (exit 0:
    the key is there) with the origin its typed store recorded, or under on_error = "fail" a DecodeFailure naming the
    key, partition and offset (exit 5)."""
    import pyarrow as pa

    from globald.typed.arrow import RecordContext, jsonable, python_rows

    value, ts = found
    decoded = values.decode(pa.array([value], pa.binary()),
                            RecordContext(keys=[key], origin=lambda _: view.origin(key, value, ts)))
    shown, error = jsonable(python_rows(decoded.values)[0]), decoded.errors[0].as_py()
    origin = None if error is None else view.origin(key, value, ts)
    if as_json:
        where = None if origin is None else {"partition": origin[0], "offset": origin[1]}
        print(json.dumps({**view.describe(), "key_base64": _b64(key), "found": True, "value_base64": _b64(value),
                          "timestamp": ts, "value": shown, "error": error, "origin": where}, sort_keys=True,
                         ensure_ascii=False))
        return exitcodes.OK
    print(f"value:     {json.dumps(shown, ensure_ascii=False)}")
    if error is not None:
        print(f"error:     {error}")
        if origin is not None:
            print(f"origin:    partition {origin[0]}, offset {origin[1]}")
    print(f"timestamp: {_timestamp_text(ts)}")
    return exitcodes.OK


def cmd_snapshots(args: argparse.Namespace) -> int:
    from globald.snapshot.reader import listing
    from globald.store.names import db_dir

    cfg = configmod.load(args.config)
    table = cfg.table(args.table)
    snaps = listing(cfg.state_dir, table.name)
    if args.json:
        print(json.dumps(snaps, sort_keys=True))
    for s in [] if args.json else snaps:
        offsets = ", ".join(f"p{p}={o}" for p, o in s["offsets"].items()) or "no offsets"
        marks = ("  CURRENT" if s["current"] else "") + ("  STALE" if s["stale"] else "")
        print(f"{s['id']}  {offsets}{marks}")
    if snaps:
        return exitcodes.OK
    has_store = (db_dir(cfg.state_dir, table.name) / "CURRENT").exists()
    why = ("the daemon publishes one once the table is RUNNING" if has_store else
           "it has no store either: no daemon has restored it under this state_dir yet")
    print(f"globald: table {table.name} has no snapshot under {cfg.state_dir} ({why})", file=sys.stderr)
    return exitcodes.NOT_FOUND
