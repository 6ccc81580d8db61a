"""The ``globald`` command line. Config errors print one line naming the key and exit 2."""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

from globald import config as configmod
from globald.errors import ConfigError, GlobaldError, StateDirError, StateDirLockedError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def dump_lines(items: Iterator[tuple[bytes, bytes, int]]) -> Iterator[str]:
    for key, value, ts in items:
        yield json.dumps({"key": _b64(key), "value": _b64(value), "timestamp": ts})


def cmd_run(args: argparse.Namespace) -> int:
    from globald import logs
    from globald.daemon import Daemon

    cfg = configmod.load(args.config)
    configmod.check_kafka_properties(cfg)
    secrets = [str(v) for k, v in cfg.kafka.items() if configmod.is_secret(k)]
    logs.setup(cfg.log_level, cfg.log_format, secrets)
    return Daemon(cfg).run()


def cmd_status(args: argparse.Namespace) -> int:
    from globald import statusfile

    doc = statusfile.current(configmod.load(args.config))
    if args.json:
        print(json.dumps(doc, indent=None, sort_keys=True))
        return EXIT_OK
    print(f"globald: {doc['state']}" + (f" (pid {doc['pid']})" if doc.get("pid") else ""))
    if doc.get("degraded"):
        print(f"  degraded: {doc['degraded']}")
    for name, t in doc.get("tables", {}).items():
        offsets = ", ".join(f"p{p}={o}" for p, o in t.get("offsets", {}).items()) or "no offsets"
        lag = f", lag {t['lag']}" if "lag" in t else ""
        print(f"  {name:<20} {t['state']:<12} {offsets}{lag}")
        snap = t.get("snapshot")
        if snap and snap.get("current"):
            stale = f"  STALE: {snap.get('stale_reason')}" if snap.get("stale") else ""
            print(f"  {'':<20} snapshot {snap['current']}{stale}")
    return EXIT_OK


def cmd_dump(args: argparse.Namespace) -> int:
    from globald.store.names import db_dir
    from globald.store.reader import StoreReader

    cfg = configmod.load(args.config)
    table = cfg.table(args.table)
    if args.snapshot is not None:
        return _dump_snapshot(cfg, table.name, args.snapshot)
    path = db_dir(cfg.state_dir, table.name)
    if not (path / "CURRENT").exists():
        raise GlobaldError(f"table {table.name} has no store yet under {cfg.state_dir}")
    with StoreReader(path) as reader:
        out = sys.stdout
        for line in dump_lines(reader.items()):
            out.write(line + "\n")
    return EXIT_OK


def _dump_snapshot(cfg: configmod.Config, table: str, snapshot: str) -> int:
    from globald.snapshot.reader import open_snapshot

    with open_snapshot(cfg.state_dir, table, snapshot) as snap:
        out = sys.stdout
        for line in dump_lines(iter(snap)):
            out.write(line + "\n")
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
        offsets = ", ".join(f"p{p}={o}" for p, o in s["offsets"].items()) or "no offsets"  # type: ignore[attr-defined]
        marks = ("  CURRENT" if s["current"] else "") + ("  STALE" if s["stale"] else "")
        print(f"{s['id']}  {offsets}{marks}")
    return EXIT_OK


def cmd_check_config(args: argparse.Namespace) -> int:
    cfg = configmod.load(args.config)
    configmod.check_kafka_properties(cfg)
    summary: dict[str, Any] = {
        "ok": True,
        "state_dir": str(cfg.state_dir),
        "tables": {t.name: t.topic for t in cfg.tables},
        "kafka": configmod.redact(cfg.kafka),
    }
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(f"{args.config}: OK ({len(cfg.tables)} table(s), state_dir {cfg.state_dir})")
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
    sn = add("snapshots", cmd_snapshots, "list a table's published snapshots, newest first", json_flag=True)
    sn.add_argument("--table", required=True)
    add("check-config", cmd_check_config, "validate a config file and exit", json_flag=True)
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

