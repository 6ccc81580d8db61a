"""The versioned lane's checks (``tests.chaos.versioned``), after every event beside the campaign's own: what a
versioned table answers as of a time equals the as-of fold (``globald.embedded.oracle.as_of``), and its ``since``
holds what issue 45 promises.

For each versioned table, two versions are read as ``globald get --as-of`` reads them (``readview``): the one the
CLI serves (the live store once complete, else CURRENT) and the CURRENT snapshot. Each is compared with the as-of
fold of the topic's records below its own offsets, at random keys and at record times from its ``since`` on (its
``since`` itself, record times, times between them, past the newest), one whole table as of a random time, and a
time just before ``since`` must be refused. Its ``since`` must be:
- no earlier than the lane can prove for it (``floor``: the wall time before the table's last replay began, less
  the topic's ``min.compaction.lag.ms``, as the daemon itself derives it), nor than its newest record time less
  the window;
- no earlier than the served version's ``since`` at the last check, unless the table was reset or its history
  added since (the only ways back the contract allows: a wipe, a recreated topic, a reset);
- no later than the wall clock (the lane's records are stamped at most 5 s ahead): a ``since`` in the future
  refuses every lookup up to it, though nothing was missed (a +1 day clock step once did that). Only a restart
  under a clock stepped forward explains one (``VersionedSeed.ahead_ok``): it measures its downtime on the wall
  clock.
Tansu compacts nothing, so the fold of every record is the truth at any time: only the ``floor`` can show a
``since`` claimed earlier than proven.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING

from globald.cli import readview
from globald.common.errors import GlobaldError
from globald.embedded.oracle import Record, as_of, records
from globald.settings import config as configmod
from globald.snapshot.reader import current_id

if TYPE_CHECKING:
    from tests.chaos.outcome import Outcome
    from tests.chaos.versioned import VersionedSeed

KEYS_ASKED, TIMES_ASKED = 25, 4  # per version checked: ~100 point lookups, and one whole table as of a time
MAX_PROBLEMS = 5  # per version: the first few differences say enough
FUTURE_SLACK_MS = 10_000  # the lane stamps records up to 5 s ahead of its clock


def _views(run: VersionedSeed, table: str) -> Iterator[tuple[str, readview.ReadView]]:
    """The version the CLI serves, then the CURRENT snapshot (when it is not the one served)."""
    config = configmod.load(run.config.path)
    with contextlib.ExitStack() as stack:
        try:
            served = stack.enter_context(readview.open_view(config, table))
        except GlobaldError:
            served = None
        if served is not None:
            yield f"served ({served.source})", served
        sid = current_id(run.daemon.state_dir, table)
        if sid is not None and (served is None or served.snapshot != sid):
            try:
                snap = stack.enter_context(readview.open_snapshot_view(config, table, sid))
            except GlobaldError:
                return  # retired by retention meanwhile: the campaign's own checks read every snapshot
            yield f"snapshot {sid}", snap


def check_versions(run: VersionedSeed, out: Outcome, table: str, topic: str, when: str) -> None:
    """The as-of fold and the rules of ``since`` for ``table``'s served version and CURRENT snapshot."""
    rng = random.Random(f"{run.seed}:{out.fault.index}:{table}:{when}")
    cache: dict[str, tuple[dict[int, int], list[Record]]] = {}
    for what, view in _views(run, table):
        marks = view._reader.history
        if marks is None:
            out.divergences += 1
            out.problems.append(f"{table}: {what} {when} keeps no versions, though the table declares history")
            continue
        if marks.pending or marks.since is None:
            out.notes.append(f"{table}: {what} {when} has no since yet ({marks}): as-of refused, not checked")
            continue
        every = _records(run, topic, view.offsets, cache)
        problems = _since_problems(run, table, what, view, marks.since, marks.clock)
        found, asked = _as_of_problems(view, every, marks.since, rng)
        problems += found
        out.checks += 1
        out.notes.append(f"{table}: {what} {when}: since {marks.since}, {asked} as-of lookups and a whole table as "
                         f"of a time against the as-of fold of {len(every)} records: {len(problems)} problems")
        if problems:
            out.divergences += len(problems)
            out.problems += [f"{table}: {what} at {view.offsets} {when}: {p}" for p in problems[:MAX_PROBLEMS]]
        if view.source == readview.LIVE:
            run.last_since[table] = marks.since


def _records(run: VersionedSeed, topic: str, offsets: dict[int, int],
             cache: dict[str, tuple[dict[int, int], list[Record]]]) -> list[Record]:
    """The topic's keyed records below ``offsets``: read once per check (the served version comes first, and the
    live store's offsets are above any snapshot's), then cut."""
    held = cache.get(topic)
    if held is None or any(o > held[0].get(p, 0) for p, o in offsets.items()):
        held = cache[topic] = (dict(offsets), records(run.broker.settings, topic, offsets))
    return [r for r in held[1] if r.offset < offsets.get(r.partition, 0)]


def _since_problems(run: VersionedSeed, table: str, what: str, view: readview.ReadView, since: int,
                    clock: int | None) -> list[str]:
    out = []
    floor = run.floor.get(table)
    if view.source == readview.SNAPSHOT and (view.snapshot_created or 0) * 1000 < run.replayed_at.get(table, 0):
        floor = None  # published before the table's last replay began: that replay's floor is not its own
    if floor is not None and since < floor:
        out.append(f"since {since} is earlier than can be proven: the table's last replay began after {floor} "
                   f"(wall time less the topic's min.compaction.lag.ms)")
    now = int(time.time() * 1000)
    if since > max(now + FUTURE_SLACK_MS, run.ahead_ok):  # the lane stamps records at most 5 s ahead
        out.append(f"since {since} is {since - now} ms past the wall clock: every as-of lookup up to it is refused, "
                   "though nothing was missed")
    window = run.window_ms(table)
    if clock is not None and window is not None and since < clock - window:
        out.append(f"since {since} is older than the newest record time {clock} less the window {window} ms")
    last = run.last_since.get(table)
    if view.source == readview.LIVE and last is not None and since < last:
        out.append(f"since moved back from {last} to {since} with no wipe, recreated topic or reset")
    if view.history_refusal(since) is not None:
        out.append(f"an as-of lookup at since is refused: {view.history_refusal(since)}")
    if view.history_refusal(since - 1) is None:
        out.append(f"an as-of lookup 1 ms before since ({since}) is answered, not refused")
    return out


def _as_of_problems(view: readview.ReadView, every: list[Record], since: int,
                    rng: random.Random) -> tuple[list[str], int]:
    """The differences from the as-of fold, and how many point lookups were compared."""
    by_key: dict[bytes, list[Record]] = defaultdict(list)
    for r in every:
        by_key[r.key].append(r)
    stamps = sorted(r.timestamp for r in every if r.timestamp >= since)
    if not by_key or not stamps:
        return [], 0
    keys = sorted(by_key)
    times = [since, stamps[-1] + 1, *rng.sample(stamps, min(TIMES_ASKED, len(stamps))),
             rng.randint(since, stamps[-1])]
    out = []
    asked = 0
    for at in times:
        for key in rng.sample(keys, min(KEYS_ASKED, len(keys))):
            got, want = view.as_of(key, at), as_of(by_key[key], key, at)
            asked += 1
            if got != want:
                out.append(f"key {key!r} as of {at}: answered {_short(got)}, the as-of fold {_short(want)}")
    at = rng.choice(times)
    got_table = {k: (v, ts) for k, v, ts in view.items_as_of(at)}
    want_table = {k: v for k in keys if (v := as_of(by_key[k], k, at)) is not None}
    if got_table != want_table:
        wrong = [k for k in want_table.keys() | got_table.keys() if got_table.get(k) != want_table.get(k)]
        out.append(f"the whole table as of {at}: {len(wrong)} keys differ from the as-of fold, e.g. "
                   f"{[(k, _short(got_table.get(k)), _short(want_table.get(k))) for k in wrong[:2]]}")
    return out, asked


def _short(v: tuple[bytes, int] | None) -> str:
    return "null" if v is None else f"({v[0][:24]!r}, {v[1]})"
