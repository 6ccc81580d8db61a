"""``since`` after a gap in reading (issue 45: never a ``since`` earlier than provable): one rule for a versioned
table that resumes reading its topic (a restart, an outage, a pause, a stall: ``store.database``'s
``history_resumed``) and for a store installed from an export, which tails from the export's offsets
(``export.bootstrap``). The gap (``Gap``) only words the reason."""

from __future__ import annotations

from dataclasses import dataclass

from globald.store.history import replay_since


@dataclass(frozen=True)
class Gap:
    """A span in which a table's store did not read its topic, for ``since_after_gap``: what started it and what
    ends it, in the words of the reason it gives when ``since`` moves."""

    start: str  # the time the span began
    span: str  # its length, "{gap}" in ms
    lost: str  # the versions that may be gone
    end: str  # what ends it, at ``now``
    behind: str  # why a start after ``now`` can be


# A table resuming after a restart, an outage, a pause or a stall: from its read mark (``names.META_HISTORY_READ``).
RESUME = Gap(start="the time the table last read its topic", span="the table did not read its topic for {gap} ms",
             lost="versions appended meanwhile", end="the resume", behind="stepped back")
# A store installed from an export (``export.bootstrap``), tailing from the export's offsets: from its snapshot's time.
BOOTSTRAP = Gap(start="the time the export's snapshot was taken", span="the export's snapshot is {gap} ms old",
                lost="versions after its offsets", end="the bootstrap's start",
                behind="stepped back, or the exporting host's clock is ahead of this one")


def since_after_gap(since: int, start_ms: int | None, now: int, lag_ms: int | None, gap: Gap,
                    tolerance_ms: int = 0) -> tuple[int, str | None]:
    """``since`` of a store that reads its topic again at ``now`` (epoch ms) after not reading it since
    ``start_ms`` (``gap``: a resume from a read mark, or a bootstrap from an export's snapshot), and why it moved
    (None: kept). A record appended meanwhile is removed by the log cleaner only once it is ``lag_ms`` old, and
    only for a later record of its key that is as old: a gap of at most the lag loses nothing, and a longer one
    may have lost the versions in force up to ``now - lag``, so ``since`` moves there (``replay_since``, the rule
    of a replay begun ``now``), or stays where it is when that is later. The edges, the same for every gap:

    - ``tolerance_ms``: a gap the caller's own cadence makes, taken as no gap (a running loop's turns; 0 at a
      restart and a bootstrap, measured against the lag alone);
    - **the lag unknown** (``lag_ms`` None: a Kafka 0.9 broker, a broker that does not list it) is 0: any gap
      longer than the tolerance moves ``since`` to ``now``;
    - **no start recorded** (``start_ms`` None: a store written by an older globald) proves nothing: it moves;
    - **a start after ``now``** (the wall clock stepped back past it, or an export's snapshot dated by a host whose
      clock is ahead) proves nothing about the gap's real length: it moves."""
    lag = max(0, lag_ms or 0)
    length = None if start_ms is None else now - start_ms
    if length is not None and 0 <= length <= max(lag, tolerance_ms):
        return since, None
    moved = max(since, replay_since(now, lag))
    if moved == since:
        return since, None
    lag_text = "unknown, taken as 0" if lag_ms is None else f"{lag_ms} ms"
    if length is None:
        what = f"nothing records {gap.start}"
    elif length < 0:
        what = f"the wall clock is {-length} ms behind {gap.start} ({gap.behind})"
    else:
        what = gap.span.format(gap=length)
    return moved, (f"{what}, longer than the topic's min.compaction.lag.ms ({lag_text}): {gap.lost} may have been "
                   f"compacted away, so since moves to {gap.end} less the lag")
