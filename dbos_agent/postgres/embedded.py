"""The zero-configuration default database: a private PostgreSQL under ``./.dbos_agent/``.

It is initialised on first use and shared by every process started in the same folder
(each registers itself under ``users/``); the last one to exit stops it, and a detached
watcher stops it a few seconds after its last users were killed. How the server itself is
found, started and stopped is in ``binaries.py``, ``users.py`` and ``cluster.py``.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from .._processes import pid_alive, proc_start_time, spawn_detached
from .._storage.dsn import configured_url
from .binaries import find_bin
from .cluster import (
    bin_for,
    data_major,
    init_cluster,
    postmaster_alive,
    running_port,
    start_server,
    stop_server,
    url_for,
)
from .users import service_user

__all__ = [
    "DEFAULT_DIRECTORY",
    "embedded_database_url",
    "release_embedded_database",
    "resolve_url",
]

logger = logging.getLogger(__name__)

#: Where a project's embedded database lives, relative to the working directory.
DEFAULT_DIRECTORY = ".dbos_agent"
_LOCK_TIMEOUT_S = 180.0


# --------------------------------------------------------------------------- embedded default


_registered: dict[Path, int] = {}  # directory -> pid that registered it (forks must not unregister)
_registered_lock = threading.Lock()


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Exclusive cross-process lock on `directory` (flock: released even on SIGKILL)."""
    fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + _LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"timed out waiting for {directory / 'lock'}") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # also releases the lock


def _live_users(users_dir: Path) -> list[int]:
    """Registered pids that still run; entries of dead processes are deleted."""
    live: list[int] = []
    for entry in users_dir.glob("[0-9]*"):
        try:
            pid = int(entry.name)
            recorded = entry.read_text().strip()
        except (ValueError, OSError):
            continue
        if pid_alive(pid) and (not recorded or recorded == proc_start_time(pid)):
            live.append(pid)
        else:
            entry.unlink(missing_ok=True)
    return live


def embedded_database_url(directory: Path | str = DEFAULT_DIRECTORY) -> str:
    """URL of the project's embedded database, initialising and starting it as needed.

    The cluster lives in ``<directory>/pgdata`` and is shared by every process using the same
    directory; the last registered process to exit normally stops it. When the last users
    were killed instead (SIGKILL), a watcher process stops it a few seconds later; a caller
    that comes back within those seconds reuses the running server.
    """
    directory = Path(directory).expanduser().resolve()
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        (directory / ".gitignore").write_text("*\n")
    pgdata = directory / "pgdata"
    log_file = directory / "postgres.log"
    port_file = directory / "port"
    users_dir = directory / "users"
    with _locked(directory):
        port = running_port(pgdata)
        if port is None:
            user = service_user()
            if data_major(pgdata) is None:
                init_cluster(pgdata, find_bin(), user, log_file)
            try:
                preferred: int | None = int(port_file.read_text())
            except (OSError, ValueError):
                preferred = None
            port = start_server(pgdata, bin_for(pgdata), user, log_file, preferred_port=preferred)
            port_file.write_text(f"{port}\n")
            logger.info("started PostgreSQL for %s on port %d", directory, port)
            _spawn_watcher(directory)
        users_dir.mkdir(exist_ok=True)
        pid = os.getpid()
        (users_dir / str(pid)).write_text(proc_start_time(pid))
    with _registered_lock:
        if _registered.get(directory) != pid:  # first use, or first use in a forked child
            _registered[directory] = pid
            atexit.register(_release_at_exit, directory)
    return url_for(port)


def resolve_url(explicit: str | None = None) -> str:
    """The database URL given, else ``$DBOS_AGENT_DATABASE_URL``, else this embedded
    Postgres (started if need be): how ``launch()`` and ``Client`` find their database."""
    return configured_url(explicit) or embedded_database_url()


def release_embedded_database(directory: Path | str = DEFAULT_DIRECTORY) -> None:
    """Unregister this process now (normally done at exit); stops the server if it was last."""
    directory = Path(directory).expanduser().resolve()
    if not (directory / "lock").exists():
        return  # never used: nothing to release
    with _registered_lock:
        if _registered.pop(directory, None) is not None:
            atexit.unregister(_release_at_exit)
            for other in _registered:
                atexit.register(_release_at_exit, other)
    _release(directory)


def _release(directory: Path) -> None:
    pgdata = directory / "pgdata"
    with _locked(directory):
        (directory / "users" / str(os.getpid())).unlink(missing_ok=True)
        if _live_users(directory / "users"):
            return
        if running_port(pgdata, wait_s=0) is None:
            return
        stop_server(pgdata, bin_for(pgdata), service_user())
        logger.info("stopped PostgreSQL for %s", directory)


#: A server whose users are all gone (killed -9, so they never said goodbye) is stopped
#: this long after the last one went: a restart within it reuses the running server.
_ORPHAN_GRACE_S = 5.0
_WATCH_EVERY_S = 1.0


def _spawn_watcher(directory: Path) -> None:
    """Start the process that stops the server once no user of it runs any more.

    Users end it themselves when they exit normally; the watcher covers the ones that
    are killed. It is detached (its own session) and holds no lock between checks.
    """
    spawn_detached([sys.executable, "-m", "dbos_agent.postgres.embedded", "watch", str(directory)])


def watch(directory: Path) -> None:
    """The watcher's loop: stop the server once it has had no live user for the grace.

    Whether the server still runs is asked of its process, not of a connection: on a
    loaded machine a connection can take longer than its timeout, and a watcher that took
    that for a stopped server would leave, and the orphaned server would run on."""
    pgdata = directory / "pgdata"
    idle_since: float | None = None
    while True:
        time.sleep(_WATCH_EVERY_S)
        with _locked(directory):
            if not postmaster_alive(pgdata):
                return  # stopped by its last user, or by someone else
            if _live_users(directory / "users"):
                idle_since = None
                continue
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since >= _ORPHAN_GRACE_S:
                stop_server(pgdata, bin_for(pgdata), service_user())
                logger.info("stopped PostgreSQL for %s: its users are gone", directory)
                return


def _release_at_exit(directory: Path) -> None:
    """atexit hook: never raises; skipped in forked children that inherited the hook."""
    if _registered.get(directory) != os.getpid():
        return
    try:
        _release(directory)
    except Exception:
        logger.exception("failed to release the embedded PostgreSQL in %s", directory)


if __name__ == "__main__":  # the watcher: python -m dbos_agent.postgres.embedded watch DIR
    if len(sys.argv) == 3 and sys.argv[1] == "watch":
        watch(Path(sys.argv[2]))
