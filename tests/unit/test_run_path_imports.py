"""``globald run`` imports only what its run path uses (issue 44): a new host's start is measured from the process's
spawn, and an import it does not need is paid at every start (twice where the allocator re-executes it).

The daemon runs for real in a child process on a config without [export] or typed tables, against a broker that
is not there: once it has started its loop (status.json says RESTORING), the modules it loaded are listed and
the child ends at once (a clean stop would first wait for the unreachable broker). And the allocator's re-exec
comes before the daemon's imports and the config checks, which would otherwise run twice at every start.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.harness import REPO

# Imported where their feature is used: the export target's filesystems ([export]), the Spark side, the schema
# registry's client (typed tables with a registry), the typed decoders and their Arrow/pandas columns.
NOT_ON_THE_RUN_PATH = ("pyarrow", "pyspark", "py4j", "pandas", "numpy", "fastavro", "google.protobuf",
                       "confluent_kafka.schema_registry", "globald.export", "globald.spark", "globald.typed.registry",
                       "globald.typed.columnar", "globald.typed.arrow")

CHILD = r"""
import json, os, sys, threading, time
from pathlib import Path

state = Path(sys.argv[2])

def watch() -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if json.loads((state / "status.json").read_text()).get("pid") == os.getpid():
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    time.sleep(0.3)  # a few turns of the loop: the cluster worker's first questions, the first status
    print(json.dumps(sorted(sys.modules)), flush=True)
    os._exit(0)

threading.Thread(target=watch, daemon=True).start()
from globald.cli.main import main
sys.exit(main(["run", "--config", sys.argv[1]]))
"""


def test_globald_run_imports_nothing_its_run_path_does_not_use(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = tmp_path / "globald.toml"
    # allocator = "glibc": no re-exec, so that this process is the one that runs (the re-exec runs the same path)
    config.write_text(f'state_dir = "{state}"\nallocator = "glibc"\n[http]\nport = 0\n'
                      '[kafka]\n"bootstrap.servers" = "127.0.0.1:9"\n'
                      '[[tables]]\nname = "t"\ntopic = "t"\n')
    r = subprocess.run([sys.executable, "-c", CHILD, str(config), str(state)], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip(), r.stdout[-2000:] + r.stderr[-3000:]
    loaded = json.loads(r.stdout.strip().splitlines()[-1])
    assert "globald.engine.thread" in loaded  # the run path was taken
    unneeded = sorted({p for p in NOT_ON_THE_RUN_PATH for m in loaded if m == p or m.startswith(p + ".")})
    assert not unneeded, f"imported by `globald run` though its run path does not use them: {unneeded}"


BEFORE_EXEC = r"""
import json, os, sys
from globald.ops import allocator

allocator.choose = lambda *args, **kwargs: "/nonexistent/libjemalloc.so.2"  # as where jemalloc is installed

def execve(*args):  # the re-exec: what this process loaded until then, and the end of it
    print(json.dumps(sorted(sys.modules)), flush=True)
    os._exit(0)

os.execve = execve
from globald.cli.main import main
sys.exit(main(["run", "--config", sys.argv[1]]))
"""


def test_the_allocator_re_exec_comes_before_the_daemons_imports(tmp_path: Path) -> None:
    """The process that re-executes has checked the config (a config that cannot run is exit 2 from the process
    that was asked, never from the one a re-exec puts in its place: ``cli.main(["run", ...])`` in a test's own
    process would otherwise become the daemon), and has not imported the daemon, which the process that runs
    imports once."""
    config = tmp_path / "globald.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[http]\nport = 0\n'
                      '[kafka]\n"bootstrap.servers" = "127.0.0.1:9"\n[[tables]]\nname = "t"\ntopic = "t"\n')
    r = subprocess.run([sys.executable, "-c", BEFORE_EXEC, str(config)], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip(), r.stdout[-2000:] + r.stderr[-3000:]
    loaded = set(json.loads(r.stdout.strip().splitlines()[-1]))
    assert "globald.settings.config" in loaded  # the config was read: the allocator is set there
    assert "confluent_kafka" in loaded  # and checked: librdkafka makes a client to check the [kafka] properties
    assert not loaded & {"globald.service.daemon", "globald.engine.thread"}, sorted(loaded)


def test_a_config_run_refuses_is_refused_before_the_re_exec(tmp_path: Path) -> None:
    """A [kafka] property librdkafka refuses: exit 2 naming it, from the process that was asked."""
    config = tmp_path / "globald.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[http]\nport = 0\n'
                      '[kafka]\n"bootstrap.servers" = "127.0.0.1:9"\n"fetch.max.bytes" = "many"\n'
                      '[[tables]]\nname = "t"\ntopic = "t"\n')
    r = subprocess.run([sys.executable, "-c", BEFORE_EXEC, str(config)], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and not r.stdout.strip(), r.stdout[-2000:] + r.stderr[-3000:]
    assert "kafka.fetch.max.bytes" in r.stderr and not (tmp_path / "state").exists(), r.stderr


def test_a_local_export_uri_is_checked_without_pyarrow_and_a_bad_one_still_refused(tmp_path: Path) -> None:
    """An [export] uri of a local directory (file:///abs/path) is one pyarrow always takes: the process that
    re-executes checks it without importing pyarrow (0.3 s and more, paid again by the process that runs); one
    pyarrow refuses (a host in a local URI) is still exit 2 naming export.uri."""
    config = tmp_path / "globald.toml"
    base = (f'state_dir = "{tmp_path / "state"}"\n[http]\nport = 0\n'
            '[kafka]\n"bootstrap.servers" = "127.0.0.1:9"\n[[tables]]\nname = "t"\ntopic = "t"\n[export]\n')
    config.write_text(base + f'uri = "{(tmp_path / "bucket").as_uri()}"\n')
    r = subprocess.run([sys.executable, "-c", BEFORE_EXEC, str(config)], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip(), r.stdout[-2000:] + r.stderr[-3000:]
    loaded = set(json.loads(r.stdout.strip().splitlines()[-1]))
    assert "globald.settings.config" in loaded and "pyarrow" not in loaded, sorted(loaded)

    config.write_text(base + 'uri = "file://elsewhere/bucket"\n')
    r = subprocess.run([sys.executable, "-c", BEFORE_EXEC, str(config)], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "export.uri" in r.stderr and "hostname" in r.stderr, r.stderr[-3000:]
