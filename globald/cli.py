"""The ``globald`` command line. Config errors print one line naming the key and exit 2."""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from globald import config as configmod
from globald import configspec
from globald.errors import ConfigError, GlobaldError, StateDirError, StateDirLockedError, UnknownTableError
from globald.kafka.properties import check_kafka_properties, redact, secret_values

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
# get/dump: no consistent version of the table can be served now (rebuilding with serve_stale off, or nothing
# published yet). Distinct from EXIT_FAILURE so that "key not found" never looks like "ask again later".
EXIT_UNAVAILABLE = 3

if TYPE_CHECKING:
    from globald.readview import ReadView


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def dump_lines(items: Iterator[tuple[bytes, bytes, int]]) -> Iterator[str]:
    for key, value, ts in items:
        yield json.dumps({"key": _b64(key), "value": _b64(value), "timestamp": ts})


def cmd_run(args: argparse.Namespace) -> int:
    from globald import logs
    from globald.daemon import Daemon

    cfg = configmod.load(args.config)
    check_kafka_properties(cfg)
    logs.setup(cfg.log_level, cfg.log_format, secret_values(cfg))
    return Daemon(cfg).run()


def cmd_status(args: argparse.Namespace) -> int:
    from globald import statusfile

    doc = statusfile.current(configmod.load(args.config))
    if args.json:
        print(json.dumps(doc.to_json(), indent=None, sort_keys=True))
        return EXIT_OK
    print("\n".join(statusfile.status_lines(doc)))
    return EXIT_OK


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
        return EXIT_UNAVAILABLE
    with view:
        _announce(view, args.json)
        out, written = sys.stdout, 0
        try:
            for line in dump_lines(view.items()):
                out.write(line + "\n")
                written += 1
        except GlobaldError as e:  # lines already written cannot be taken back: say they are not the table
            raise GlobaldError(f"dump of {table.name} incomplete after {written} record(s), discard it: {e}") from None
    return EXIT_OK


def _parse_key(text: str, fmt: str) -> bytes:
    try:
        if fmt == "base64":
            return base64.b64decode(text, validate=True)
        if fmt == "hex":
            return bytes.fromhex(text)
    except ValueError as e:
        raise ConfigError("KEY", f"not valid {fmt}: {e}") from None
    return text.encode("utf-8")


def _timestamp_text(ts: int) -> str:
    if ts < 0:
        return "none (the record carried no timestamp)"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts / 1000)) + f".{ts % 1000:03d}Z ({ts})"


def cmd_get(args: argparse.Namespace) -> int:
    cfg = configmod.load(args.config)
    table = cfg.table(args.table)
    key = _parse_key(args.key, args.key_format)
    view = _consistent_view(cfg, table.name)
    if view is None:
        return EXIT_UNAVAILABLE
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
    return EXIT_OK if found is not None else EXIT_FAILURE


def cmd_reset(args: argparse.Namespace) -> int:
    from globald.ops.reset import reset_table

    cfg = configmod.load(args.config)
    table = cfg.table(args.table)
    if not args.yes:
        if not sys.stdin.isatty():
            print(f"globald: refusing to wipe table {table.name} without confirmation; pass --yes", file=sys.stderr)
            return EXIT_USAGE
        print(f"This wipes table {table.name} (topic {table.topic}) under {cfg.state_dir}; it is then restored "
              "from the log start.", file=sys.stderr)
        if input(f"Type the table name ({table.name}) to confirm: ").strip() != table.name:
            print("globald: not confirmed; nothing was wiped", file=sys.stderr)
            return EXIT_FAILURE
    result = reset_table(cfg, table.name, timeout=args.timeout)
    if args.json:
        print(json.dumps({"table": result.table, "by": result.by, "pid": result.pid, "had_store": result.had_store},
                         sort_keys=True))
    else:
        print(result.describe())
    return EXIT_OK


def cmd_snapshots(args: argparse.Namespace) -> int:
    from globald.snapshot.reader import listing

    cfg = configmod.load(args.config)
    table = cfg.table(args.table)
    snaps = listing(cfg.state_dir, table.name)
    if args.json:
        print(json.dumps(snaps, sort_keys=True))
        return EXIT_OK
    for s in snaps:
        offsets = ", ".join(f"p{p}={o}" for p, o in s["offsets"].items()) or "no offsets"
        marks = ("  CURRENT" if s["current"] else "") + ("  STALE" if s["stale"] else "")
        print(f"{s['id']}  {offsets}{marks}")
    return EXIT_OK


def cmd_check_config(args: argparse.Namespace) -> int:
    if args.keys:
        if args.json:
            print(json.dumps([k.as_json() for k in configspec.declared_keys(configmod.Config)]))
        else:
            print(configspec.reference(configmod.Config))
        return EXIT_OK
    if args.config is None:  # optional only so that --keys needs no file
        raise ConfigError("--config", "is required (or pass --keys to list the config keys)")
    cfg = configmod.load(args.config)
    check_kafka_properties(cfg)
    summary: dict[str, Any] = {
        "ok": True,
        "state_dir": str(cfg.state_dir),
        "tables": {t.name: t.topic for t in cfg.tables},
        "kafka": redact(cfg.kafka),
    }
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(f"{args.config}: OK ({len(cfg.tables)} table(s), state_dir {cfg.state_dir})")
    return EXIT_OK


def _offsets_text(offsets: dict[int, int]) -> str:
    return ", ".join(f"p{p}={o}" for p, o in sorted(offsets.items())) or "none"


def cmd_migrate(args: argparse.Namespace) -> int:
    from globald.migrate import migrate

    report = migrate(configmod.load(args.config), args.table)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    for name, r in report.items():
        if args.json:
            break
        if "error" in r:
            print(f"{name}: unusable store: {r['error']}")
        elif r["imported"]:
            print(f"{name}: imported offsets {_offsets_text(r['imported'])} ({r['note']}); store format {r['format']}")
        else:
            held = f"; offsets {_offsets_text(r['offsets'])}" if r.get("offsets") else ""
            print(f"{name}: nothing imported: {r['note']}{held}")
    return EXIT_FAILURE if any("error" in r for r in report.values()) else EXIT_OK


def cmd_import_kafka_streams(args: argparse.Namespace) -> int:
    from pathlib import Path

    from globald.kstreams import import_store

    r = import_store(configmod.load(args.config), Path(args.state_dir), args.application_id, args.store,
                     args.table, replace=args.replace)
    if args.json:
        print(json.dumps(r, sort_keys=True))
    else:
        print(f"{r['table']}: imported {r['source']} at offsets {_offsets_text(r['offsets'])}: "
              f"{r['timestamped_values']} timestamped and {r['plain_values']} plain values, store format {r['format']}")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from globald.embedded.demo import main as demo_main

    return demo_main()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="globald", description="Mirror compacted Kafka topics into local RocksDB stores.")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_: str, config: bool = True,
            json_flag: bool = False) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_)
        if config:
            sp.add_argument("--config", required=True, metavar="FILE", help="globald TOML config")
        if json_flag:
            sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.set_defaults(func=fn)
        return sp

    add("run", cmd_run, "run the daemon in the foreground")
    add("status", cmd_status, "show the daemon's and each table's state and offsets", json_flag=True)
    d = add("dump", cmd_dump, "print a table's committed content as JSON lines")
    d.add_argument("--table", required=True)
    d.add_argument("--snapshot", metavar="ID", help="dump this published snapshot instead of the live store")
    d.add_argument("--json", action="store_true",
                   help="say where the content comes from (source, snapshot, offsets) as one JSON line on stderr")
    g = add("get", cmd_get, "print the value and timestamp of one key (exit 1 when absent)", json_flag=True)
    g.add_argument("--table", required=True)
    g.add_argument("--key-format", choices=("text", "base64", "hex"), default="text",
                   help="how KEY is written (default: UTF-8 text)")
    g.add_argument("key", metavar="KEY")
    r = add("reset", cmd_reset, "wipe a table so it is restored from the log start (through the daemon if one runs)",
            json_flag=True)
    r.add_argument("--table", required=True)
    r.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    r.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a running daemon (default 30)")
    sn = add("snapshots", cmd_snapshots, "list a table's published snapshots, newest first", json_flag=True)
    sn.add_argument("--table", required=True)
    cc = add("check-config", cmd_check_config, "validate a config file and exit", config=False, json_flag=True)
    cc.add_argument("--config", metavar="FILE", help="globald TOML config")
    cc.add_argument("--keys", action="store_true",
                    help="list every config key with its type, bounds, default and help, and exit")
    m = add("migrate", cmd_migrate, "take .checkpoint offsets into stores that lack them, and report", json_flag=True)
    m.add_argument("--table", help="only this table")
    k = add("import-kafka-streams", cmd_import_kafka_streams, "adopt a Kafka Streams global store as a table's store",
            json_flag=True)
    k.add_argument("--state-dir", required=True, metavar="DIR", help="the Kafka Streams state.dir")
    k.add_argument("--application-id", required=True, metavar="ID")
    k.add_argument("--store", required=True, metavar="NAME", help="the global store's name")
    k.add_argument("--table", required=True, metavar="TABLE", help="the globald table that mirrors its topic")
    k.add_argument("--replace", action="store_true", help="replace the table's existing store")
    add("demo", cmd_demo, "run the self-contained demo on an embedded Kafka", config=False)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as e:
        print(f"globald: config error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except UnknownTableError as e:  # a --table naming no configured table: a usage error, like a bad key
        print(f"globald: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (StateDirLockedError, StateDirError) as e:
        print(f"globald: {e}", file=sys.stderr)
        return EXIT_USAGE if isinstance(e, StateDirError) else EXIT_FAILURE
    except GlobaldError as e:
        print(f"globald: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

