"""Stop a throwaway cluster whose owner was killed: ``python -S _reaper.py PID START DIR``.

A `LocalCluster` stops its server when its owner exits (``stop()``, ``with``, atexit); an
owner killed with SIGKILL runs none of those, and its server would run on with its
directory. This process, started detached beside every throwaway cluster, waits for the
owner (pid and kernel start time, so a reused pid is not mistaken for it) to be gone;
then, if the directory is still there, it shuts the server down at once (SIGQUIT to the
postmaster, as ``pg_ctl stop -m immediate`` does) and removes the directory.

It is run by path with ``-S`` and imports only the standard library, so it costs a few
milliseconds to start, not the library's imports.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

_POLL_S = 1.0
_SHUTDOWN_WAIT_S = 60.0


def _start_time(pid: int) -> str | None:
    """The kernel start time of a running `pid`, None if it no longer runs (or is a zombie)."""
    try:
        line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = line[line.rfind(")") + 2 :].split()
    if not fields or fields[0] == "Z":
        return None
    return fields[19] if len(fields) > 19 else ""


def _postmaster(pgdata: Path) -> int | None:
    try:
        return int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def reap(owner_pid: int, owner_start: str, directory: Path) -> None:
    """Wait for the owner to end; then stop the server it left and remove its directory."""
    while directory.exists() and _start_time(owner_pid) == owner_start:
        time.sleep(_POLL_S)
    if not directory.exists():
        return  # the owner stopped its cluster itself
    pgdata = directory / "pgdata"
    postmaster = _postmaster(pgdata)
    if postmaster is not None and _start_time(postmaster) is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(postmaster, signal.SIGQUIT)
        deadline = time.monotonic() + _SHUTDOWN_WAIT_S
        while _start_time(postmaster) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: _reaper.py OWNER_PID OWNER_START DIRECTORY")
    reap(int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
