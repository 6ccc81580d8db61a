"""What a test does when something it needs is missing: skip on a developer's machine, fail in CI.

CI (``CI=true``, as GitHub Actions, GitLab and most runners set it) runs ``make test`` as root after ``make sysdeps``,
so every tool the suite needs is installed and every mount is allowed there: a lane that does not run in CI is a
failure, not a skip, unless the docs ("Test lanes", docs/testing/test-lanes.md) say why it cannot run there.
Running as root without CI is the same for mounts: root may mount, so a mount that fails is a broken machine, not a
missing privilege.
"""

from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def unavailable(why: str, *, fail_as_root: bool = False) -> NoReturn:
    """Skip the test saying ``why``; fail it instead in CI (and as root when ``fail_as_root``: mounts)."""
    if in_ci():
        pytest.fail(f"{why}; CI=true, where this must run (make sysdeps installs the tools, CI runs as root)")
    if fail_as_root and os.geteuid() == 0:
        pytest.fail(f"{why}; running as root, which may do this: the machine is broken, not the privilege missing")
    pytest.skip(why)


def require_tool(name: str, package: str) -> str:
    """The path of ``name``, or skip (fail in CI) naming the Debian ``package`` that `make sysdeps` installs."""
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} is not installed (Debian package {package}; `make sysdeps` installs it as root)")
    return path


def require_module(name: str, extra: str) -> ModuleType:
    """The module ``name``, or skip (fail in CI) naming the extra of pyproject.toml that `make` installs."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        unavailable(f"{name} cannot be imported (the [{extra}] extra, which `make` installs): {e}")
