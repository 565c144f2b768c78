"""A PostgreSQL cluster run straight from its binaries: initdb, start (on a free port, retried),
stop, and what its data directory says (its pid file, its port, its major version). Under
root every command runs as the service user (users.py) that owns the data directory. The
embedded default database (embedded.py) and the throwaway test servers (throwaway.py) are
built on this."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psycopg

from .._processes import pid_alive
from .binaries import find_bin, server_major
from .users import ServiceUser, make_traversable, run_as

logger = logging.getLogger(__name__)

_SUPERUSER = "postgres"
_HOST = "127.0.0.1"
_START_ATTEMPTS = 4
_START_TIMEOUT_S = 60
#: Throwaway servers serve test suites and benchmarks with many pools; durability stays default.
LOCAL_CLUSTER_SETTINGS: Mapping[str, str] = {"max_connections": "300"}


def url_for(port: int) -> str:
    return f"postgresql://{_SUPERUSER}@{_HOST}:{port}/postgres"


def log_tail(log_file: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log_file.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _prepare_log(log_file: Path, user: ServiceUser | None) -> None:
    """Create the server log; pg_ctl opens it as the service user, so that user must own it."""
    log_file.touch(exist_ok=True)
    if user is not None:
        os.chown(log_file, user.uid, user.gid)


def init_cluster(pgdata: Path, bin_dir: Path, user: ServiceUser | None, log_file: Path) -> None:
    """initdb into a scratch directory renamed into place, so `pgdata` is never half-made.

    Trust auth on a loopback-only server: there is no password to store or leak.
    """
    if pgdata.exists():
        if any(pgdata.iterdir()):
            raise RuntimeError(f"{pgdata} exists but is not a PostgreSQL data directory")
        pgdata.rmdir()
    scratch = pgdata.with_name(pgdata.name + ".init")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(mode=0o700, parents=True)
    _prepare_log(log_file, user)
    if user is not None:
        os.chown(scratch, user.uid, user.gid)
        make_traversable(scratch.parent, user)
    result = run_as(
        [
            bin_dir / "initdb",
            "-D",
            scratch,
            "--auth=trust",
            "-U",
            _SUPERUSER,
            "--encoding=UTF8",
            "--no-locale",  # C collation: no dependency on OS locales or glibc versions
            "--no-instructions",
        ],
        user,
        timeout=300,
    )
    with log_file.open("a") as log:
        log.write(result.stdout + result.stderr)
    if result.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise RuntimeError(
            f"initdb failed (exit {result.returncode}):\n{result.stdout}{result.stderr}"
        )
    scratch.rename(pgdata)


def _free_port(preferred: int | None = None) -> int:
    """A currently free loopback port, `preferred` if it is free (stable URLs across restarts)."""
    if preferred:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does
            try:
                s.bind((_HOST, preferred))
            except OSError:
                pass
            else:
                return preferred
    with socket.socket() as s:
        s.bind((_HOST, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class _PidFile:
    pid: int
    port: int


def read_pid_file(pgdata: Path) -> _PidFile | None:
    """Parse ``postmaster.pid`` (line 1 pid, line 4 port); None if absent or partial."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        return _PidFile(int(lines[0]), int(lines[3]))
    except (OSError, IndexError, ValueError):
        return None


def _is_postmaster(pid: int) -> bool:
    """Whether `pid` is alive and (where /proc tells) a postgres process, not a reused pid."""
    if not pid_alive(pid):
        return False
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"
    except OSError:
        return True  # no /proc: trust the pid


def postmaster_alive(pgdata: Path) -> bool:
    """Whether the postmaster of ``postmaster.pid`` still runs, without connecting to it:
    for a caller that must not take a slow or refused connection (a busy machine, a
    server in crash recovery) for a stopped server."""
    info = read_pid_file(pgdata)
    return info is not None and _is_postmaster(info.pid)


def running_port(pgdata: Path, *, wait_s: float = 10.0) -> int | None:
    """Port of a live server on `pgdata`, or None.

    ``postmaster.pid`` outlives a SIGKILLed server and its pid may be reused, so a server
    counts as running only if that pid lives and the port answers for this very `pgdata`.
    A live postmaster that does not answer yet (crash recovery) gets `wait_s` to do so.
    """
    deadline = time.monotonic() + wait_s
    while True:
        info = read_pid_file(pgdata)
        if info is None or not _is_postmaster(info.pid):
            return None
        try:
            with psycopg.connect(
                url_for(info.port), connect_timeout=3, autocommit=True, sslmode="disable"
            ) as conn:
                row = conn.execute("SHOW data_directory").fetchone()
            if row is not None and os.path.samefile(str(row[0]), pgdata):
                return info.port
            return None  # another server took that port: the pid file is stale
        except (psycopg.Error, OSError):
            pass
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


_IMPOSSIBLE_PID = 2**31 - 1  # above any pid_max: kill() reports "no such process"


def _defuse_stale_pid_file(pgdata: Path) -> None:
    """Let the server start over a ``postmaster.pid`` whose postmaster is gone.

    The server treats a zombie (where PID 1 does not reap, e.g. an app running as PID 1 in a
    container) or a reused pid as a live postmaster and refuses to start. Deleting the file
    would also drop the shared-memory key the server checks for orphaned backends, so only
    the pid is replaced by one that cannot exist; that interlock stays intact.
    """
    info = read_pid_file(pgdata)
    if info is None or _is_postmaster(info.pid):
        return
    with contextlib.suppress(OSError):
        os.waitpid(info.pid, os.WNOHANG)  # reap it if the dead postmaster was our child
    path = pgdata / "postmaster.pid"
    lines = path.read_text().splitlines(keepends=True)
    lines[0] = f"{_IMPOSSIBLE_PID}\n"
    path.write_text("".join(lines))  # in place: keeps the service user's ownership
    logger.info("replaced stale postmaster pid %d in %s", info.pid, path)


def server_options(port: int, settings: Mapping[str, str] | None) -> str:
    """``pg_ctl -o`` text: loopback only, on ``port``, no Unix socket, plus ``settings``."""
    options = {
        "listen_addresses": _HOST,
        "port": str(port),
        "unix_socket_directories": "",
        **(settings or {}),
    }
    return " ".join(f"-c {shlex.quote(f'{k}={v}')}" for k, v in options.items())


def start_server(
    pgdata: Path,
    bin_dir: Path,
    user: ServiceUser | None,
    log_file: Path,
    *,
    settings: Mapping[str, str] | None = None,
    preferred_port: int | None = None,
) -> int:
    """Start the server on 127.0.0.1 only (no Unix socket: long paths break them); its port.

    Retries on a fresh port because a probed-free port can be taken before the server binds.
    """
    _prepare_log(log_file, user)
    if user is not None:
        make_traversable(pgdata.parent, user)
    _defuse_stale_pid_file(pgdata)
    failure = ""
    for attempt in range(_START_ATTEMPTS):
        port = _free_port(preferred_port if attempt == 0 else None)
        opts = server_options(port, settings)
        result = run_as(
            [
                bin_dir / "pg_ctl",
                "start",
                "-D",
                pgdata,
                "-w",
                "-t",
                str(_START_TIMEOUT_S),
                "-l",
                log_file,
                "-o",
                opts,
            ],
            user,
            timeout=_START_TIMEOUT_S + 15,
            new_session=True,  # the server must outlive our process group
        )
        info = read_pid_file(pgdata)
        if result.returncode == 0 and info is not None:
            return info.port
        failure = f"{result.stdout}{result.stderr}\n--- {log_file} ---\n{log_tail(log_file)}"
        logger.warning("PostgreSQL failed to start on port %d (attempt %d)", port, attempt + 1)
        time.sleep(0.25 * 2**attempt)  # e.g. orphaned backends of a killed server still exiting
    raise RuntimeError(f"could not start PostgreSQL in {pgdata}:\n{failure}")


def stop_server(pgdata: Path, bin_dir: Path, user: ServiceUser | None) -> None:
    """Fast shutdown (abort sessions, clean checkpoint); immediate if that does not finish."""
    for mode in ("fast", "immediate"):
        result = run_as(
            [bin_dir / "pg_ctl", "stop", "-D", pgdata, "-m", mode, "-w", "-t", "60"],
            user,
            timeout=75,
        )
        if result.returncode == 0 or read_pid_file(pgdata) is None:
            return
        logger.warning("pg_ctl stop -m %s failed: %s", mode, result.stderr.strip())


def data_major(pgdata: Path) -> int | None:
    try:
        return int((pgdata / "PG_VERSION").read_text().strip())
    except (OSError, ValueError):
        return None


def bin_for(pgdata: Path) -> Path:
    """Binaries able to run `pgdata`: its PG_VERSION must match the server's major version."""
    bin_dir = find_bin()
    want = data_major(pgdata)
    if want is None or server_major(bin_dir) == want:
        return bin_dir
    return find_bin(major=want)
