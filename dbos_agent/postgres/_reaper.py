"""Stop a throwaway server whose owner was killed.

``python -S _reaper.py OWNER_PID OWNER_START DIRECTORY TARGET SIGNAL``

A `LocalCluster` or a `Pgbouncer` stops its server when its owner exits (``stop()``,
``with``, atexit); an owner killed with SIGKILL runs none of those, and the server would
run on with its directory. This process, started detached beside each, waits for the owner
(pid and kernel start time, so a reused pid is not mistaken for it) to be gone; then, if
the directory is still there, it sends the server SIGNAL (a number), waits for it to end
and removes the directory. TARGET is the server: ``pid:N``, or ``file:PATH`` for a pid
file inside DIRECTORY read only then (a cluster's ``postmaster.pid``: a restart changes it).

It is run by path with ``-S`` and imports only the standard library, so it costs a few
milliseconds to start, not the library's imports.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from pathlib import Path

_POLL_S = 1.0
_SHUTDOWN_WAIT_S = 60.0


def _start_time(pid: int) -> str | None:
    """The kernel start time of a running `pid`, None if it no longer runs (or is a zombie).

    `_processes.pid_alive` and `proc_start_time` in one read: this script cannot import
    them (run by path, it has no package, and the package's import would cost seconds)."""
    try:
        line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = line[line.rfind(")") + 2 :].split()
    if not fields or fields[0] == "Z":
        return None
    return fields[19] if len(fields) > 19 else ""


def _server(directory: Path, target: str) -> int | None:
    """The server's pid named by ``target`` (``pid:N`` or ``file:PATH``), None if unknown."""
    kind, _, value = target.partition(":")
    try:
        if kind == "file":
            return int((directory / value).read_text().split("\n", 1)[0])
        return int(value) if kind == "pid" else None
    except (OSError, ValueError):
        return None


def reap(owner_pid: int, owner_start: str, directory: Path, target: str, signum: int) -> None:
    """Wait for the owner to end; then stop the server it left and remove its directory."""
    while directory.exists() and _start_time(owner_pid) == owner_start:
        time.sleep(_POLL_S)
    if not directory.exists():
        return  # the owner stopped its server itself
    server = _server(directory, target)
    if server is not None and _start_time(server) is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signum)
        deadline = time.monotonic() + _SHUTDOWN_WAIT_S
        while _start_time(server) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
    shutil.rmtree(directory, ignore_errors=True)


def guard(directory: Path, target: str, signum: int) -> None:
    """Start the detached reaper of ``directory``'s server, for if this process is killed;
    none where this process's start time is unknown (no /proc): it could not be told from
    a process that reuses its pid."""
    from .._processes import spawn_detached  # not at the top: run as a script, it has no package

    start = _start_time(os.getpid())
    if not start:
        return
    owner = str(os.getpid())
    spawn_detached(
        [sys.executable, "-S", __file__, owner, start, str(directory), target, str(signum)]
    )


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit("usage: _reaper.py OWNER_PID OWNER_START DIRECTORY TARGET SIGNAL")
    reap(int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
