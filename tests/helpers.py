"""Small helpers shared by tests."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import sql

from dbos_agent._storage.database import SystemDatabase
from dbos_agent.testing import fresh_database
from tests.processes import output
from tests.support import zygote

#: The root of this checkout: subprocesses import its dbos_agent, whatever is installed.
CHECKOUT = Path(__file__).resolve().parent.parent

#: Set (as .ci/run does) to make a missing pgbouncer a failure instead of a skip.
REQUIRE_PGBOUNCER_ENV = "DBOS_AGENT_REQUIRE_PGBOUNCER"
#: Runs a test twice: on the session database directly, and through pgbouncer in
#: transaction mode (its ``database_url`` fixture, and the ``runtime`` built on it).
direct_and_pooled = pytest.mark.parametrize("database_url", ["direct", "pooled"], indirect=True)


_T = TypeVar("_T")
#: What `per_test` registered, emptied around every test by the ``per_test_state`` fixture.
PER_TEST: list[Any] = []


def per_test(state: _T) -> _T:
    """``state`` (a counter, set, dict or event that module-level steps write: the side
    effects a test counts, crash flags, gates), registered to be cleared before and after
    every test by one fixture (``per_test_state``, tests/conftest.py): steps must live at
    module level, so their side effects do, and no test may see another's."""
    PER_TEST.append(state)
    return state


def new_id(prefix: str = "wf") -> str:
    """A unique workflow id for one test."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def until_done(handle: Any, step: float = 30) -> Any:
    """A workflow's result, moving the database clock on ``step`` seconds whenever it is
    suspended for a step's retry (an outage longer than a test, passing), at most 60
    looks: then the failure says where the workflow is."""
    from dbos_agent.records import WorkflowStatus
    from dbos_agent.testing import advance_clock

    for _ in range(60):
        try:
            return handle.result(timeout=0.5)
        except TimeoutError:
            info = handle.get_info()
            if info.retrying is not None and info.status is WorkflowStatus.SUSPENDED:
                advance_clock(step)
    raise AssertionError(f"not done: {handle.get_info()!r} {handle.steps()!r}")


class SimulatedCrash(BaseException):
    """Raised inside a workflow to stop it the way a dying process would: no outcome."""


def wait_until(
    predicate: Callable[[], object],
    timeout: float = 30.0,
    message: str = "condition",
    *,
    every: float = 0.2,
) -> None:
    """Poll ``predicate`` until it is true; fail the test naming ``message`` after ``timeout``.

    Polls quickly at first, then at most ``every`` seconds apart: lower it where the
    moment matters (a kill that must land between two steps).
    """
    deadline = time.monotonic() + timeout
    delay = min(0.01, every)
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {message}")
        time.sleep(delay)
        delay = min(delay * 1.5, every)


def thread_stacks() -> list[list[FrameType]]:
    """The Python stack of every thread of this process now, innermost frame first."""
    stacks = []
    for frame in sys._current_frames().values():
        stack: list[FrameType] = []
        current: FrameType | None = frame
        while current is not None:
            stack.append(current)
            current = current.f_back
        stacks.append(stack)
    return stacks


def blocked_in(thread: threading.Thread, function: Callable[..., object]) -> bool:
    """Whether ``thread`` is inside ``function`` now (on its stack): a positive signal that
    it got as far as a blocking call, where a negative check would otherwise sleep."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code is function.__code__:
            return True
        frame = frame.f_back
    return False


#: Commands that run as a subprocess even without ``cwd``: daemons, and the deploy
#: check, which imports the app in a child of its own.
_OWN_PROCESS = frozenset({"worker", "serve", "check-deploy"})


def cli(
    url: str | None, *args: str, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python -m dbos_agent ARGS`` with $DBOS_AGENT_DATABASE_URL set to ``url``, this
    checkout first on its path (then ``cwd``, where an app under test may be).

    A command that needs no app (``cwd`` is None) and is no daemon runs in this process
    through :func:`dbos_agent.cli.main`, its output captured: the same code as the
    console script without the interpreter's start-up, which most of the suite's CLI
    calls would otherwise spend their time in.
    """
    command = [sys.executable, "-m", "dbos_agent", *args]
    if cwd is None and not _OWN_PROCESS.intersection(args):
        return _cli_here(url, command)
    env = {k: v for k, v in os.environ.items() if k != "DBOS_AGENT_DATABASE_URL"}
    if url is not None:
        env["DBOS_AGENT_DATABASE_URL"] = url
    env["PYTHONPATH"] = os.pathsep.join(
        [str(CHECKOUT), *([str(cwd)] if cwd is not None else []), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    return zygote.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


_CLI_LOCK = threading.Lock()


def _cli_here(url: str | None, command: list[str]) -> subprocess.CompletedProcess[str]:
    """:func:`cli` in this process: $DBOS_AGENT_DATABASE_URL set for the call only, and
    the exit status argparse raises (``--help``, a usage error) taken as a return."""
    from dbos_agent.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with (
        _CLI_LOCK,
        _environment("DBOS_AGENT_DATABASE_URL", url),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        try:
            status = main(command[3:])
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
    return subprocess.CompletedProcess(command, status, stdout.getvalue(), stderr.getvalue())


@contextlib.contextmanager
def _environment(name: str, value: str | None) -> Iterator[None]:
    """``os.environ[name]`` is ``value`` (unset if None) inside, as it was after."""
    before = os.environ.get(name)
    _set(name, value)
    try:
        yield
    finally:
        _set(name, before)


def _set(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, output(result)
    assert result.stderr == "", output(result)
    return result.stdout


def refused(
    result: subprocess.CompletedProcess[str],
    status: int,
    message: str,
    *,
    as_json: bool | None = None,
) -> None:
    """Failed with ``status`` and ``message``: one line on stderr; on stdout nothing, or,
    for an operational error (1) under ``--json`` (or wherever ``as_json`` says: a
    ``check-deploy`` that checked nothing, 2), the error as a JSON document."""
    assert result.returncode == status, output(result)
    if as_json is None:
        as_json = status == 1 and "--json" in result.args
    if as_json:
        error = json.loads(result.stdout)
        assert sorted(error) == ["error", "type"] and message in error["error"], error
    else:
        assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith("dbos-agent: error: "), result.stderr
    assert message in result.stderr, result.stderr


def dbos_agent_rows(url: str) -> dict[str, Any]:
    """Every row of every table of the dbos_agent schema, and where its session keys are:
    a command that must write nothing leaves this as it found it (an identity column's
    sequence aside, which a rolled-back insert moves too)."""
    found: dict[str, Any] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = "
            "'dbos_agent' AND table_type = 'BASE TABLE' ORDER BY 1"
        ).fetchall()
        for (table,) in tables:
            found[table] = conn.execute(
                sql.SQL(
                    "SELECT coalesce(jsonb_agg(to_jsonb(t) ORDER BY to_jsonb(t)::text), "
                    "'[]') FROM dbos_agent.{} AS t"
                ).format(sql.Identifier(table))
            ).fetchone()
        found["sequences"] = conn.execute(
            "SELECT sequencename, last_value FROM pg_sequences "
            "WHERE schemaname = 'dbos_agent' AND sequencename = 'session_keys'"
        ).fetchall()
    return found


def migrate(url: str) -> None:
    """Apply the schema to the database at ``url``."""
    db = SystemDatabase(url, pool_size=1)
    try:
        db.migrate()
    finally:
        db.close()


@contextlib.contextmanager
def migrated_database(server_url: str) -> Iterator[str]:
    """A fresh database on ``server_url`` with the schema in it (dropped afterwards)."""
    with fresh_database(server_url) as url:
        migrate(url)
        yield url


def dead_sessions_after_start(
    url: str, seconds: float, since: str = "pg_postmaster_start_time()"
) -> list[int]:
    """``dbos_agent.dead_sessions()`` as seen ``seconds`` after the server started (or
    after ``since``, an SQL expression of the test's own: ``dbos_agent.server_began_at()``
    for a promotion), its clock moved there in the statement's own transaction: what a
    restart or a failover leaves, however long the test took to look after it."""
    with psycopg.connect(url) as conn:
        conn.execute(
            f"SELECT set_config('dbos_agent.clock_offset', ({since}"
            " + make_interval(secs => %s) - now())::text, true)",
            (seconds,),
        )
        rows = conn.execute("SELECT * FROM dbos_agent.dead_sessions() ORDER BY 1").fetchall()
    return [int(row[0]) for row in rows]


def dead_sessions_at(url: str, ahead: str = "0s") -> list[int]:
    """``dbos_agent.dead_sessions()`` as a claimer whose clock is ``ahead`` of the
    server's (an interval: ``"5s"``) sees them, in order."""
    with psycopg.connect(url, options=f"-c dbos_agent.clock_offset={ahead}") as conn:
        rows = conn.execute("SELECT * FROM dbos_agent.dead_sessions() ORDER BY 1").fetchall()
    return [int(row[0]) for row in rows]
