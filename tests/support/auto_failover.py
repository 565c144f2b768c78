"""A pg_auto_failover formation on this machine, for tests/process/test_auto_failover.py: a monitor
and two data nodes (a primary and its synchronous standby), each run by ``pg_autoctl`` in
one temporary folder, on free loopback ports, as the service user under root.

pg_autoctl runs as in pg_auto_failover's own test suite (``PG_AUTOCTL_DEBUG=1`` and an
empty ``PG_REGRESS_SOCK_DIR``): servers without a Unix socket (long temporary paths break
them), with Postgres's default memory settings instead of a quarter of the machine's RAM
each. The failover itself is pg_auto_failover's own, with the monitor's and the keepers'
timings shortened (:data:`FAST_MONITOR_SETTINGS`, :data:`FAST_KEEPER_SETTINGS`) so that
it takes seconds instead of most of a minute.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import getpass
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

import psycopg
from psycopg import sql

from dbos_agent.postgres.users import ServiceUser, make_traversable, run_as, service_user, start_as

#: The monitor's settings (milliseconds) for a failover in seconds instead of most of a
#: minute: what each one does, and the defaults, in docs/operating/high-availability.md
#: (*pg_auto_failover's timings*).
FAST_MONITOR_SETTINGS: Mapping[str, int] = {
    "pgautofailover.health_check_period": 1000,
    "pgautofailover.health_check_timeout": 2000,
    "pgautofailover.health_check_max_retries": 2,
    "pgautofailover.health_check_retry_delay": 500,
    "pgautofailover.node_considered_unhealthy_timeout": 3000,
    "pgautofailover.primary_demote_timeout": 2000,
    "pgautofailover.startup_grace_period": 1000,
}
#: The keepers' settings (pg_autoctl.cfg): a primary cut off from the monitor and its
#: standby stops its Postgres after network_partition_timeout seconds [20], which must
#: come before the monitor lets the standby take writes.
FAST_KEEPER_SETTINGS: Mapping[str, str] = {"timeout.network_partition_timeout": "1"}

_HOST = "127.0.0.1"
_WAIT_S = 60.0
_IPC_RMID, _IPC_STAT = 0, 2  # shmctl's commands (Linux)


def find_pg_autoctl() -> tuple[Path, Path] | None:
    """``pg_autoctl`` and the directory of the ``pg_ctl`` whose server has the
    pgautofailover extension (Debian's postgresql-NN-auto-failover installs both), or
    None. pg_autoctl may be on PATH or beside pg_ctl in /usr/lib/postgresql/NN/bin."""
    extensions = glob.glob("/usr/lib/postgresql/*/lib/pgautofailover.so")
    for bin_dir in sorted((Path(so).parent.parent / "bin" for so in extensions), reverse=True):
        pg_autoctl = bin_dir / "pg_autoctl"
        if not pg_autoctl.exists():
            found = shutil.which("pg_autoctl")
            if found is None:
                continue
            pg_autoctl = Path(found)
        if (bin_dir / "pg_ctl").exists():
            return pg_autoctl, bin_dir
    return None


def _free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free now (bound at once, so none twice)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind((_HOST, 0))
        return [int(s.getsockname()[1]) for s in sockets]


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def _remove_shared_memory(pgdata: Path) -> None:
    """Remove the System V segment of a server that was killed (its ``postmaster.pid``
    remains): a killed postmaster leaves it behind, and nothing else would remove it.
    Only if the segment of that id still has the key the file names (ids are reused)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        key, shmid = (int(field) for field in lines[6].split())
    except (OSError, IndexError, ValueError):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    status = ctypes.create_string_buffer(512)  # struct shmid_ds; it opens with the key
    found = libc.shmctl(shmid, _IPC_STAT, status) == 0
    if found and int.from_bytes(status.raw[:4], "little", signed=True) == key:
        libc.shmctl(shmid, _IPC_RMID, None)


class Formation:
    """A running pg_auto_failover formation: a monitor, a primary ``node1`` and its
    synchronous standby ``node2``; see :meth:`start`."""

    def __init__(
        self, directory: Path, pg_autoctl: Path, bin_dir: Path, user: ServiceUser | None
    ) -> None:
        """Use :meth:`start`."""
        self.directory = directory
        self._pg_autoctl = pg_autoctl
        self._bin_dir = bin_dir
        self._user = user
        #: The superuser of every server: initdb names it after the user it runs as.
        self.superuser = user.name if user is not None else getpass.getuser()
        self.ports: dict[str, int] = {}
        #: The formation's URI as ``pg_autoctl show uri`` gives it (every node, asking
        #: for the writable one), with the user to connect as.
        self.url = ""
        self._services: dict[str, subprocess.Popen[str]] = {}
        self._logs: dict[str, IO[str]] = {}
        self._crashed: set[str] = set()
        home = directory / "home"
        self._env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_DATA_HOME": str(home / "data"),
            "XDG_RUNTIME_DIR": str(home / "run"),
            "PG_AUTOCTL_DEBUG": "1",
            "PG_REGRESS_SOCK_DIR": "",
            "PGHOST": _HOST,
            "LC_ALL": "C.UTF-8",  # initdb's encoding: UTF8 (the C locale's is SQL_ASCII)
        }
        self._owner_pid = os.getpid()
        self._stopped = False
        atexit.register(self._stop_at_exit)  # a crashed test run must not leak servers

    @classmethod
    def start(cls, pg_autoctl: Path, bin_dir: Path) -> Formation:
        """Create and run the monitor (with :data:`FAST_MONITOR_SETTINGS`), then the
        primary, then the standby, and wait until they are ``primary`` and ``secondary``
        with :data:`FAST_KEEPER_SETTINGS`."""
        user = service_user()
        directory = Path(tempfile.mkdtemp(prefix="dbos_agent_paf_"))
        if user is not None:
            os.chown(directory, user.uid, user.gid)
            make_traversable(directory.parent, user)
            make_traversable(bin_dir, user)
        formation = cls(directory, pg_autoctl, bin_dir, user)
        try:
            formation._start()
        except BaseException:
            formation.stop()
            raise
        return formation

    def _start(self) -> None:
        monitor_port, port1, port2 = _free_ports(3)
        self.ports = {"monitor": monitor_port, "node1": port1, "node2": port2}
        self._run_service(
            "monitor",
            *("create", "monitor", "--pgport", str(monitor_port), "--hostname", _HOST),
            *("--listen", _HOST, "--auth", "trust", "--no-ssl", "--run"),
        )
        self._wait(self._monitor_ready, "the monitor ready")
        with psycopg.connect(self.monitor_url, autocommit=True) as conn:
            for name, setting in FAST_MONITOR_SETTINGS.items():
                conn.execute(
                    sql.SQL("ALTER SYSTEM SET {} = {}").format(
                        sql.Identifier(*name.split(".")), sql.Literal(setting)
                    )
                )
            conn.execute("SELECT pg_reload_conf()")
        self._create_node("node1")
        self._wait(lambda: self.states().get("node1") == ("single", "single"), "node1 single")
        # pg_autoctl's pg_basebackup waits for a spread checkpoint (seconds): make it short.
        with psycopg.connect(self.node_url("node1"), autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        self._create_node("node2")
        ready = {"node1": ("primary", "primary"), "node2": ("secondary", "secondary")}
        self._wait(lambda: self.states() == ready, "node1 primary and node2 its standby")
        # node1's keeper reported primary once it asked its server to reload the settings
        # that name node2 synchronous: wait until the server did.
        self._wait(lambda: self.replication("node1") == ["quorum"], "node2 synchronous")
        for name in ("node1", "node2"):
            for key, value in FAST_KEEPER_SETTINGS.items():
                pgdata = self._pgdata(name)
                self._pg_autoctl_command("config", "set", "--pgdata", pgdata, key, value)
        uri = self._pg_autoctl_command(
            "show", "uri", "--formation", "default", "--pgdata", self._pgdata("monitor")
        )
        scheme, _, rest = uri.strip().partition("://")
        self.url = f"{scheme}://{self.superuser}@{rest}"

    def _create_node(self, name: str) -> None:
        self._run_service(
            name,
            *("create", "postgres", "--pgport", str(self.ports[name]), "--pghost", _HOST),
            *("--listen", _HOST, "--hostname", _HOST, "--name", name),
            *("--username", self.superuser, "--dbname", "postgres", "--auth", "trust"),
            *("--no-ssl", "--monitor", self._monitor_uri("autoctl_node"), "--run"),
        )

    @property
    def monitor_url(self) -> str:
        """The monitor's database, as its superuser."""
        return self._monitor_uri(self.superuser)

    def _monitor_uri(self, role: str) -> str:
        port = self.ports["monitor"]
        return f"postgresql://{role}@{_HOST}:{port}/pg_auto_failover?sslmode=disable"

    def node_url(self, name: str) -> str:
        """The database ``postgres`` on data node ``name`` alone."""
        return f"postgresql://{self.superuser}@{_HOST}:{self.ports[name]}/postgres"

    def states(self) -> dict[str, tuple[str, str]]:
        """Each data node's state as its keeper last reported it, and the goal state
        the monitor assigned it: ``{"node1": ("primary", "primary"), ...}``."""
        with psycopg.connect(self.monitor_url, autocommit=True, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT nodename, reportedstate::text, goalstate::text"
                " FROM pgautofailover.node ORDER BY nodeid"
            ).fetchall()
        return {str(name): (str(reported), str(goal)) for name, reported, goal in rows}

    def replication(self, name: str) -> list[str]:
        """The ``sync_state`` of each standby streaming from data node ``name``."""
        with psycopg.connect(self.node_url(name), autocommit=True, connect_timeout=5) as conn:
            rows = conn.execute("SELECT sync_state FROM pg_stat_replication").fetchall()
        return [str(state) for (state,) in rows]

    def read_only(self, name: str) -> bool:
        """Whether data node ``name`` takes no writes (a standby, or a standby promoted but
        kept read-only until the old primary's demote timeout ran out), so that
        ``target_session_attrs=read-write`` passes it over."""
        with psycopg.connect(self.node_url(name), autocommit=True, connect_timeout=5) as conn:
            row = conn.execute(
                "SELECT pg_is_in_recovery()"
                " OR current_setting('default_transaction_read_only')::bool"
            ).fetchone()
        return row is not None and bool(row[0])

    def crash(self, name: str) -> None:
        """SIGKILL the node's keeper and its Postgres, every process of them at once: a
        crash of its machine, which no keeper restarts in place."""
        proc = self._services[name]
        self._crashed.add(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self._wait(lambda: _group_gone(proc.pid), f"{name}'s processes gone")

    def logs(self) -> str:
        """The tail of each pg_autoctl service's output (its keeper, its Postgres)."""
        parts = []
        for name in self._logs:
            path = self.directory / f"{name}.log"
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-40:]
                parts.append(f"--- {name} ---\n" + "\n".join(tail))
        return "\n".join(parts)

    def stop(self) -> None:
        """Stop every service (SIGTERM: pg_autoctl stops its Postgres; SIGKILL to the
        whole process group if it does not within 20 s) and delete the folder (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self._stop_at_exit)
        try:
            for proc in self._services.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in self._services.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=20)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                deadline = time.monotonic() + 20
                while not _group_gone(proc.pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
            for name in self._services:
                _remove_shared_memory(self._pgdata(name))
        finally:
            for log in self._logs.values():
                log.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    def _pgdata(self, name: str) -> Path:
        return self.directory / name

    def _run_service(self, name: str, *args: str) -> None:
        """Start ``pg_autoctl ARGS --pgdata <name> --pgctl ...``, which stays up as the
        node's service, in a process group of its own."""
        log = open(self.directory / f"{name}.log", "a")  # noqa: SIM115 (closed by stop)
        self._logs[name] = log
        command: list[str | Path] = [self._pg_autoctl, *args, "--pgdata", self._pgdata(name)]
        command += ["--pgctl", self._bin_dir / "pg_ctl"]
        self._services[name] = start_as(command, self._user, log=log, env=self._env)

    def _pg_autoctl_command(self, *args: str | Path) -> str:
        result = run_as([self._pg_autoctl, *args], self._user, timeout=60, env=self._env)
        if result.returncode != 0:
            raise RuntimeError(
                f"pg_autoctl {' '.join(map(str, args))} failed: {result.stdout}{result.stderr}"
            )
        return result.stdout

    def _monitor_ready(self) -> bool:
        try:
            with psycopg.connect(self._monitor_uri("autoctl_node"), connect_timeout=5) as conn:
                conn.execute("SELECT count(*) FROM pgautofailover.formation")
        except psycopg.Error:
            return False
        return True

    def _wait(self, predicate: Callable[[], object], what: str) -> None:
        """Wait for ``predicate``; fail naming ``what``, with the services' logs, after
        a minute, or at once if a service exited."""
        deadline = time.monotonic() + _WAIT_S
        delay = 0.01
        while not predicate():
            exited = [n for n, p in self._services.items() if p.poll() is not None]
            exited = [n for n in exited if n not in self._crashed]
            if exited or time.monotonic() > deadline:
                why = f"{', '.join(exited)} exited" if exited else f"{_WAIT_S:g}s passed"
                raise RuntimeError(f"waiting for {what}: {why}\n{self.logs()}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.1)

    def _stop_at_exit(self) -> None:
        """Stop a forgotten formation, but not from a forked child that inherited the hook."""
        if os.getpid() == self._owner_pid:
            self.stop()
