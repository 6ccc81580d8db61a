"""Export events of the campaign (``plan.EXPORT``): ``globald export`` asked inside a phase, then a second store
bootstrapped from the newest export and compared with the fold.

The campaign's daemon exports to ``file://<seed dir>/exports`` only when asked (``interval_s = 0``) and never
bootstraps itself (``bootstrap = false``): a reset or a wipe of a fault must keep restoring from the topic, as the
campaign's restore and bulk-load phases need. The ask goes out while the daemon stands frozen at the phase's hook
(the loop takes the request at its next turn, so an ask made while a commit or a publish is held waits for it);
the phase is released once the export is answered or a few seconds passed.

An export that did not happen proves nothing: the event counts as landed (``Outcome.hit``) only once
``globald export`` exited 0 naming an export id whose manifest is in the storage, and a second daemon on a state_dir
of its own, with ``bootstrap = true``, went RUNNING at the log end and holds what the fold of the topic holds at its
offsets. That daemon must stop on SIGTERM, exit 0, within ``STOP_S``.

The second daemon runs under the campaign's entry (``tests.chaos.entry``) and stands frozen at the start of its
first file's download (``entry.BOOTSTRAP_DOWNLOAD``, the largest file, the first fetched), where the event's
``storage`` happens to the export: ``intact`` (it must install that very export: its status ``origin``), a ``torn
file`` (that file cut to half its size), a ``missing file`` (that file deleted, the manifest still naming it) or a
``silent file`` (a FIFO in its place: an open for reading waits forever, as on storage that never answers; the
second daemon's ``bootstrap_timeout_s`` is ``SILENT_BOUND_S``).
On the S3 emulator (``plan.S3_STORAGE``, ``tests.chaos.s3_faults``) the export is copied into a bucket of the
event's own, and the second daemon downloads it through the campaign's front, which at the freeze answers that file
with ``503 Slow Down`` (``s3 5xx``) or never (``s3 silent``), or the file is deleted (``s3 missing file``), or a
newer export is made and copied in and retention runs with no grace (``s3 retention``: the export being downloaded
is retired and its files no newer export shares deleted, the cut ``grace_s`` exists to prevent). A 5xx or a silence
must be met by the download (the front counts the requests it failed) and the export refused unless the file had
been read whole before. With an upload fault (``plan.S3_UPLOAD``) the download is left alone and the second daemon,
once bootstrapped, exports into the bucket every second while the front answers its writes of files and manifests
with 503 or 500, cuts them mid-body, or never answers them (then its ``upload_timeout_s`` is ``UPLOAD_BOUND_S``): the
failed export must be reported (``export.failures``) with the same PID, RUNNING, and no manifest in the bucket may
name a file missing or not whole; once healed, a later export must be written, whole.
A damaged export must be refused, never installed: the origin is the topic, or an older export that does not hold
the damaged file, and the store equals the fold either way (nothing claims more than it holds). With ``reload``, the
config is changed (a live key) and a SIGHUP sent at the same freeze: the reload lands during the bootstrap and must
be applied (its generation, the file's sha256) once the daemon runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from globald.export import retention
from globald.export.manifest import blob_name
from globald.export.target import FILES_DIR, Target
from tests.chaos import entry, plan, s3_faults
from tests.chaos.daemon import ChaosDaemon, stopped_at_hook
from tests.harness import REPO, DaemonProcess, write_config
from tests.reliability.checks import check_store

if TYPE_CHECKING:
    from tests.chaos.base import SeedBase
    from tests.chaos.outcome import Outcome
    from tests.chaos.plan import Fault

ANSWERED_S = 5.0  # held this long for the export to be answered inside the phase, then released
EXPORTED_S = 300.0  # from the release to ``globald export``'s answer
BOOTSTRAP_S = 180.0  # the second daemon RUNNING at the log end
HOOK_S = 120.0  # the second daemon at its first download
SILENT_BOUND_S = 15  # the second daemon's bootstrap_timeout_s: a silent file is given up after it
STOP_S = 10.0  # the second daemon's stop: a bootstrapped store closes as any other
UPLOAD_BOUND_S = 5  # the second daemon's upload_timeout_s: an upload never answered is given up after it
UPLOAD_S = 120.0  # an upload fault met and reported; then an export written once healed


def section(root: Path, bootstrap: bool) -> dict[str, Any]:
    """The ``[export]`` section of the seed's daemons: a directory under the seed's for the storage."""
    return {"uri": (root / "exports").as_uri(), "interval_s": 0, "keep": 3, "bootstrap": bootstrap}


class ExportEvent:
    def __init__(self, run: SeedBase, fault: Fault, out: Outcome) -> None:
        self.run, self.f, self.out = run, fault, out
        self.d = run.daemon
        self.ask: subprocess.Popen[str] | None = None
        self.fifo: Path | None = None  # a silent file put in the storage: removed once the bootstrap is over
        self.uri: str | None = None  # the second daemon's storage when not the seed's file:// one (S3)
        self.bucket: str | None = None  # the event's bucket on the S3 emulator, for the campaign's own calls
        self.front: s3_faults.S3Front | None = None
        self.export_id = ""  # the export the second daemon downloads

    def prepare(self) -> None:
        """Nothing before the phase: the storage is the seed's, the table one of its own."""

    def inject(self) -> None:
        cmd = [sys.executable, "-m", "globald", "export", "--config", str(self.run.config.path), "--table",
               self.f.table, "--json", "--timeout", str(EXPORTED_S)]
        self.ask = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def hold(self) -> None:
        assert self.ask is not None
        t0 = time.monotonic()
        while self.ask.poll() is None and time.monotonic() - t0 < ANSWERED_S and self.d.alive():
            time.sleep(0.1)
        answered = self.ask.poll() is not None
        self.out.notes.append(f"export {'answered' if answered else 'not answered yet'} "
                              f"{time.monotonic() - t0:.1f}s into the held phase")
        self.run.release(self.out)
        try:
            stdout, stderr = self.ask.communicate(timeout=EXPORTED_S + 30)
        except subprocess.TimeoutExpired:
            self.ask.kill()
            stdout, stderr = self.ask.communicate()
        rc, self.ask = self.ask.returncode, None
        export_id = None
        if rc == 0:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                export_id = str(json.loads(stdout)["export"])
        if export_id is None:
            self.out.problems.append(f"globald export exited {rc}: {(stdout + stderr).strip()[-400:]}")
            self.out.hit = False
            return
        manifest = self.run.root / "exports" / self.f.table / "exports" / f"{export_id}.json"
        if not manifest.is_file():
            self.out.problems.append(f"globald export answered export {export_id}, but {manifest} is not there")
            self.out.hit = False
            return
        self.out.notes.append(f"exported {self.f.table} as {export_id}")
        self.out.hit = self._bootstrap(export_id)

    def _config(self, root: Path, interval_ms: int) -> Path:
        table = self.f.table
        storage = {**section(self.run.root, bootstrap=True), "bootstrap_timeout_s": SILENT_BOUND_S}
        if self.uri is not None:
            storage["uri"] = self.uri
        if self.f.params["storage"] in plan.S3_UPLOAD:  # exports into the bucket at once, and again each second
            # The bound only where nothing answers: a refused or cut write is given up by the SDK itself (~6 s).
            silent = self.f.params["storage"] == "s3 upload silent"
            storage.update(interval_s=1, upload_timeout_s=UPLOAD_BOUND_S if silent else int(UPLOAD_S))
        tmp = write_config(root / "globald.toml.tmp", root / "state", self.run.broker.settings,
                           {table: self.run.topics[table]}, commit_interval_ms=500, metadata_refresh_ms=2000,
                           log_level="INFO", http={"enabled": False}, snapshots={"interval_ms": interval_ms},
                           export=storage)
        os.replace(tmp, root / "globald.toml")  # whole: a reload reads one version
        return root / "globald.toml"

    def _bootstrap(self, export_id: str) -> bool:
        """A second daemon bootstraps the table from the storage, frozen at its first download for the event's
        storage fault and reload; its origin, its reload, its store against the fold."""
        run, out, table, p = self.run, self.out, self.f.table, self.f.params
        topic = run.topics[table]
        root = run.root / "bootstrap"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        s3 = p["storage"] in plan.S3_STORAGE
        if s3:
            self._to_bucket(export_id)
        cfg = self._config(root, 1000)
        arm = root / "arm.json"
        arm.write_text(json.dumps({"id": 1, "phase": entry.BOOTSTRAP_DOWNLOAD, "action": "freeze", "table": table}))
        env = {entry.ARM_ENV: str(arm), **(s3_faults.CREDENTIALS if s3 else {})}
        second = ChaosDaemon(cfg, root / "daemon.log", env=env, state=root / "state").start()
        run.pause_loads()  # a fixed log end to reach; the recovery after this event resumes them
        ends = run.admin.end_offsets(topic)
        damaged = None
        if not stopped_at_hook(second, arm.with_name(f"{arm.name}.fired-1"), HOOK_S):
            out.problems.append(f"the second daemon never began a download within {HOOK_S:.0f}s: "
                                f"{second.tail(20)[-600:]}")
            self._stop(second)
            return False
        try:
            damaged = self._damage(export_id)
            if p["reload"]:
                self._config(root, 2500)
                os.kill(second.pid, signal.SIGHUP)  # pending while frozen: taken as the download goes on
        finally:
            arm.write_text("{}")
            second.thaw()
        try:
            doc = second.wait_running({table: ends}, timeout=BOOTSTRAP_S)
            if p["reload"]:
                sha = hashlib.sha256(cfg.read_bytes()).hexdigest()
                doc = second.wait_for(lambda d: (d.get("config") or {}).get("sha256") == sha, BOOTSTRAP_S,
                                      "the reload sent during the download applied")
                out.notes.append(f"a reload sent during the download applied: {(doc.get('config') or {})}"[:300])
        except AssertionError as e:
            out.problems.append(f"a daemon bootstrapping {table} from the exports did not reach its log end "
                                f"{ends}" + (" and apply its reload" if p["reload"] else "") +
                                f" within {BOOTSTRAP_S:.0f}s: {str(e)[-600:]}")
            self._stop(second)
            return False
        origin = doc["tables"][table].get("origin") or {}
        ok = self._origin_ok(origin, export_id, damaged)
        store = check_store(run.broker, root / "state", table, topic, allow_uncompared=True)
        out.checks += 1
        if store.divergences or not store.compared:
            out.divergences += max(1, store.divergences)
            out.problems.append(f"{table}: the store bootstrapped from an export differs from the oracle at "
                                f"{store.offsets}: {store.error}")
            ok = False
        if p["storage"] in plan.S3_UPLOAD:
            ok = self._upload(second) and ok
        return self._stop(second) and ok

    def _upload(self, second: DaemonProcess) -> bool:
        """The second daemon's exports under the upload fault, then healed: reported failed, serving, no manifest
        naming a file that is not whole; then one written whole."""
        assert self.front is not None and self.bucket is not None
        out, table, pid = self.out, self.f.table, second.pid
        direct = self.front.uri(self.bucket, direct=True)

        def export(doc: dict[str, Any]) -> dict[str, Any]:
            return dict(doc["tables"][table].get("export") or {})

        try:
            doc = second.wait_for(lambda d: export(d).get("failures", 0) >= 1, UPLOAD_S,
                                  "an export under the upload fault reported failed")
            failed = export(doc)
            ids, torn = s3_faults.whole_exports(direct, table)
            met = self.front.failed
            self.front.heal()
            doc = second.wait_for(lambda d: export(d).get("exports", 0) >= 1, UPLOAD_S, "an export once healed")
        except AssertionError as e:
            out.problems.append(f"{self.f.params['storage']}: {str(e)[-600:]}")
            return False
        after, torn_after = s3_faults.whole_exports(direct, table)
        last = (export(doc).get("last") or {}).get("export")
        out.notes.append(f"upload fault met by {met} requests; reported: {str(failed.get('last_error'))[:200]}; "
                         f"export {last} written once healed")
        problems = [*torn, *torn_after]
        if met == 0:
            problems.append("the upload fault never met the upload: the front failed no request")
        if ids != [self.export_id]:
            problems.append(f"exports in the bucket under the upload fault: {ids}, only {self.export_id} expected")
        if last not in after:
            problems.append(f"export {last}, reported written once healed, is not in the bucket: {after}")
        if second.pid != pid or doc["tables"][table].get("state") != "RUNNING":
            problems.append(f"the exporting daemon changed (PID {pid} -> {second.pid}) or left RUNNING: "
                            f"{doc['tables'][table].get('state')}")
        if torn or torn_after:
            out.divergences += 1  # a manifest claims a file it does not have whole
        out.problems.extend(problems)
        return not problems

    def _damage(self, export_id: str) -> str | None:
        """The event's storage fault on the export's largest file (the first downloaded: the daemon stands at its
        start); the file's blob name, or None when the storage stays intact."""
        storage = self.f.params["storage"]
        if storage == "intact":
            return None
        base = self.run.root / "exports" / self.f.table
        doc = json.loads((base / "exports" / f"{export_id}.json").read_text())
        biggest = max(doc["files"], key=lambda f: int(f["size"]))
        blob = base / FILES_DIR / blob_name(biggest["sha256"], int(biggest["size"]))
        if storage in plan.S3_STORAGE:
            return self._damage_s3(storage, blob.name, biggest)
        if storage == "torn file":
            with open(blob, "r+b") as f:
                f.truncate(int(biggest["size"]) // 2)
        else:
            blob.unlink()
            if storage == "silent file":  # an open for reading waits for a writer that never comes
                os.mkfifo(blob)
                self.fifo = blob
        self.out.notes.append(f"storage: {storage} {blob.name} ({biggest['name']}, {biggest['size']} bytes)")
        return blob.name

    def _to_bucket(self, export_id: str) -> None:
        """The export copied into a new bucket on the S3 emulator; the second daemon's storage is that bucket,
        through the campaign's front."""
        if self.run.c.s3 is None:
            self.run.c.s3 = s3_faults.S3Front().start()
        self.front = self.run.c.s3
        self.bucket = self.front.new_bucket()
        copied = s3_faults.mirror(self.run.root / "exports", self.front.uri(self.bucket, direct=True), self.f.table,
                                  [export_id])
        self.uri = self.front.uri(self.bucket)
        self.export_id = export_id
        self.out.notes.append(f"export {export_id} copied into bucket {self.bucket} on the S3 emulator ({copied} "
                              "files)")

    def _damage_s3(self, storage: str, blob: str, biggest: dict[str, Any]) -> str | None:
        assert self.front is not None and self.bucket is not None
        direct, table = self.front.uri(self.bucket, direct=True), self.f.table
        what = f"{blob} ({biggest['name']}, {biggest['size']} bytes)"
        if storage == "s3 intact":
            return None
        if storage in plan.S3_UPLOAD:  # the download goes on whole; the exports the daemon then makes meet it
            self.front.fail(storage.rsplit(" ", 1)[1], self.front.uploads(table), s3_faults.UPLOAD)
            self.out.notes.append(f"storage: {storage}: the bucket's writes of {table} fail from the download on")
            return None
        if storage in ("s3 5xx", "s3 silent"):
            self.front.fail("5xx" if storage == "s3 5xx" else "silent", blob)
        elif storage == "s3 missing file":
            s3_faults.delete(direct, table, FILES_DIR, blob)
        else:  # retention while the download stands: a newer export, then retention with no grace
            newer = self._export_again()
            s3_faults.mirror(self.run.root / "exports", direct, table, [newer])
            swept = retention.apply(Target(direct), table, keep=1, grace_s=0)
            gone = [b for b in self._blobs(self.export_id) if Target(direct).size(table, FILES_DIR, b) is None]
            self.out.notes.append(f"storage: s3 retention after newer export {newer}: {swept}; of export "
                                  f"{self.export_id}'s files {len(gone)} deleted" + (", the largest kept (the newer "
                                  "export shares it)" if blob not in gone else ""))
            return (blob if blob in gone else gone[0]) if gone else None
        self.out.notes.append(f"storage: {storage} {what}")
        return blob

    def _blobs(self, export_id: str) -> list[str]:
        doc = json.loads((self.run.root / "exports" / self.f.table / "exports" / f"{export_id}.json").read_text())
        return [blob_name(f["sha256"], int(f["size"])) for f in doc["files"]]

    def _export_again(self) -> str:
        """A newer export of the table by the campaign's daemon (its file:// storage), for retention to keep."""
        r = subprocess.run([sys.executable, "-m", "globald", "export", "--config", str(self.run.config.path),
                            "--table", self.f.table, "--json", "--timeout", "120"], cwd=REPO, capture_output=True,
                           text=True, timeout=180)
        if r.returncode != 0:
            raise RuntimeError(f"the newer export for retention failed ({r.returncode}): {r.stderr.strip()[-300:]}")
        return str(json.loads(r.stdout)["export"])

    def _origin_ok(self, origin: dict[str, Any], export_id: str, damaged: str | None) -> bool:
        """Intact: that very export installed (none newer was made). Damaged: never an export holding the file."""
        out, table = self.out, self.f.table
        if self.front is not None and self.f.params["storage"] in ("s3 5xx", "s3 silent"):
            if self.front.failed == 0:
                out.problems.append(f"the storage fault ({self.f.params['storage']}) never met the download: the "
                                    "front failed no request for the file")
                return False
            out.notes.append(f"the front failed {self.front.failed} requests for {damaged}")
        if damaged is None:
            if origin.get("kind") != "export" or str(origin.get("export")) != export_id:
                out.problems.append(f"a daemon bootstrapping {table} did not start from export {export_id}, the "
                                    f"newest: origin {origin}")
                return False
            out.notes.append(f"second store bootstrapped from export {origin.get('export')}, tail {origin.get('tail')}")
            return True
        if origin.get("kind") == "export":
            used = self.run.root / "exports" / table / "exports" / f"{origin.get('export')}.json"
            names = [blob_name(f["sha256"], int(f["size"])) for f in json.loads(used.read_text())["files"]]
            if damaged in names and self.f.params["storage"] == "torn file":
                out.divergences += 1
                out.problems.append(f"a daemon bootstrapping {table} installed export {origin.get('export')}, whose "
                                    f"file {damaged} was torn: origin {origin}")
                return False
            if damaged in names:  # deleted while a downloader that raced the frozen one had it open: read whole
                out.notes.append(f"export {origin.get('export')} installed: its deleted file was already open")
                return True
        out.notes.append(f"damaged export refused: origin {origin.get('kind')} {origin.get('export') or ''}, "
                         f"fallback {str(origin.get('fallback'))[:300]}")
        return True

    def _stop(self, second: DaemonProcess) -> bool:
        assert second.proc is not None
        t0 = time.monotonic()
        os.kill(second.pid, signal.SIGTERM)
        try:
            rc = second.proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            rc = None
            second.stop(signal.SIGKILL)
        took = time.monotonic() - t0
        if rc != 0:
            self.out.problems.append(f"the bootstrapped daemon did not stop with 0 within {STOP_S:.0f}s of SIGTERM "
                                     f"(exit {rc}, {took:.1f}s)")
            return False
        self.out.notes.append(f"the bootstrapped daemon stopped in {took:.1f}s")
        return True

    def close(self) -> None:
        if self.front is not None:
            self.front.heal()
        if self.fifo is not None:  # the exporter must not find it: its upload's open would wait forever too
            self.fifo.unlink(missing_ok=True)
            self.fifo = None
        if self.ask is not None:
            if self.ask.poll() is None:
                self.ask.kill()
            self.ask.communicate()
            self.ask = None
