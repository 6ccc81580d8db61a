"""The config checks ``globald run`` and ``globald check-config`` share: each names the key at fault in one line
(``ConfigError``, exit 2) before anything is written to the state_dir."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from globald.common import exitcodes
from globald.common.errors import ConfigError
from globald.settings import config as configmod
from globald.settings import registry as registry_settings
from globald.settings import spec as configspec
from globald.settings.kafka_properties import check_kafka_properties, redact


def check_export_uri(cfg: configmod.Config) -> None:
    """An [export] uri pyarrow cannot make a filesystem of (a typo in an option) is a config error, exit 2;
    storage that is only unreachable is not (the daemon serves and restores from the topic meanwhile)."""
    if cfg.export is None:
        return
    from globald.export.target import check_uri

    try:
        check_uri(cfg.export.uri)
    except ValueError as e:
        raise ConfigError("export.uri", str(e)) from None


def check_typed(cfg: configmod.Config) -> None:
    """The typed tables' schemas checked as check-config does, in a process of its own (``globald.typed.check``):
    a missing schema file is a config error now (exit 2), not an error logged at every decode."""
    if cfg.source is None or not any(t.typed for t in cfg.tables):
        return
    import subprocess

    from globald.typed import check as typed_check

    done = subprocess.run([sys.executable, "-m", typed_check.__name__, "--config", str(cfg.source)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if done.returncode != exitcodes.OK:
        line = (done.stderr.strip().splitlines() or [""])[-1].removeprefix("globald: config error: ")
        key, sep, message = line.partition(": ")
        if done.returncode == exitcodes.USAGE and sep:
            raise ConfigError(key, message)
        raise ConfigError("tables", f"the typed schema check failed (exit {done.returncode}): {line}")


def cmd_check_config(args: argparse.Namespace) -> int:
    if args.keys:
        if args.json:
            print(json.dumps([k.as_json() for k in configspec.declared_keys(configmod.Config)]))
        else:
            print(configspec.reference(configmod.Config))
        return exitcodes.OK
    if args.config is None:  # optional only so that --keys needs no file
        raise ConfigError("--config", "is required (or pass --keys to list the config keys)")
    from globald.store.statedir import check_state_dir
    from globald.typed import check_schemas
    from globald.typed.registry import check_registry

    cfg = configmod.load(args.config)
    check_kafka_properties(cfg)
    check_export_uri(cfg)
    # The registry answers, with these credentials, and has every subject named; for a reload's check
    # (--registry-outage-ok), a registry in trouble is said, not refused: run starts through it too.
    outage = check_registry(cfg, outage_ok=args.registry_outage_ok)
    if outage is not None:
        print(f"globald: warning: {outage}", file=sys.stderr)
    check_schemas(cfg)  # every schema file read and mapped to its column type: SchemaError names key and file
    note = check_state_dir(cfg.state_dir)  # what run needs of it: created (or a directory), written, locked
    summary: dict[str, Any] = {
        "ok": True,
        "state_dir": str(cfg.state_dir),
        "state_dir_note": note,
        "tables": {t.name: t.topic for t in cfg.tables},
        "kafka": redact(cfg.kafka),
        "registry": registry_settings.redact(cfg.registry),
    }
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(f"{args.config}: OK ({len(cfg.tables)} table(s), state_dir {cfg.state_dir})")
        if note:
            print(f"  note: {note}")
    return exitcodes.OK
