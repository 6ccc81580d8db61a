"""The reading commands: ``get``, ``dump`` and ``snapshots``. None takes the daemon's lock or changes anything.

``get`` and ``dump`` answer from one consistent version of a table (``globald.readview``); exit codes follow
``globald.exitcodes``: a key or table that is absent is NOT_FOUND, a version that cannot be served now UNAVAILABLE.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from globald import config as configmod
from globald import exitcodes
from globald.errors import GlobaldError, UsageError

if TYPE_CHECKING:
    from globald.readview import ReadView

# How dump writes keys and values. base64 is exact for any bytes; text is readable for UTF-8 keys and values.
DUMP_FORMATS = ("base64", "text")


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


def _consistent_view(cfg: configmod.Config, table: str) -> ReadView | None:
    """The version get and dump answer from; None, once the reason is printed, when none can be served now."""
    from globald import readview

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
    from globald import readview

    cfg = configmod.load(args.config)
    table = cfg.table(args.table)
    view = (readview.open_snapshot_view(cfg, table.name, args.snapshot) if args.snapshot is not None
            else _consistent_view(cfg, table.name))
    if view is None:
        return exitcodes.UNAVAILABLE
    with view:
        _announce(view, args.json)
        out, written = sys.stdout, 0
        try:
            for line in dump_lines(view.items(), args.format):
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
    if ts < 0:
        return "none (the record carried no timestamp)"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts / 1000)) + f".{ts % 1000:03d}Z ({ts})"


def cmd_get(args: argparse.Namespace) -> int:
    cfg = configmod.load(args.config)
    table = cfg.table(args.table)
    key = parse_key(args.key, args.key_format)
    view = _consistent_view(cfg, table.name)
    if view is None:
        return exitcodes.UNAVAILABLE
    with view:
        found = view.get(key)
    _announce(view, as_json=False)
    if args.json:
        doc: dict[str, Any] = {**view.describe(), "key_base64": _b64(key), "found": found is not None}
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
    return exitcodes.OK if found is not None else exitcodes.NOT_FOUND


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
