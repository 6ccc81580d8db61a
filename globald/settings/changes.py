"""What a reload changes: the difference between the config in force and one read again, key by key.

Pure logic, for ``service.reload``: ``delta(old, new)`` computes it once, as a ``Delta`` the daemon applies without
looking at a key string again. Every key that differs is named as the config names it (``snapshots.retain``,
``kafka.fetch.max.bytes``, ``tables.customers``). A key is either one the running daemon applies in place (listed
in ``LIVE``, each with the part that takes it) or one that needs a restart: a reload that changes any of those is
refused whole, in one line naming the first such key, and nothing of it is applied (all or nothing).

Tables (``tables.<name>``): one added or dropped, typed or not, is live (``engine.tables_change``). One changed in
place, same topic, typed before and after (its reader schema, writer schemas, ``subject_version``, ``on_error``,
``max_items``, its format or its key's format: the store holds the bytes as they came, so nothing is replayed) is
live too (``redeclared``): the daemon decodes from the next published snapshot version on with the new declaration.
A versioned table whose ``history`` window changes (7d to 30d, 30d to 1d), and nothing else but what a
redeclaration takes, is live in place too (``windowed``): its store and every version it holds stay, the pruning
takes the new window from the next batch, and ``since`` moves forward at once to what the new window bounds
(``store.history.windowed_since``), never back. A versioned table whose ``history`` is removed, and nothing else
but what a redeclaration takes, is live in place too (``unversioned``): its latest values stay, its history is
dropped as a restart drops it (``store.history.forget``). A table whose topic changes, or that becomes typed or raw
(its store records origins only when typed), or whose ``history`` is added (a ``since`` is proven only by a replay),
is live as a replacement (``replaced``): dropped and added again under its name in the same reload, so it replays
its topic (or bootstraps from an export) with the new declaration, while its old snapshots stay for their readers'
leases.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

from globald.settings.config import Config, TableConfig

# Keys a running daemon takes without a restart, and what takes them (docs/operations/reload.md lists them too).
LIVE: dict[str, str] = {
    "commit_interval_ms": "the loop, from its next commit",
    "consume_batch_size": "the loop, from its next poll",
    "poll_timeout_ms": "the loop, from its next poll",
    "log_level": "the root logger",
    "reload_on_change_ms": "the reload thread's next check of the file",
    "snapshots.interval_ms": "the snapshot publisher",
    "snapshots.retain": "the snapshot publisher's next retention sweep",
    "snapshots.serve_stale": "readers, from the next status",
    "snapshots.build_timeout_ms": "exact-offset builds asked from then on",
    "hooks.on_state_change": "the hook runner (replaced)",
    "hooks.webhook_url": "the hook runner (replaced)",
    "hooks.timeout_ms": "the hook runner (replaced)",
    "http.enabled": "the HTTP listener (a new one bound first: an address that cannot be bound refuses the reload)",
    "http.host": "the HTTP listener (a new one bound first: an address that cannot be bound refuses the reload)",
    "http.port": "the HTTP listener (a new one bound first: an address that cannot be bound refuses the reload)",
    "http.allow_non_loopback": "the config check, when the file is loaded",
    "kafka": "the loop's consumer and the cluster worker's clients (replaced, every table re-planned from its store)",
}

# Why a key cannot change while the daemon runs, for the refusal's line; keys not named here take the default.
WHY_NOT: dict[str, str] = {
    "state_dir": "the daemon holds the state_dir's lock and every store under it",
    "allocator": "the allocator is chosen when the process starts",
    "log_format": "the log handlers are set up when the process starts",
    "store": "the stores are opened with these options",
    "export": "the exporter is set up when the daemon starts",
    "registry": "the registry client is set up when the daemon starts",
    "metadata_refresh_ms": "the cluster watch takes it when the loop starts",
}
RESTART = "needs a restart"


@dataclass(frozen=True)
class Change:
    key: str  # as the config names it
    old: Any
    new: Any

    @property
    def live(self) -> bool:
        if self.key.startswith("tables."):  # added, dropped, redeclared or replaced (module docstring)
            return True
        return self.key in LIVE or _is_kafka(self.key)

    @property
    def replaced(self) -> bool:
        """A table changed in a way its store cannot follow (another topic, typed or not, history added): dropped
        and added."""
        return self.key.startswith("tables.") and self.old is not None and self.new is not None and \
            self.redeclared is None and self.windowed is None and self.unversioned is None

    @property
    def redeclared(self) -> TableConfig | None:
        """The new declaration of a typed table changed in place, same topic, typed still and versioned or not as
        before: no replay needed."""
        old, new = self.old, self.new
        if not self.key.startswith("tables.") or old is None or new is None:
            return None
        return new if old.topic == new.topic and old.typed and new.typed and old.versioned == new.versioned else None

    @property
    def windowed(self) -> TableConfig | None:
        """The new declaration of a versioned table whose ``history`` window changed, versioned still, its store
        kept (``engine.tables.TableSet.rewindow``): nothing else changed but what a redeclaration takes."""
        old, new = self.old, self.new
        if not self.key.startswith("tables.") or old is None or new is None:
            return None
        if not (old.versioned and new.versioned) or old.history == new.history:
            return None
        return new if self.redeclared is not None or replace(old, history=new.history) == new else None

    @property
    def unversioned(self) -> TableConfig | None:
        """The new declaration of a versioned table whose ``history`` is removed, its store kept and its history
        dropped (``engine.tables.TableSet.unversion``): nothing else changed but what a redeclaration takes (same
        topic, typed before and after)."""
        old, new = self.old, self.new
        if not self.key.startswith("tables.") or old is None or new is None or not old.versioned or new.versioned:
            return None
        typed = old.topic == new.topic and old.typed and new.typed
        return new if typed or replace(old, history=None) == new else None

    def refusal(self) -> str:
        """The one line refusing a reload that changes this key."""
        top = self.key.split(".", 1)[0]
        why = WHY_NOT.get(self.key) or WHY_NOT.get(top) or "it is taken when the daemon starts"
        return f"{self.key}: cannot change while the daemon runs ({why}); {RESTART}, nothing of this reload was applied"


def _is_kafka(key: str) -> bool:
    return key == "kafka" or key.startswith("kafka.")


@dataclass(frozen=True)
class Delta:
    """What one reload changes, computed once (``delta``) from the config in force and the one read again.

    Each table changed is in exactly one of ``added``, ``dropped``, ``replaced`` (dropped and added again under its
    name: another topic, typed became raw or raw typed, history added) and the in-place changes, ``redeclared`` (a
    typed table's new declaration), ``windowed`` (a versioned table's new window; a typed one whose window changed
    is in both) and ``unversioned`` (a versioned table's history removed), each in the config's order."""

    config: Config  # the config read again, in force once applied
    changes: tuple[Change, ...]  # every key that differs (the reload's log line, its refusal)
    kafka_changed: bool  # a [kafka] property differs: every Kafka client is made again
    added: tuple[TableConfig, ...]  # tables new under their name
    dropped: tuple[str, ...]  # tables gone
    replaced: tuple[TableConfig, ...]  # the new declarations of tables replaced
    redeclared: tuple[TableConfig, ...]  # the new declarations of typed tables changed in place
    windowed: tuple[TableConfig, ...] = ()  # the new declarations of versioned tables whose window changed in place
    unversioned: tuple[TableConfig, ...] = ()  # the new declarations of tables whose history is removed in place

    @classmethod
    def of(cls, new: Config, found: list[Change]) -> Delta:
        """The ``Delta`` to ``new`` made of the changes ``found`` (``changes``, and any table the reload redeclares
        though its declaration did not change: a registry subject's reader schema moved)."""
        tables = [c for c in found if c.key.startswith("tables.")]
        return cls(
            config=new, changes=tuple(found), kafka_changed=any(_is_kafka(c.key) for c in found),
            added=tuple(c.new for c in tables if c.old is None),
            dropped=tuple(c.old.name for c in tables if c.new is None),
            replaced=tuple(c.new for c in tables if c.replaced),
            redeclared=tuple(c.redeclared for c in tables if c.redeclared is not None),
            windowed=tuple(c.windowed for c in tables if c.windowed is not None),
            unversioned=tuple(c.unversioned for c in tables if c.unversioned is not None))

    @property
    def refusal(self) -> str | None:
        """The one line refusing this reload, or None when every change can be applied live."""
        return refusal(list(self.changes))

    @property
    def stores_dropped(self) -> tuple[str, ...]:
        """Every table whose store goes: the dropped, and the replaced (their old declaration)."""
        return (*self.dropped, *(tc.name for tc in self.replaced))

    @property
    def stores_added(self) -> tuple[TableConfig, ...]:
        """Every table whose store is made: the added, and the replaced (their new declaration)."""
        return (*self.added, *self.replaced)

    @property
    def keys(self) -> str:
        """The keys that differ, for the log line of a reload applied."""
        return ", ".join(c.key for c in self.changes) or "nothing changed"


def delta(old: Config, new: Config) -> Delta:
    """The ``Delta`` from the config in force ``old`` to ``new``."""
    return Delta.of(new, changes(old, new))


def changes(old: Config, new: Config) -> list[Change]:
    """Every key whose value differs, in the config's own order (``source``, where the file was, is not a key)."""
    found: list[Change] = []
    for f in fields(Config):
        if f.name == "source":
            continue
        _diff(f.name, getattr(old, f.name), getattr(new, f.name), found)
    return found


def _diff(key: str, a: Any, b: Any, found: list[Change]) -> None:
    if a == b:
        return
    if key == "tables":
        olds, news = {t.name: t for t in a}, {t.name: t for t in b}
        for name in [*olds, *(n for n in news if n not in olds)]:
            if olds.get(name) != news.get(name):
                found.append(Change(f"tables.{name}", olds.get(name), news.get(name)))
        return  # the same tables in another order: nothing to apply
    if key in ("kafka", "registry") and isinstance(a, dict) and isinstance(b, dict):
        for prop in [*a, *(p for p in b if p not in a)]:
            if a.get(prop) != b.get(prop):
                found.append(Change(f"{key}.{prop}", a.get(prop), b.get(prop)))
        return
    if is_dataclass(a) and is_dataclass(b) and type(a) is type(b):
        for f in fields(a):
            _diff(f"{key}.{f.name}", getattr(a, f.name), getattr(b, f.name), found)
        return
    found.append(Change(key, a, b))


def refusal(found: list[Change]) -> str | None:
    """The one line refusing the reload, or None when every change can be applied live."""
    fixed = [c for c in found if not c.live]
    if not fixed:
        return None
    more = f" (and {len(fixed) - 1} other key(s) that need a restart)" if len(fixed) > 1 else ""
    return fixed[0].refusal() + more
