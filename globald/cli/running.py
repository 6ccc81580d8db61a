"""Finding the daemon that runs on a state_dir, for the commands that talk to it (status, reload, export).

A daemon is found by its state_dir's lock (``store.statedir.lock_holder``), asked without creating anything; a
command that finds none says which state_dir it looked in and exits 5 (``exitcodes.FAILED``), whichever command it
is, so that a config naming another state_dir than the running daemon's is never taken for "stopped, all is well".
"""

from __future__ import annotations

from pathlib import Path

from globald.common.errors import GlobaldError


class NoDaemonError(GlobaldError):
    """No globald holds the state_dir's lock. Start one (``globald run --config FILE``), or check that the config
    names the state_dir of the daemon that runs (its log's "starting ... state_dir" line says which)."""


def no_daemon_line(state_dir: Path, config: str | None, hint: str = "") -> str:
    """The one line: the state_dir looked in, whose it is (``config``'s, unless named on the command line), and
    that no process holds its lock."""
    line = f"no globald runs on state_dir {state_dir}"
    whose = f"{config}'s state_dir; " if config is not None else ""
    return line + f" ({whose}no process holds its lock{'; ' + hint if hint else ''})"


def running_daemon(state_dir: Path, config: str | None, hint: str = "") -> str:
    """The pid (as the lock file says it) of the globald holding ``state_dir``; raises NoDaemonError when none."""
    from globald.store.statedir import lock_holder

    holder = lock_holder(state_dir)
    if holder is None:
        raise NoDaemonError(no_daemon_line(state_dir, config, hint))
    return holder
