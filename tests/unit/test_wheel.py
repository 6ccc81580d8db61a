"""The wheel ships the product and nothing else: no test support, no benchmark, no test-only broker admin.

Built from a copy of the tracked files (``git ls-files``), because an in-tree build reuses ``build/lib``, where a
module moved or deleted since the last build would still be found and shipped.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def build_wheel(tmp_path: Path) -> list[str]:
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    out = tmp_path / "wheel"
    # No build isolation: the installed setuptools builds it, without asking an index for one.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(src)], check=True, capture_output=True, timeout=240)
    (wheel,) = out.glob("globald-*.whl")
    return zipfile.ZipFile(wheel).namelist()


def test_the_wheel_holds_only_the_product(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    names = build_wheel(tmp_path)
    modules = [n for n in names if n.endswith(".py")]
    assert "globald/cli/main.py" in modules and "globald/embedded/demo.py" in modules  # the product is there
    assert all(n.startswith(("globald/", "globald-")) for n in names), names
    # Tansu is a product part since ``globald dev --broker tansu`` (the as-of example's broker: record timestamps);
    # what only tests do to it stays in tests/support.
    test_or_bench = [m for m in modules if any(w in Path(m).stem for w in ("bench", "test", "harness"))]
    assert test_or_bench == []
    # What the embedded package ships is what demo and dev use; the tests' admins and folds live in tests/support.
    import globald.embedded.admin as product
    import globald.embedded.broker as broker
    import globald.embedded.oracle as oracle

    leaked = [n for n in ("TansuAdmin", "ZooKeeperAdmin") if hasattr(product, n)]
    leaked += [n for n in ("advance_log_start", "add_partitions", "for_broker") if hasattr(product.TopicAdmin, n)]
    leaked += [n for n in ("broker_pid", "stop_broker") if hasattr(broker.EmbeddedKafka, n)]
    leaked += [n for n in ("fold_located", "fold_timestamped") if hasattr(oracle, n)]
    assert leaked == []
