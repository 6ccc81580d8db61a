"""Declaring configuration keys as dataclass fields, and building those dataclasses from parsed TOML.

A key is a dataclass field whose metadata (``declare``) holds a ``Spec``: its type, bounds and help; its default is
the field's. Guarantees: ``build`` accepts exactly the declared keys of a table, checks each value with its spec,
raises ``ConfigError`` naming the first offending key by its full path (``tables[1].name``) and supplies every
default; ``declared_keys`` and ``reference`` list the same declarations, so the reference cannot drift from the
validation. Nothing here knows globald's own config (``globald.settings.config``) or touches the disk.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from globald.common.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# Each config key is declared once, as a field of a frozen dataclass (globald.settings.config's): the field holds its
# default, and its metadata under _KEY holds a Spec (type, bounds, help). Validation, the keys each section allows
# and the reference `globald check-config --keys` prints all walk these fields, so none of them can drift from
# another. A field without _KEY (Config.source) is not a key of the file.
_KEY = "globald.settings.config.key"


@dataclass(frozen=True)
class Spec(ABC):
    """What one config key accepts and what it is for. Its default is that of the dataclass field declaring it."""

    help: str = field(kw_only=True)  # keyword-only, so that each kind's own fields come first and positional

    @abstractmethod
    def check(self, value: object, path: str) -> Any:
        """``value`` as the typed config holds it, or ConfigError naming ``path``."""

    @abstractmethod
    def kind(self) -> str:
        """The type and bounds, as the reference shows them."""

    def absent(self, path: str) -> Any:
        """The value of a key that has no default and that the file leaves out."""
        raise ConfigError(path, "is required")

    def nested(self) -> tuple[str, type[DataclassInstance]] | None:
        """The dataclass whose declared keys this key holds, with what joins its path to theirs; None for a leaf."""
        return None


def declare(spec: Spec) -> dict[str, Spec]:
    """The field metadata that makes a dataclass field the config key ``spec`` describes."""
    return {_KEY: spec}


@dataclass(frozen=True)
class Integer(Spec):
    lo: int
    hi: int

    def check(self, value: object, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):  # bool is an int to Python, never to a reader
            raise ConfigError(path, f"must be an integer, got {value!r}")
        if not self.lo <= value <= self.hi:
            raise ConfigError(path, f"must be between {self.lo} and {self.hi}, got {value}")
        return value

    def kind(self) -> str:
        return f"integer, {self.lo} to {self.hi}"


# A duration's units, in milliseconds: "7d", "12h", "30m", "45s"; a bare integer is milliseconds.
_DURATION_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION_RE = re.compile(r"^([0-9]{1,15})([smhd])$")


def duration_text(ms: int) -> str:
    """A duration as the config writes it (``Duration``'s units, the largest that divides it: ``30d``, ``12h``,
    ``5m``, ``90s``), else milliseconds (``250ms``)."""
    for unit, size in sorted(_DURATION_UNITS.items(), key=lambda u: -u[1]):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


@dataclass(frozen=True)
class Duration(Spec):
    """A length of time: an integer of milliseconds, or a string of digits and one unit (s, m, h, d). Held in ms."""

    lo_ms: int
    hi_ms: int

    def check(self, value: object, path: str) -> int:
        wrong = f'must be a duration ("7d", "12h", "30m", "45s") or an integer of milliseconds, got {value!r}'
        if isinstance(value, int) and not isinstance(value, bool):  # bool is an int to Python, never to a reader
            ms = value
        elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
            ms = int(m.group(1)) * _DURATION_UNITS[m.group(2)]
        else:
            raise ConfigError(path, wrong)
        if not self.lo_ms <= ms <= self.hi_ms:
            raise ConfigError(path, f"must be between {self.lo_ms} and {self.hi_ms} ms, got {value!r} ({ms} ms)")
        return ms

    def kind(self) -> str:
        return f"duration: integer milliseconds or digits with s, m, h or d; {self.lo_ms} ms to {self.hi_ms} ms"


@dataclass(frozen=True)
class Boolean(Spec):
    def check(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"must be true or false, got {value!r}")
        return value

    def kind(self) -> str:
        return "true or false"


@dataclass(frozen=True)
class Text(Spec):
    """A non-empty string."""

    def check(self, value: object, path: str) -> Any:
        if not isinstance(value, str) or not value:
            raise ConfigError(path, f"must be a non-empty string, got {value!r}")
        return value

    def kind(self) -> str:
        return "string"


@dataclass(frozen=True)
class Choice(Text):
    choices: tuple[str, ...]
    fold_case: bool = False  # the value is taken in upper case, so "info" and "INFO" are the same level

    def check(self, value: object, path: str) -> str:
        text: str = super().check(value, path)
        chosen = text.upper() if self.fold_case else text
        if chosen not in self.choices:
            raise ConfigError(path, f"must be one of {', '.join(self.choices)}, got {value!r}")
        return chosen

    def kind(self) -> str:
        return " | ".join(f'"{c}"' for c in self.choices) + (" (any case)" if self.fold_case else "")


@dataclass(frozen=True)
class Directory(Text):
    def check(self, value: object, path: str) -> Path:
        return Path(super().check(value, path))

    def kind(self) -> str:
        return "path"


@dataclass(frozen=True)
class Argv(Spec):
    def check(self, value: object, path: str) -> tuple[str, ...]:
        if not isinstance(value, list | tuple) or not all(isinstance(a, str) and a for a in value):
            raise ConfigError(path, "must be a list of non-empty strings (an argv)")
        return tuple(value)

    def kind(self) -> str:
        return "list of strings (an argv, run without a shell)"


@dataclass(frozen=True)
class Url(Spec):
    def check(self, value: object, path: str) -> str:
        if not isinstance(value, str) or not value.startswith(("http://", "https://")):
            raise ConfigError(path, f"must be an http:// or https:// URL, got {value!r}")
        return value

    def kind(self) -> str:
        return "http:// or https:// URL"


@dataclass(frozen=True)
class Section(Spec):
    """A TOML table whose keys are the declared fields of the dataclass ``of``."""

    of: type[DataclassInstance]
    # A rule that involves several keys of the section, run on the parsed section with its path.
    after: Callable[[Any, str], None] | None = None

    def check(self, value: object, path: str) -> Any:
        if not isinstance(value, dict):
            raise ConfigError(path, "must be a table")
        section = build(self.of, value, f"{path}.")
        if self.after is not None:
            self.after(section, path)
        return section

    def kind(self) -> str:
        return "section"

    def nested(self) -> tuple[str, type[DataclassInstance]] | None:
        return ".", self.of


def client_property(table: str, key: str, value: object, what: str) -> None:
    """Raise ConfigError naming ``table.key`` unless ``value``, a client's property ([kafka], [registry]), is a
    string, a number or a boolean. A table there is an unquoted dotted key: TOML reads ``bootstrap.servers = "x"``
    as the table ``bootstrap`` holding ``servers``, so the error says how to write it (the property is the dotted
    path to the table's first value)."""
    if isinstance(value, dict) and value:
        name, leaf = key, value
        while isinstance(leaf, dict) and leaf:
            inner, leaf = next(iter(leaf.items()))
            name = f"{name}.{inner}"
        raise ConfigError(f"{table}.{key}",
                          f'an unquoted dotted key: write "{name}" = ... (TOML reads {name} = ... as a table)')
    if not isinstance(value, str | int | float | bool):
        raise ConfigError(f"{table}.{key}", f"{what} must be strings, numbers or booleans")


_D = TypeVar("_D", bound="DataclassInstance")


def build(cls: type[_D], raw: dict[str, Any], prefix: str) -> _D:
    """An instance of ``cls`` from one TOML table, its keys named ``prefix + key`` in errors."""
    declared = {f.name: f for f in fields(cls) if _KEY in f.metadata}
    for name in raw:
        if name not in declared:
            raise ConfigError(f"{prefix}{name}", f"unknown key (allowed: {', '.join(sorted(declared))})")
    values: dict[str, Any] = {}
    for name, f in declared.items():
        spec: Spec = f.metadata[_KEY]
        if name in raw:
            values[name] = spec.check(raw[name], prefix + name)
        elif f.default is MISSING and f.default_factory is MISSING:
            values[name] = spec.absent(prefix + name)
        # otherwise the dataclass supplies the declared default
    return cls(**values)


@dataclass(frozen=True)
class Key:
    """One config key, as the reference lists it."""

    path: str  # as errors name it, "[]" standing for any entry of an array: "tables[].name"
    spec: Spec
    default: Any  # dataclasses.MISSING for a key the file must set

    @property
    def required(self) -> bool:
        return self.default is MISSING

    def default_value(self) -> Any:
        """The default as JSON (and TOML) writes it; None for a required key, an unset one and a section."""
        if isinstance(self.default, tuple):
            return list(self.default)
        return self.default if isinstance(self.default, bool | int | str) else None

    def default_text(self) -> str:
        if self.required:
            return "required"
        if self.default is None:
            return "unset"
        value = self.default_value()
        return "" if value is None else json.dumps(value)  # JSON's scalars and lists are TOML's too

    def as_json(self) -> dict[str, Any]:
        return {"key": self.path, "type": self.spec.kind(), "required": self.required,
                "default": self.default_value(), "help": self.spec.help}


def declared_keys(root: type[DataclassInstance]) -> list[Key]:
    """Every key declared by ``root``, sections before their own keys, in the order of the dataclasses' fields."""
    found: list[Key] = []

    def walk(cls: type[DataclassInstance], prefix: str) -> None:
        for f in fields(cls):
            spec = f.metadata.get(_KEY)
            if spec is None:
                continue
            default = (f.default if f.default is not MISSING else
                       f.default_factory() if f.default_factory is not MISSING else MISSING)
            found.append(Key(prefix + f.name, spec, default))
            inner = spec.nested()
            if inner is not None:
                walk(inner[1], f"{prefix}{f.name}{inner[0]}")

    walk(root, "")
    return found


def reference(root: type[DataclassInstance]) -> str:
    """Every key of ``root`` with its type, bounds, default and help: what ``globald check-config --keys`` prints."""
    lines = []
    for k in declared_keys(root):
        default = k.default_text()
        lines.append(f"{k.path}: {k.spec.kind()}" + (f", {default}" if k.required else
                                                       f", default {default}" if default else ""))
        lines.append(f"    {k.spec.help}")
    return "\n".join(lines)
