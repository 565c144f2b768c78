"""Is a process still running? Answered from /proc, and only where the answer is sure.

A process key (boot id, pid namespace, pid, start time) names one process for as
long as the machine is up: two processes that share the first two parts see the
same pids, so one of them can tell whether the other still runs, reused pids
included. Where the platform cannot say (no /proc), there is no key.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (Linux), None if unavailable."""
    try:
        line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return line[line.rfind(")") + 2 :].split()


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs; a zombie (exited, not yet reaped) counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = proc_stat(pid)
    return not (fields and fields[0] == "Z")


def proc_start_time(pid: int) -> str:
    """Kernel start time of `pid` (Linux), to tell a live process from a reused pid; "" if
    unknown."""
    fields = proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else ""


@functools.cache
def _namespace() -> str | None:
    """'boot id/pid namespace' of this process, or None off Linux."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{pid_ns}" if boot and pid_ns else None


def process_key(pid: int | None = None) -> str | None:
    """The key of this process (or of `pid` in this namespace), None where unknowable."""
    namespace = _namespace()
    pid = os.getpid() if pid is None else pid
    start = proc_start_time(pid)
    if namespace is None or not start:
        return None
    return f"{namespace}/{pid}/{start}"


def known_gone(key: str | None) -> bool:
    """True only when `key` is a process of this namespace that no longer runs."""
    namespace = _namespace()
    if key is None or namespace is None or not key.startswith(namespace + "/"):
        return False
    try:
        pid_text, start = key[len(namespace) + 1 :].split("/")
        pid = int(pid_text)
    except ValueError:
        return False
    return not pid_alive(pid) or proc_start_time(pid) != start


def session_gone_here(key: str | None, lock_free: bool) -> bool:
    """Whether an executor session is over, as seen from this host: its advisory lock is
    free and its process (``key``, of this namespace) no longer runs. A process killed
    -9 is known gone at once this way, long before its lease runs out; a session of
    another host, or whose lock is held, is left to the database's rules."""
    return lock_free and known_gone(key)


#: Started by `spawn_detached`: starts its arguments in a session of their own, then ends.
_DETACH = (
    "import subprocess, sys; subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL,"
    " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)"
)


def spawn_detached(argv: Sequence[str]) -> None:
    """Start ``argv`` detached: in a session of its own, without our stdio, and not our
    child. A helper that ends at once starts it, so the process is adopted by init (or a
    subreaper) and this one keeps no child it would have to reap or warn about
    (``ResourceWarning: subprocess is still running``)."""
    subprocess.run(
        [sys.executable, "-S", "-c", _DETACH, *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        check=True,
        timeout=60,
    )
