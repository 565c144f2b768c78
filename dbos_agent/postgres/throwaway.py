"""A throwaway PostgreSQL cluster in a temporary directory, for tests and benchmarks.

Fault tests may restart it (``-m immediate``), stop it for an outage and start it again on
the same port.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

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


class LocalCluster:
    """A throwaway server in a temporary directory, for tests and benchmarks."""

    def __init__(self, directory: Path, port: int, bin_dir: Path, user: ServiceUser | None) -> None:
        """Use `LocalCluster.start()`; this only records an already running cluster."""
        self.directory = directory
        self.port = port
        self._bin_dir = bin_dir
        self._user = user
        self._stopped = False
        self._owner_pid = os.getpid()
        atexit.register(self._stop_at_exit)  # a crashed test run must not leak servers

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:<port>/postgres`` (trust auth, no password)."""
        return url_for(self.port)

    @property
    def pgdata(self) -> Path:
        """The cluster's data directory (inside `directory`)."""
        return self.directory / "pgdata"

    @classmethod
    def start(cls, bin_dir: Path | None = None) -> LocalCluster:
        """initdb and start a fresh server; `bin_dir` defaults to `find_postgres_bin()`."""
        user = service_user()
        if bin_dir is None:
            bin_dir = find_postgres_bin()
        elif user is not None and not accessible_bin(bin_dir, user):
            make_traversable(bin_dir, user)
        directory = Path(tempfile.mkdtemp(prefix="dbos_agent_pg_"))
        directory.chmod(0o711)  # traversable by the service user, not listable
        pgdata = directory / "pgdata"
        log_file = directory / "postgres.log"
        try:
            init_cluster(pgdata, bin_dir, user, log_file)
            port = start_server(pgdata, bin_dir, user, log_file, settings=LOCAL_CLUSTER_SETTINGS)
        except BaseException:
            if read_pid_file(pgdata) is not None:
                stop_server(pgdata, bin_dir, user)
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return cls(directory, port, bin_dir, user)

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
        options = server_options(self.port, LOCAL_CLUSTER_SETTINGS)
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
