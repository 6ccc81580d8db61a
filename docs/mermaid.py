"""MkDocs hook (mkdocs.yml ``hooks:``): the site draws its diagrams offline, with a mermaid bundled in it.

The Material theme loads mermaid from a CDN unless the page already defines ``mermaid``; a reader offline or behind
a firewall then sees the diagrams' source text. This hook serves ``assets/javascripts/mermaid.min.js`` from the npm
package ``mermaid`` (pinned, checked by its SHA-256), fetched once with ``npm pack`` into a cache directory, the way
the embedded broker's jars are; mkdocs.yml's ``extra_javascript`` loads it before the theme looks for it. Both
``make docs`` and ``mkdocs serve`` run this hook, so a fresh clone needs npm, which the broker needs already.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

MERMAID = "mermaid@11.12.0"
MERMAID_SHA256 = "07e37dfa97b337ccc85365d57eddf99b9706f09db3b59b260d0333b23b343c4b"  # package/dist/mermaid.min.js
SITE_PATH = "assets/javascripts/mermaid.min.js"  # as mkdocs.yml's extra_javascript names it


def mermaid_js() -> Path:
    """The pinned mermaid.min.js in the cache, fetched with npm on first use."""
    cache = Path(os.environ.get("GLOBALD_MERMAID_HOME", Path.home() / ".cache" / "globald" / MERMAID))
    path = cache / "mermaid.min.js"
    if path.is_file() and _sha256(path) == MERMAID_SHA256:
        return path
    if shutil.which("npm") is None:
        raise PluginError(f"npm is needed to fetch {MERMAID} for the site's diagrams (once, into {cache})")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        subprocess.run(["npm", "pack", MERMAID, "--silent"], cwd=tmp, check=True, capture_output=True, timeout=300)
        (tgz,) = Path(tmp).glob("mermaid-*.tgz")
        with tarfile.open(tgz) as tar:
            tar.extractall(tmp, members=[tar.getmember("package/dist/mermaid.min.js"),
                                         tar.getmember("package/LICENSE")], filter="data")
        staged = Path(tmp) / "package" / "dist" / "mermaid.min.js"
        if _sha256(staged) != MERMAID_SHA256:
            raise PluginError(f"{MERMAID}'s mermaid.min.js does not have the pinned SHA-256 {MERMAID_SHA256}")
        (Path(tmp) / "package" / "LICENSE").replace(cache / "LICENSE")
        staged.replace(path)
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, SITE_PATH, abs_src_path=str(mermaid_js())))
    return files
