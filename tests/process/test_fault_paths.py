"""Faults on the paths added after tests/process/test_faults.py: a parent starting children, a
workflow reading another's stream, the family's running model spend, delayed starts.

Each test makes a durability claim for one path and holds it through a Postgres restart
(``pg_ctl restart -m immediate``) and, where the path writes much, ``pg_terminate_backend``
of every connection of the app's database. Side effects are counted from outside the
process: the step log of fault_app.py, the scripted model server's requests, SQL.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anthropic
import psycopg
import pytest

import dbos_agent as da
from dbos_agent._storage.database import SystemDatabase
from dbos_agent._storage.locks import SESSION_LOCK_CLASS
from dbos_agent.agent import Budget, Model
from dbos_agent.agent.scripted_server import Reply, ScriptedServer, text
from dbos_agent.testing import (
    Inspector,
    RestartablePostgres,
    advance_clock,
    clock_offset,
    dispatch_once,
    sweep_once,
)
from tests.apps.fault_app import expected, read_log, spawner
from tests.helpers import dead_sessions_after_start, new_id, wait_until
from tests.processes import start_worker, stop_workers

pytestmark = pytest.mark.long  # a minute or more in the suite: started first

CHILD_STEP = "dbos_agent.start_child"
READ_STEP = "dbos_agent.read_stream"


@pytest.fixture
def runtime(url: str, executor_id: str) -> Iterator[da.Runtime]:
    """A runtime in this process on the test's database; its clock put back after."""
    rt = da.launch(url, executor_id=executor_id, workers=8)
    try:
        yield rt
    finally:
        advance_clock(-clock_offset())
        rt.shutdown(grace=5)


def _starts(log: Path) -> Counter[tuple[str, int]]:
    """How often each (workflow, step) started: its side effects."""
    return Counter((wid, seq) for kind, _, wid, seq, _ in read_log(log) if kind == "S")


def _rows(url: str, sql: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params).fetchall()


def _children(url: str, parent: str) -> list[tuple[str, str]]:
    """The workflows whose parent is ``parent`` (id, status), from outside."""
    rows = _rows(
        url,
        "SELECT workflow_id, status FROM dbos_agent.workflows WHERE parent_id = %s"
        " ORDER BY workflow_id",
        parent,
    )
    return [(str(wid), str(status)) for wid, status in rows]


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the library logged at ERROR or worse: what a user would see go wrong."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("dbos_agent") and r.levelno >= logging.ERROR
    ]


def _state(url: str, parent: str) -> str:
    """The parent's and its children's rows and the sessions, for a failure's message."""
    workflows = _rows(
        url,
        "SELECT workflow_id, status, owner_key, wait_kind, wait_target, wake_at, queue_name"
        " FROM dbos_agent.workflows WHERE workflow_id = %s OR parent_id = %s"
        " ORDER BY created_at",
        parent,
        parent,
    )
    sessions = _rows(url, "SELECT * FROM dbos_agent.executors")
    return f"workflows: {workflows}; sessions: {sessions}"


def _check_spawned(url: str, db: Inspector, log: Path, parent: str, children: int) -> None:
    """The parent finished with every child's result; each child was started once (one
    start_child record each, one workflow row each) and its step ran once."""
    info = db.workflow(parent)
    assert info is not None and info.status is da.WorkflowStatus.SUCCESS, info
    assert info.output == expected(children)
    assert db.step_names(parent).count(CHILD_STEP) == children
    rows = _children(url, parent)
    assert len(rows) == children, rows
    assert {status for _, status in rows} == {"SUCCESS"}, rows
    ran = {wid for wid, _ in _starts(log)}
    assert {wid for wid, _ in rows} <= ran, "a child never ran its step"


# -- 1. a parent starting children --------------------------------------------------------


def test_children_started_through_a_restart_and_killed_connections_start_once(
    server: RestartablePostgres,
    url: str,
    db: Inspector,
    step_log: Path,
    runtime: da.Runtime,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A parent starts 20 children (da.start and Queue.enqueue, each id a recorded
    start_child step written before the child is admitted) while Postgres restarts and
    then while every connection of the database is killed: each child exists once and
    ran its step once, the parent finishes with all their results, nothing is logged
    as an error and nothing was recovered."""
    wid, children = new_id("parent"), 20
    with caplog.at_level(logging.INFO, logger="dbos_agent"):
        handle = da.start(spawner, wid, children, workflow_id=wid)
        wait_until(lambda: len(_children(url, wid)) >= 5, 30, "five children started")
        server.restart()
        done = len(_children(url, wid))
        wait_until(lambda: len(_children(url, wid)) >= done + 4, 30, "children after it")
        assert server.terminate(url) > 0
        try:
            result = handle.result(timeout=90)
        except TimeoutError:
            raise AssertionError(_state(url, wid)) from None
        assert result == expected(children)
    _check_spawned(url, db, step_log, wid, children)
    assert set(_starts(step_log).values()) == {1}, "a child's step ran twice"
    assert set(db.recovery_attempts().values()) == {0}
    assert _errors(caplog) == []


# -- 2. a workflow reading another's stream -----------------------------------------------


@da.durable_workflow(name="fault_paths_writer")
def writer(n: int) -> int:
    """Writes 0..n-1 to its stream "s", paced in its own code, then closes it."""
    for i in range(n):
        da.write_stream("s", i)
        time.sleep(0.03)
    da.close_stream("s")
    return n


@da.durable_workflow(name="fault_paths_reader")
def reader(source_id: str) -> list[int]:
    """Reads the writer's stream to its end; each item it reads is a recorded step."""
    return [int(item.value) for item in da.read_stream(source_id, "s")]


def _read_steps(db: Inspector, wid: str) -> int:
    """How many reads the reader recorded: its progress, seen from outside."""
    return db.step_names(wid).count(READ_STEP)


def test_a_workflow_reading_a_stream_through_a_restart_gets_every_item_once_in_order(
    server: RestartablePostgres, url: str, db: Inspector, runtime: da.Runtime
) -> None:
    """A reader workflow follows a writer workflow's stream while Postgres restarts and
    then while every connection is killed (its listener and its pool die under a read):
    it reads every item once, in order, to the close, each read recorded once, and the
    stream itself holds each item once; neither workflow is recovered."""
    n = 80
    source = da.start(writer, n)
    reading = da.start(reader, source.workflow_id)
    rid = reading.workflow_id
    wait_until(lambda: _read_steps(db, rid) >= 15, 30, "fifteen items read")
    server.restart()
    read = _read_steps(db, rid)
    wait_until(lambda: _read_steps(db, rid) >= read + 15, 30, "items read after it")
    assert server.terminate(url) > 0
    assert reading.result(timeout=60) == list(range(n))
    assert source.result(timeout=60) == n
    assert _read_steps(db, rid) == n + 1  # every item, and the end
    stored = _rows(
        url,
        "SELECT value::int FROM dbos_agent.streams WHERE workflow_id = %s AND key = 's'"
        " AND kind = 'value' ORDER BY \"offset\"",
        source.workflow_id,
    )
    assert [v for (v,) in stored] == list(range(n))
    assert set(db.recovery_attempts([rid, source.workflow_id]).values()) == {0}


# -- 3. the family's running model spend -------------------------------------------------

MODELS: dict[str, Model] = {}
HI = [{"role": "user", "content": "hi"}]
REPLY_TOKENS = 300  # each reply: 200 in, 100 out
ALLOWED = 16  # the budget covers this many replies: 16 * 300 + 200 fits, 17 * 300 + 200 not
BUDGET = ALLOWED * REPLY_TOKENS + 100


@pytest.fixture
def model_server() -> Iterator[ScriptedServer]:
    """A local model (300 tokens a reply) and a budgeted Model on it: its requests are
    the calls paid for, counted outside the workflow."""
    with ScriptedServer(lambda body: Reply((text("ok"),), usage=(200, 100))) as running:
        MODELS["model"] = Model(
            anthropic.Anthropic(base_url=running.url, api_key="x"),
            model="claude-haiku-4-5",
            max_tokens=200,
            retries=0,
            budget=Budget(max_tokens=BUDGET),
        )
        yield running
    MODELS.clear()


def _calls_until_refused() -> int:
    """Model calls, paced, until the budget refuses one; how many were made."""
    made = 0
    while True:
        try:
            MODELS["model"].create(HI)  # type: ignore[arg-type]
        except da.errors.BudgetExceededError:
            return made
        made += 1
        time.sleep(0.05)


@da.durable_workflow(name="fault_paths_spender_child")
def spender_child() -> int:
    """The child of :func:`spender`: its calls count against the parent's family."""
    return _calls_until_refused()


@da.durable_workflow(name="fault_paths_spender")
def spender(first: int) -> list[int]:
    """``first`` calls, then a child that calls until the family's budget refuses it,
    then one more call of its own (refused too): [made here, made by the child, made
    after]."""
    for _ in range(first):
        MODELS["model"].create(HI)  # type: ignore[arg-type]
        time.sleep(0.05)
    by_child = da.start(spender_child).result()
    return [first, by_child, _calls_until_refused()]


def _family_total(url: str, root: str) -> tuple[int, int]:
    """The running total of the family of ``root`` (replies, tokens), as the trigger kept it."""
    ((replies, tokens),) = _rows(
        url,
        "SELECT coalesce(sum(replies), 0)::bigint, coalesce(sum(input_tokens + output_tokens"
        " + cache_creation_input_tokens + cache_read_input_tokens), 0)::bigint"
        " FROM dbos_agent.family_usage WHERE workflow_id = %s AND step_name = %s",
        root,
        MODELS["model"].step_name,
    )
    return int(str(replies)), int(str(tokens))


_TOKEN_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


def _usage(key: str) -> str:
    """One token count of a recorded reply, read from its JSON here (not through the
    migration's own function, which the trigger uses)."""
    return f"coalesce((output->'usage'->>'{key}')::bigint, 0)"


def _summed_over_steps(url: str, ids: list[str]) -> tuple[int, int]:
    """The same, summed over the recorded replies of the family's steps."""
    ((replies, tokens),) = _rows(
        url,
        "SELECT count(*), coalesce(sum("
        + " + ".join(f"{_usage(k)}" for k in _TOKEN_KEYS)
        + "), 0)::bigint"
        " FROM dbos_agent.steps WHERE workflow_id = ANY(%s) AND name = %s"
        " AND status = 'SUCCESS' AND jsonb_typeof(output->'usage') = 'object'",
        ids,
        MODELS["model"].step_name,
    )
    return int(str(replies)), int(str(tokens))


def test_the_familys_running_spend_survives_a_restart_and_killed_connections(
    server: RestartablePostgres,
    url: str,
    db: Inspector,
    runtime: da.Runtime,
    model_server: ScriptedServer,
) -> None:
    """A parent and its child make model calls against one family budget while Postgres
    restarts and while every connection is killed: the running total the trigger keeps
    equals the sum over the recorded replies (nothing counted twice, nothing lost with
    a killed statement), every request to the model was recorded once, and the budget
    refuses exactly at its limit, in the child and in the parent after it."""
    wid, first = new_id("spender"), 4
    handle = da.start(spender, first, workflow_id=wid)
    wait_until(lambda: len(model_server.requests) >= first + 2, 30, "the child's calls began")
    server.restart()
    made = len(model_server.requests)
    wait_until(lambda: len(model_server.requests) >= made + 3, 30, "calls after it")
    assert server.terminate(url) > 0
    assert handle.result(timeout=60) == [first, ALLOWED - first, 0]
    ((child,),) = [(c,) for c, _ in _children(url, wid)]
    assert _family_total(url, wid) == _summed_over_steps(url, [wid, child])
    assert _family_total(url, wid) == (ALLOWED, ALLOWED * REPLY_TOKENS)
    assert len(model_server.requests) == ALLOWED  # no reply was paid for twice
    refused = [s for s in db.steps(child) + db.steps(wid) if s.status == "ERROR"]
    assert len(refused) == 2 and all("BudgetExceededError" in str(s.error) for s in refused)
    assert set(db.recovery_attempts([wid, child]).values()) == {0}


# -- 4. delayed starts --------------------------------------------------------------------

RUNS: Counter[str] = Counter()


@da.step
def count_run(tag: str) -> str:
    RUNS[tag] += 1
    return tag


@da.durable_workflow(name="fault_paths_later")
def later(tag: str) -> str:
    return count_run(tag)


def test_delayed_starts_across_a_restart_start_once_when_due(
    server: RestartablePostgres, db: Inspector, runtime: da.Runtime
) -> None:
    """A delayed start and a delayed enqueue wait through a Postgres restart: one pass
    of the waker and of the dispatcher after it starts neither before its time (the
    moved clock holds on the new connections); once due, each starts once, and further
    passes after a second restart start nothing again."""
    RUNS.clear()
    queue = da.Queue(new_id("q"))
    started = da.start(later, "started", delay=3600)
    queued = queue.enqueue(later, "queued", delay=3600)
    ids = [started.workflow_id, queued.workflow_id]
    advance_clock(1800)  # half-way
    server.restart()
    sweep_once()
    assert dispatch_once() == 0
    assert db.statuses(ids) == {
        ids[0]: da.WorkflowStatus.SUSPENDED,
        ids[1]: da.WorkflowStatus.ENQUEUED,
    }
    assert RUNS == Counter()
    advance_clock(1801)  # due now, on this process's database clock
    assert started.result(timeout=30) == "started"
    assert queued.result(timeout=30) == "queued"
    server.restart()
    sweep_once()
    assert dispatch_once() == 0
    assert RUNS == Counter({"started": 1, "queued": 1})
    assert [len(db.steps(wid)) for wid in ids] == [1, 1]
    assert set(db.recovery_attempts(ids).values()) == {0}


# -- 5. a paused worker holding a child-starting parent -----------------------------------


def test_a_worker_paused_while_starting_children_runs_nothing_after_it_wakes(
    url: str, db: Inspector, step_log: Path
) -> None:
    """SIGSTOP past the lease while a worker runs a parent that is starting children:
    another worker takes the parent over and finishes it; after SIGCONT the paused worker
    starts no step, each child id was started once (a start_child record each, one row
    each) and ran its step at most twice (only one in flight at the pause repeats)."""
    wid, children = new_id("paused-parent"), 16
    env = {"FAULT_APP_LOG": str(step_log), "FAULT_APP_STEP_SECONDS": "0.2"}
    paused = start_worker(url, "tests.apps.fault_app", "--lease", "2", "--workers", "16", env=env)
    other: subprocess.Popen[str] | None = None
    logs = ""
    try:
        with da.Client(url) as client:
            client.enqueue("fault-tests", "spawner", wid, children, workflow_id=wid)
        wait_until(lambda: len(_children(url, wid)) >= 4, 30, "four children started")
        paused.send_signal(signal.SIGSTOP)
        other = start_worker(
            url, "tests.apps.fault_app", "--lease", "2", "--workers", "16", env=env
        )
        wait_until(lambda: db.all_finished([wid]), 60, "the other worker finished the parent")
        logs = stop_workers([other])
        other = None
        paused.send_signal(signal.SIGCONT)
        woke_at = time.time()
        # Instead of sleeping: new work that only the woken worker can run. Once it has
        # finished it, the worker is past whatever its wake would have resumed.
        after = new_id("after")
        with da.Client(url) as client:
            client.enqueue("fault-tests", "chain", after, 2, workflow_id=after)
        wait_until(lambda: db.all_finished([after]), 60, "the woken worker ran new work")
    finally:
        logs += stop_workers([paused, *([other] if other else [])])
    _check_spawned(url, db, step_log, wid, children)
    kids = {c for c, _ in _children(url, wid)}
    late = [
        r
        for r in read_log(step_log)
        if r[0] == "S" and r[1] == paused.pid and r[2] in kids and r[4] > woke_at
    ]
    assert late == [], f"the paused worker started steps after waking: {late}"
    assert max(_starts(step_log).values()) <= 2
    assert db.status(after) is da.WorkflowStatus.SUCCESS
    assert {pid for _, pid, w, _, _ in read_log(step_log) if w == after} == {paused.pid}
    assert "Traceback" not in logs


# ------------------------------------------------------- a restart as long as a lease


def test_after_a_restart_a_session_has_its_lease_and_grace_to_come_back(
    server: RestartablePostgres, url: str
) -> None:
    """No session can heartbeat while Postgres is down, so its lease and grace count
    from the server's start too: a restart that lasted as long as a lease (crash
    recovery on a loaded machine) does not make every live process dead the moment the
    server is back, before any could reconnect and take its lock back. A session that
    ended cleanly is dead at once all the same."""
    database = SystemDatabase(url, pool_size=1)
    try:
        database.migrate()
    finally:
        database.close()
    with psycopg.connect(url, autocommit=True) as conn:
        # 7 holds its lock (the lease rule alone), 8 lost it (the grace too), 9 exited
        conn.execute(
            "INSERT INTO dbos_agent.executors (session_key, executor_id, hostname, pid,"
            " lease_seconds, grace_seconds, heartbeat_at, lock_lost_at) VALUES"
            " (7, 'held', 'test', 7, 30, 3, now() - interval '1 hour', NULL),"
            " (8, 'lost', 'test', 8, 30, 3, now() - interval '1 hour',"
            "  now() - interval '1 hour'),"
            " (9, 'gone', 'test', 9, 30, 3, '-infinity', NULL)"
        )
    server.restart()  # the heartbeats are an hour old when the server comes back
    with psycopg.connect(url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, 7)", (SESSION_LOCK_CLASS,))
        # as seen at moments after the server's start (not after this test looked: a
        # loaded machine may take seconds to get here)
        assert dead_sessions_after_start(url, 1) == [9]  # back, nobody else dead yet
        assert dead_sessions_after_start(url, 5) == [8, 9]  # a grace on: 8 did not relock
        assert dead_sessions_after_start(url, 31) == [7, 8, 9]  # a lease on: 7 did not renew
