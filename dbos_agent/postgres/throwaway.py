"""A throwaway PostgreSQL cluster in a temporary directory, for tests and benchmarks.

Fault tests may restart it (``-m immediate``), stop it for an outage and start it again on
the same port, or give it a streaming standby (``pg_basebackup -R``) and promote that.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

import psycopg
from psycopg import sql

from . import _reaper
from .binaries import accessible_bin, find_postgres_bin
from .cluster import (
    LOCAL_CLUSTER_SETTINGS,
    init_cluster,
    log_tail,
    read_pid_file,
    server_options,
    start_server,
    stop_server,
    url_for,
)
from .users import ServiceUser, make_traversable, run_as, service_user

__all__ = ["LocalCluster"]


@contextlib.contextmanager
def _scratch_directory(bin_dir: Path, user: ServiceUser | None) -> Iterator[Path]:
    """A fresh temporary directory for a cluster (its data in ``pgdata``, its log in
    ``postgres.log``), its server stopped and the directory removed if building the
    cluster in it fails."""
    directory = Path(tempfile.mkdtemp(prefix="dbos_agent_pg_"))
    directory.chmod(0o711)  # traversable by the service user, not listable
    try:
        yield directory
    except BaseException:
        if read_pid_file(directory / "pgdata") is not None:
            stop_server(directory / "pgdata", bin_dir, user)
        shutil.rmtree(directory, ignore_errors=True)
        raise


class LocalCluster:
    """A throwaway server in a temporary directory, for tests and benchmarks."""

    def __init__(
        self,
        directory: Path,
        port: int,
        bin_dir: Path,
        user: ServiceUser | None,
        settings: Mapping[str, str] = LOCAL_CLUSTER_SETTINGS,
    ) -> None:
        """Use `LocalCluster.start()`; this records an already running cluster and guards
        it: stopped at this process's exit, or by a reaper process if this one is killed."""
        self.directory = directory
        self.port = port
        self._bin_dir = bin_dir
        self._user = user
        #: The server's settings, kept for every start of it (and its standbys').
        self._settings = settings
        self._stopped = False
        self._owner_pid = os.getpid()
        atexit.register(self._stop_at_exit)  # a crashed test run must not leak servers
        # SIGQUIT to the postmaster: what pg_ctl stop -m immediate sends
        _reaper.guard(directory, "file:pgdata/postmaster.pid", signal.SIGQUIT)

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:<port>/postgres`` (trust auth, no password)."""
        return url_for(self.port)

    @property
    def pgdata(self) -> Path:
        """The cluster's data directory (inside `directory`)."""
        return self.directory / "pgdata"

    @classmethod
    def start(
        cls, bin_dir: Path | None = None, *, settings: Mapping[str, str] | None = None
    ) -> LocalCluster:
        """initdb and start a fresh server; `bin_dir` defaults to `find_postgres_bin()`.

        ``settings`` are server settings over the defaults (``max_connections=300``,
        durability as Postgres ships it): a test session may turn ``fsync`` off, a
        benchmark keeps it.
        """
        merged = {**LOCAL_CLUSTER_SETTINGS, **(settings or {})}
        user = service_user()
        if bin_dir is None:
            bin_dir = find_postgres_bin()
        elif user is not None and not accessible_bin(bin_dir, user):
            make_traversable(bin_dir, user)
        with _scratch_directory(bin_dir, user) as directory:
            pgdata, log_file = directory / "pgdata", directory / "postgres.log"
            init_cluster(pgdata, bin_dir, user, log_file)
            port = start_server(pgdata, bin_dir, user, log_file, settings=merged)
        return cls(directory, port, bin_dir, user, merged)

    @classmethod
    def standby_of(cls, primary: LocalCluster, *, synchronous: bool = True) -> LocalCluster:
        """A streaming standby of ``primary`` in a directory of its own (``pg_basebackup -R``:
        a copy that keeps replaying the primary's WAL, read-only until :meth:`promote`),
        started and caught up.

        With ``synchronous``, the primary then names it in ``synchronous_standby_names``
        (``ALTER SYSTEM``, so the standby's copy of the settings does not have it): every
        commit acknowledged by the primary is on the standby, and a promotion loses none.
        From then on a commit on the primary waits while the standby is down: stop the
        primary first.
        """
        user, bin_dir = primary._user, primary._bin_dir
        name = f"standby_{secrets.token_hex(4)}"
        with _scratch_directory(bin_dir, user) as directory:
            pgdata, log_file = directory / "pgdata", directory / "postgres.log"
            pgdata.mkdir(mode=0o700)
            if user is not None:
                os.chown(pgdata, user.uid, user.gid)
            result = run_as(
                [
                    *(bin_dir / "pg_basebackup", "-D", pgdata, "-R", "-X", "stream"),
                    *("-c", "fast", "-d", f"{primary.url}?application_name={name}"),
                ],
                user,
                timeout=120,
            )
            if result.returncode != 0:
                raise RuntimeError(f"pg_basebackup failed: {result.stdout}{result.stderr}")
            port = start_server(pgdata, bin_dir, user, log_file, settings=primary._settings)
            _wait_replicating(primary.url, name, synchronous=synchronous)
        return cls(directory, port, bin_dir, user, primary._settings)

    def promote(self) -> None:
        """Make a standby a primary (``pg_ctl promote -w``): it accepts writes on a new
        timeline once this returns."""
        self._pg_ctl("promote")

    def stop(self) -> None:
        """Stop the server and delete its directory (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self._stop_at_exit)
        try:
            if read_pid_file(self.pgdata) is not None:
                stop_server(self.pgdata, self._bin_dir, self._user)
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def restart(self, mode: str = "immediate") -> None:
        """``pg_ctl restart -m mode``: every connection dies, the port and data stay.

        For fault tests: ``immediate`` is a crash of the server (recovery from WAL at start).
        """
        self._pg_ctl("restart", "-m", mode, "-l", self.directory / "postgres.log")

    def stop_server(self, mode: str = "immediate") -> None:
        """Stop the server but keep the cluster, for :meth:`start_server` (an outage)."""
        self._pg_ctl("stop", "-m", mode)

    def start_server(self) -> None:
        """Start a server stopped by :meth:`stop_server`, on the same port."""
        options = server_options(self.port, self._settings)
        self._pg_ctl("start", "-l", self.directory / "postgres.log", "-o", options)

    def _pg_ctl(self, command: str, *args: str | Path) -> None:
        result = run_as(
            [self._bin_dir / "pg_ctl", command, "-D", self.pgdata, "-w", "-t", "60", *args],
            self._user,
            timeout=75,
            new_session=True,  # the server must outlive our process group
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"pg_ctl {command} failed: {result.stdout}{result.stderr}\n"
                f"{log_tail(self.directory / 'postgres.log')}"
            )

    def _stop_at_exit(self) -> None:
        """Stop a forgotten cluster, but not from a forked child that inherited the hook."""
        if os.getpid() == self._owner_pid:
            self.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalCluster(url={self.url!r}, directory={str(self.directory)!r})"


def _wait_replicating(
    primary_url: str, name: str, *, synchronous: bool, wait_s: float = 60
) -> None:
    """Wait until the standby ``name`` streams from the primary; with ``synchronous``, make
    it the primary's synchronous standby first and wait until it is one."""
    want = "sync" if synchronous else None
    with psycopg.connect(primary_url, autocommit=True) as conn:
        if synchronous:
            setting = sql.Literal(f'"{name}"')  # a quoted name: kept as it is
            conn.execute(sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}").format(setting))
            conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + wait_s
        while True:
            row = conn.execute(
                "SELECT sync_state FROM pg_stat_replication"
                " WHERE application_name = %s AND state = 'streaming'",
                (name,),
            ).fetchone()
            if row is not None and (want is None or row[0] == want):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"standby {name} is not replicating after {wait_s:g}s: {row}")
            time.sleep(0.05)
