"""``globald import-kafka-streams``: a Kafka Streams global store becomes a table's store, with no re-read of the topic.

Contract: nothing under the state_dir changes until the copy is complete, its offsets (from Kafka Streams' global
``.checkpoint``) are within the topic's log bounds and it opens as a globald store; the switch-over is then two
renames, made once the copy is on disk and durable themselves (a power loss finds the old store or the new one). The
Kafka Streams directory is only read: its immutable table files are hard-linked, everything else copied.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from globald.common.errors import ConfigError, ImportRefusedError, StoreCorruptError
from globald.kafka.clients import TransientKafkaError, log_bounds
from globald.settings.config import TOPIC_NAME_RE, Config
from globald.store import checkpoint_file, durable, layout
from globald.store.names import (
    COLUMN_FAMILIES,
    DEFAULT_CF,
    FORMAT_MIXED,
    FORMAT_TIMESTAMPED,
    IMPORT_PREFIX,
    KS_TIMESTAMPED_CF,
    REPLACED_PREFIX,
    VALUES_CF,
    checkpoint_path,
    db_dir,
    kafka_streams_checkpoint,
    kafka_streams_store_dir,
    table_dir,
    tables_dir,
)
from globald.store.offline import OfflineStore, open_offline
from globald.store.options import StoreOptions
from globald.store.statedir import lock_state_dir, prepare_state_dir
from globald.store.table_store import TableStore

log = logging.getLogger(__name__)

COPY_BATCH = 10_000
_IMMUTABLE_SUFFIXES = (".sst", ".blob")  # never rewritten by RocksDB, so a hard link is as good as a copy
_SKIPPED_FILES = ("LOCK", "LOG")  # the owner's lock and its info logs (LOG, LOG.old.*)


def import_store(config: Config, ks_state_dir: Path, application_id: str, store: str, table: str,
                 replace: bool = False) -> dict[str, Any]:
    """Install the Kafka Streams global store ``store`` as ``table``'s store; returns what was imported."""
    for flag, name in (("--application-id", application_id), ("--store", store)):
        if not TOPIC_NAME_RE.match(name) or name in {".", ".."}:
            raise ConfigError(flag, f"{name!r} is not a Kafka Streams name (letters, digits, '.', '_', '-')")
    tc = config.table(table)
    source = kafka_streams_store_dir(ks_state_dir, application_id, store)
    offsets = _checkpointed_offsets(kafka_streams_checkpoint(ks_state_dir, application_id), tc.topic)
    if not (source / "CURRENT").is_file():
        raise ImportRefusedError(f"no RocksDB store at {source}")
    _refuse_if_open(source)
    prepare_state_dir(config.state_dir)
    lock = lock_state_dir(config.state_dir)  # also keeps a daemon from starting half-way through
    try:
        if (db_dir(config.state_dir, tc.name) / "CURRENT").exists() and not replace:
            raise ImportRefusedError(f"table {tc.name} already has a store; pass --replace to replace it")
        bounds = _validate_offsets(config, tc.topic, offsets)
        staging = table_dir(config.state_dir, f"{IMPORT_PREFIX}{tc.name}")
        shutil.rmtree(staging, ignore_errors=True)  # left by an import that did not finish
        try:
            counts = _build(config, staging.name, source, tc.topic, offsets)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        replaced = _switch(config.state_dir, tc.name, staging)
    finally:
        lock.close()
    log.info("table %s: imported Kafka Streams store %s at offsets %s", tc.name, source, counts["offsets"])
    return {"table": tc.name, "topic": tc.topic, "source": str(source), "log_bounds": bounds,
            "replaced_existing_store": replaced, **counts}


def _checkpointed_offsets(path: Path, topic: str) -> dict[int, int]:
    try:
        found = checkpoint_file.read(path)
    except checkpoint_file.CheckpointFormatError as e:
        raise ImportRefusedError(f"cannot use the Kafka Streams checkpoint: {e}") from None
    if not found:
        raise ImportRefusedError(f"no offsets in {path}: without them the store cannot be resumed")
    offsets = {p: o for (t, p), o in found.items() if t == topic}
    if not offsets:
        topics = sorted({t for t, _ in found})
        raise ImportRefusedError(f"{path} has no offsets of topic {topic} (it has {', '.join(topics)}); "
                                 f"is --table the table that mirrors the store's topic?")
    return offsets


def _refuse_if_open(source: Path) -> None:
    """RocksDB holds an fcntl lock on LOCK while a database is open: a running Kafka Streams app still owns it."""
    try:
        f = open(source / "LOCK", "r+b")  # noqa: SIM115 - closed below, after the probe
    except FileNotFoundError:
        return
    except OSError as e:
        raise ImportRefusedError(f"cannot check whether {source} is in use: {e.strerror or e}") from None
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(f, fcntl.LOCK_UN)
    except OSError:
        raise ImportRefusedError(f"{source} is open in another process (a running Kafka Streams application?); "
                                 f"stop it first") from None
    finally:
        f.close()


def _validate_offsets(config: Config, topic: str, offsets: dict[int, int]) -> dict[int, list[int]]:
    """Each partition's offset within [log start, log end], every partition covered; returns the bounds."""
    try:
        bounds = log_bounds(Consumer({**config.consumer_settings(), "log_level": 3}), topic)
    except TransientKafkaError as e:
        raise ImportRefusedError(f"cannot validate the offsets against topic {topic}: {e}") from None
    parts = sorted(bounds)
    problems = [f"partition {p} is not in the checkpoint" for p in parts if p not in offsets]
    problems += [f"partition {p} does not exist in the topic" for p in offsets if p not in bounds]
    problems += [f"partition {p} offset {o} is outside the log [{bounds[p][0]}, {bounds[p][1]}]"
                 for p, o in sorted(offsets.items()) if p in bounds and not bounds[p][0] <= o <= bounds[p][1]]
    if problems:
        raise ImportRefusedError(f"the store does not match topic {topic}: {'; '.join(problems)}")
    return {p: list(b) for p, b in bounds.items()}


def _build(config: Config, staging: str, source: Path, topic: str, offsets: dict[int, int]) -> dict[str, Any]:
    """A complete globald store for ``topic`` as table directory ``staging``, from a copy of ``source``."""
    durable.make_dirs(table_dir(config.state_dir, staging))  # and tables/, durably, when it is the first table
    path = db_dir(config.state_dir, staging)
    _copy_files(source, path)
    families = layout.families(path)
    unexpected = sorted(set(families) - {DEFAULT_CF, KS_TIMESTAMPED_CF, *COLUMN_FAMILIES})
    if unexpected or set(families) & set(COLUMN_FAMILIES):
        raise ImportRefusedError(f"{source} is not a Kafka Streams key-value store: column families {families}")
    options = StoreOptions.from_config(config.store)
    with open_offline(path, options, {*families, *COLUMN_FAMILIES}) as store:
        timestamped = _move_timestamped(store, source) if KS_TIMESTAMPED_CF in families else 0
        plain = store.count_keys()
        fmt = FORMAT_MIXED if plain else FORMAT_TIMESTAMPED
        store.put_meta(layout.stamp(fmt, topic), "import-kafka-streams: metadata")
        store.flush()
    # The offsets go in through the daemon's own first-open path (KIP-1035: a Kafka-format .checkpoint beside a
    # store with data and no offsets), and the store is opened exactly as the daemon will open it, so a store the
    # daemon would reject is never switched in.
    checkpoint_file.write(checkpoint_path(config.state_dir, staging), {(topic, p): o for p, o in offsets.items()})
    try:
        opened = TableStore.open(config.state_dir, staging, topic, options, wipe_unusable=False)
    except StoreCorruptError as e:
        raise ImportRefusedError(f"the imported store does not open as a globald store: {e}") from None
    try:
        opened.store.sync()
        held = opened.store.offsets()
    finally:
        opened.store.close()
    if held != (offsets if timestamped or plain else {}):
        raise ImportRefusedError(f"the imported store holds offsets {held}, not {offsets}: {opened.import_note}")
    return {"timestamped_values": timestamped, "plain_values": plain, "format": fmt, "offsets": held}


def _copy_files(source: Path, dest: Path) -> None:
    dest.mkdir(mode=0o700)
    for f in sorted(source.iterdir()):
        if not f.is_file() or f.name.startswith(_SKIPPED_FILES):
            continue
        if f.suffix in _IMMUTABLE_SUFFIXES:
            try:
                os.link(f, dest / f.name)
                continue
            except OSError:  # another file system, or links not allowed: copy instead
                pass
        shutil.copyfile(f, dest / f.name)


def _move_timestamped(store: OfflineStore, source: Path) -> int:
    """Kafka Streams' timestamped values are byte for byte globald's (8-byte big-endian timestamp + value):
    copy them into VALUES_CF, then drop their family."""
    n = 0
    chunk: list[tuple[bytes, bytes]] = []
    for key, value in store.items(KS_TIMESTAMPED_CF):
        if len(value) < 8:
            raise ImportRefusedError(f"{source}: value of key {key!r} in {KS_TIMESTAMPED_CF} has {len(value)} bytes, "
                                     f"fewer than its 8-byte timestamp")
        chunk.append((key, value))
        n += 1
        if len(chunk) == COPY_BATCH:
            store.put_all(VALUES_CF, chunk, "import-kafka-streams: values")
            chunk.clear()
    store.put_all(VALUES_CF, chunk, "import-kafka-streams: values")
    store.drop_family(KS_TIMESTAMPED_CF)
    return n


def _switch(state_dir: Path, table: str, staging: Path) -> bool:
    """Put ``staging`` in the table's place; True when it replaced an existing store."""
    live = table_dir(state_dir, table)
    old = tables_dir(state_dir) / f"{REPLACED_PREFIX}{table}"
    shutil.rmtree(old, ignore_errors=True)
    # The copied files and what RocksDB wrote without a sync reach the disk before the table's name is on them.
    durable.sync_tree(staging)
    replaced = live.exists()
    if replaced:
        durable.rename(live, old)
    durable.rename(staging, live)
    shutil.rmtree(old, ignore_errors=True)
    return replaced
