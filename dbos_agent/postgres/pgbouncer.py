"""A throwaway pgbouncer in transaction mode in front of a server, for tests and benchmarks.

Managed Postgres hands out a *pooled* URL (Supabase's pooler, Neon's pooled endpoint, RDS
Proxy) that is, or behaves like, pgbouncer in transaction mode: every transaction may run
on another server connection. Tests and benchmarks run the library through the real thing
(Debian's ``pgbouncer``) to keep what that takes true: no server-side prepared statements,
no session state assumed from one transaction to the next.

The pooler trusts its clients (``auth_type = trust``, for the user of the server's URL,
whose password, if any, it uses to log in to the server) and listens on a free loopback
port; its configuration and log live in a temporary directory removed by
:meth:`Pgbouncer.stop`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import unquote, urlsplit

from ..errors import PostgresNotFoundError
from . import _reaper
from .users import ServiceUser, service_user, start_as

__all__ = ["Pgbouncer", "find_pgbouncer"]

_CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer")
_START_WAIT_S = 15.0


def find_pgbouncer() -> Path:
    """The pgbouncer binary: ``$PGBOUNCER``, else on the PATH, else Debian's place."""
    named = os.environ.get("PGBOUNCER")
    found = named or shutil.which("pgbouncer")
    for candidate in (found, *_CANDIDATES):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise PostgresNotFoundError(
        "no pgbouncer binary: install it (Debian/Ubuntu: apt-get install pgbouncer) or set "
        "$PGBOUNCER to its path"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Pgbouncer:
    """pgbouncer in ``pool_mode = transaction`` in front of the server of ``server_url``.

    ``pool_size`` server connections per database and user (``default_pool_size``), at
    most ``max_client_conn`` clients; ``settings`` are further ``[pgbouncer]`` settings.
    """

    def __init__(
        self,
        server_url: str,
        *,
        pool_size: int = 10,
        max_client_conn: int = 1000,
        settings: Mapping[str, str] | None = None,
        binary: Path | None = None,
    ) -> None:
        parts = urlsplit(server_url)
        self._server_host = parts.hostname or "127.0.0.1"
        self._server_port = parts.port or 5432
        self._user_name = unquote(parts.username or "postgres")
        self._password = unquote(parts.password or "")
        self._binary = binary or find_pgbouncer()
        self._user: ServiceUser | None = service_user()  # it refuses to run as root
        self.directory = Path(tempfile.mkdtemp(prefix="dbos_agent_pgbouncer_"))
        self.port = _free_port()
        self._settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": str(self.directory / "users.txt"),
            "pool_mode": "transaction",
            "default_pool_size": str(pool_size),
            "max_client_conn": str(max_client_conn),
            "max_db_connections": str(pool_size),
            "server_lifetime": "3600",
            "logfile": str(self.directory / "pgbouncer.log"),
            "pidfile": str(self.directory / "pgbouncer.pid"),
            **(settings or {}),
        }
        self._process: subprocess.Popen[str] | None = None
        self._owner_pid = os.getpid()

    def url_for(self, server_url: str) -> str:
        """``server_url`` with its host and port replaced by this pooler's (the same user,
        password and database, its query kept)."""
        parts = urlsplit(server_url)
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        return parts._replace(netloc=netloc).geturl()

    def pooled_url(self, server_url: str) -> str:
        """:meth:`url_for`, declared pooled (``?pooler=transaction``): the URL an
        application is given for this pooler."""
        url = self.url_for(server_url)
        return url + ("&" if urlsplit(url).query else "?") + "pooler=transaction"

    def start(self) -> Self:
        """Write the configuration and start pgbouncer; returns once it accepts clients."""
        self.directory.chmod(0o755)  # readable by the service user it runs as under root
        users = self.directory / "users.txt"
        quoted = (v.replace('"', '""') for v in (self._user_name, self._password))
        users.write_text(" ".join(f'"{v}"' for v in quoted) + "\n")
        users.chmod(0o600)
        lines = ["[databases]", f"* = host={self._server_host} port={self._server_port}"]
        lines += ["", "[pgbouncer]", *(f"{k} = {v}" for k, v in self._settings.items())]
        config = self.directory / "pgbouncer.ini"
        config.write_text("\n".join(lines) + "\n")
        log = self.directory / "pgbouncer.log"
        if self._user is not None:
            for path in (self.directory, users, config):
                os.chown(path, self._user.uid, self._user.gid)
        with (self.directory / "stdout.log").open("a") as out:
            self._process = start_as(
                [self._binary, config], self._user, log=out, env={"PATH": os.defpath}
            )
        atexit.register(self._stop_at_exit)
        _reaper.guard(self.directory, f"pid:{self._process.pid}", signal.SIGINT)
        deadline = time.monotonic() + _START_WAIT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1),
            ):
                return self
            time.sleep(0.02)
        output = self.log_tail(log) + self.log_tail(self.directory / "stdout.log")
        self.stop()
        raise RuntimeError(f"pgbouncer did not start on port {self.port}:\n{output}")

    @staticmethod
    def log_tail(path: Path, lines: int = 30) -> str:
        """The last ``lines`` lines of one of its logs ('' when there is none)."""
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) + "\n"
        except OSError:
            return ""

    def log(self) -> str:
        """The end of pgbouncer's log, for a failing test's message."""
        return self.log_tail(self.directory / "pgbouncer.log")

    def stop(self) -> None:
        """Stop pgbouncer and remove its directory (idempotent)."""
        atexit.unregister(self._stop_at_exit)
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGINT)  # SIGINT: close at once
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _stop_at_exit(self) -> None:
        if os.getpid() == self._owner_pid:
            self.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Pgbouncer(port={self.port}, directory={str(self.directory)!r})"
