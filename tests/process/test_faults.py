"""Faults, as an operator meets them: Postgres restarted ``-m immediate``, connections
killed with ``pg_terminate_backend``, workers killed -9 or paused with SIGSTOP past
their lease. Side effects are counted from outside, in the step log of fault_app.py."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import dbos_agent as da
from dbos_agent._engine.runtime.current import current_engine
from dbos_agent._storage.outages import Retrier
from dbos_agent.testing import Inspector, RestartablePostgres
from tests.apps.fault_app import chain, expected, note, read_log
from tests.helpers import new_id, thread_stacks, wait_until
from tests.processes import start_worker, stop_workers

pytestmark = pytest.mark.long  # a minute or more in the suite: started first

_lines = read_log


def _starts(log: Path) -> Counter[tuple[str, int]]:
    """How often each (workflow, step) started: its side effects."""
    return Counter((wid, seq) for kind, _, wid, seq, _ in _lines(log) if kind == "S")


def _rows(url: str, sql: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params).fetchall()


def _runs_ended(log: Path, pid: int, ids: list[str]) -> bool:
    """Whether the runs of ``ids`` in the worker ``pid`` all left their workflow's code:
    its last line about each is ``X`` (fault_app notes it however the run ended). A
    worker woken from a pause past its lease ends them at its first step boundary, after
    it checked its ownership; from then on that worker has no run of them that could
    start a step: a negative check need not sleep while it might still start one."""
    last = {wid: kind for kind, p, wid, _, _ in _lines(log) if p == pid}
    return all(last.get(wid) == "X" for wid in ids)


def _retrying_in(workflow: Callable[..., object]) -> bool:
    """Whether a run of ``workflow`` in this process is in the retry path of the outage
    retrier now: a database call of it failed (the retrier set its deadline) and it
    waits to try again, starting nothing meanwhile."""
    code, retrying = inspect.unwrap(workflow).__code__, Retrier.call.__code__
    for stack in thread_stacks():
        if any(frame.f_code is code for frame in stack) and any(
            frame.f_code is retrying and frame.f_locals.get("deadline") is not None
            for frame in stack
        ):
            return True
    return False


def _all_succeeded(db: Inspector, ids: list[str]) -> bool:
    return set(db.statuses(ids).values()) == {da.WorkflowStatus.SUCCESS}


def _check_results(db: Inspector, ids: list[str], steps: int) -> None:
    """Every workflow SUCCESS with the right output, and each step recorded exactly once."""
    for wid in ids:
        info = db.workflow(wid)
        assert info is not None, wid
        assert (info.status, info.output) == (da.WorkflowStatus.SUCCESS, expected(steps)), wid
        assert [s.seq for s in db.steps(wid)] == list(range(steps)), wid


def _worker(url: str, log: Path, *extra: str, step_seconds: float = 0.1) -> subprocess.Popen[str]:
    env = {"FAULT_APP_LOG": str(log), "FAULT_APP_STEP_SECONDS": str(step_seconds)}
    return start_worker(url, "tests.apps.fault_app", *extra, env=env)


_stop = stop_workers


def _enqueue(url: str, ids: list[str], steps: int, workflow: str = "chain") -> None:
    with da.Client(url) as client:
        for wid in ids:
            client.enqueue("fault-tests", workflow, wid, steps, workflow_id=wid)


# -- in one process ---------------------------------------------------------------------


def test_the_session_comes_back_after_its_connection_is_killed(
    server: RestartablePostgres, url: str, db: Inspector, step_log: Path, executor_id: str
) -> None:
    rt = da.launch(url, executor_id=executor_id, workers=4)
    try:
        session = current_engine().session
        key, streak = rt.session_key, session.state.streak
        assert server.terminate(url, "dbos_agent_session") == 1
        wait_until(lambda: session.state.streak > streak, 10, "the session re-opened")
        assert rt.session_key == key and key in db.locked_sessions()  # the same key, locked again
        wid = new_id()
        assert da.start(chain, wid, 3, workflow_id=wid).result(timeout=20) == expected(3)
        assert list(db.recovery_attempts().values()) == [0]
    finally:
        rt.shutdown()


@da.durable_workflow
def fault_sleeper(seconds: float) -> str:
    da.sleep(seconds)
    return "awake"


@da.durable_workflow
def fault_receiver() -> str:
    return str(da.recv("go", timeout=None))


def test_suspended_workflows_wake_after_a_postgres_restart(
    server: RestartablePostgres, url: str, db: Inspector, executor_id: str
) -> None:
    """Nothing of a suspended workflow is in memory: a restart of Postgres while 40 are
    suspended loses none; the timers fire at their time and the messages sent after the
    restart wake their receivers (the listener reconnects; the sweep covers a lost NOTIFY)."""
    rt = da.launch(url, executor_id=executor_id, workers=4)
    try:
        sleepers = [da.start(fault_sleeper, 3.0) for _ in range(20)]
        receivers = [da.start(fault_receiver) for _ in range(20)]
        ids = [h.workflow_id for h in sleepers + receivers]
        wait_until(
            lambda: set(db.statuses(ids).values()) == {da.WorkflowStatus.SUSPENDED},
            20,
            "all suspended",
        )
        server.restart()
        for handle in receivers:
            da.send(handle.workflow_id, "after the restart", topic="go")
        assert [h.result(timeout=60) for h in sleepers] == ["awake"] * 20
        assert [h.result(timeout=60) for h in receivers] == ["after the restart"] * 20
    finally:
        rt.shutdown()
    assert all(db.step_names(h.workflow_id) == ["dbos_agent.sleep"] for h in sleepers)
    assert all(db.step_names(h.workflow_id) == ["dbos_agent.recv"] for h in receivers)
    assert set(db.recovery_attempts(ids).values()) == {0}  # woken, never recovered


def test_a_workflow_in_the_application_process_rides_out_a_postgres_restart(
    server: RestartablePostgres,
    url: str,
    db: Inspector,
    step_log: Path,
    executor_id: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rt = da.launch(url, executor_id=executor_id, workers=4)
    try:
        wid = new_id()
        steps = 20
        handle = da.start(chain, wid, steps, workflow_id=wid)
        wait_until(lambda: len(_starts(step_log)) >= 5, 20, "five steps ran")
        with caplog.at_level(logging.INFO, logger="dbos_agent"):
            server.restart()
            assert handle.result(timeout=60) == expected(steps)
            with da.Client(url) as client:  # a fresh client works; so did the old pool
                assert client.retrieve(wid).status() == da.WorkflowStatus.SUCCESS
    finally:
        rt.shutdown()
    _check_results(db, [wid], steps)
    assert set(_starts(step_log).values()) == {1}  # no step ran twice: checkpoints were retried
    assert list(db.recovery_attempts().values()) == [0]
    ours = [r for r in caplog.records if r.name.startswith("dbos_agent")]
    warnings = [r.getMessage() for r in ours if r.levelno >= logging.WARNING]
    back = [r.getMessage() for r in ours if "reachable again" in r.getMessage()]
    assert len(warnings) == 1 and "unavailable" in warnings[0], warnings
    assert len(back) == 1, back


@da.step
async def async_work(wid: str, i: int) -> int:
    note("S", wid, i)
    await asyncio.sleep(0.05)
    note("E", wid, i)
    return i * i


@da.durable_workflow
async def async_chain_with_stream(wid: str, steps: int) -> int:
    """Async steps on the shared event loop, each result also written to a stream."""
    total = 0
    for i in range(steps):
        value = await async_work(wid, i)
        await da.aio.write_stream("squares", value)
        total += value
    await da.aio.close_stream("squares")
    return total


def test_async_workflows_and_their_streams_ride_out_a_restart_and_killed_connections(
    server: RestartablePostgres, url: str, db: Inspector, step_log: Path, executor_id: str
) -> None:
    """Async workflows sharing the event loop, mid-run through a Postgres restart and then
    through pg_terminate_backend of every connection: none fails, every step runs once,
    and every stream holds each value once, in order, with nothing voided."""
    steps = 12
    rt = da.launch(url, executor_id=executor_id, workers=4)
    try:
        ids = [new_id() for _ in range(20)]
        handles = [da.start(async_chain_with_stream, wid, steps, workflow_id=wid) for wid in ids]
        wait_until(lambda: len(_starts(step_log)) >= 40, 30, "forty steps ran")
        server.restart()
        wait_until(lambda: len(_starts(step_log)) >= 120, 60, "steps run again after it")
        assert server.terminate(url) > 0
        assert [h.result(timeout=90) for h in handles] == [expected(steps)] * len(ids)
        for wid in ids:
            items = list(da.read_stream(wid, "squares", timeout=10))
            assert [(item.offset, item.value, item.reset) for item in items] == [
                (i, i * i, False) for i in range(steps)
            ], wid
    finally:
        rt.shutdown()
    assert set(_starts(step_log).values()) == {1}
    assert len(_starts(step_log)) == steps * len(ids)
    assert set(db.recovery_attempts(ids).values()) == {0}


@da.durable_workflow(name="fault_streamer")
def streamer(n: int) -> int:
    for i in range(n):
        da.write_stream("out", i)
        time.sleep(0.05)
    da.close_stream("out")
    return n


def test_the_http_api_and_a_stream_it_serves_ride_out_a_restart(
    server: RestartablePostgres, url: str, executor_id: str
) -> None:
    """A reader follows a workflow's stream as server-sent events from `dbos-agent serve`'s
    app while Postgres restarts under both the app and the writer: the reader gets every
    value once, in order, to the end, and the API answers afterwards as before."""
    import httpx

    from tests.support.web import TOKEN, Server

    n = 60
    rt = da.launch(url, executor_id=executor_id, workers=4)
    try:
        with (
            Server(url, TOKEN) as web,
            httpx.Client(
                base_url=web.base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
            ) as api,
        ):
            handle = da.start(streamer, n)
            events: list[tuple[str, dict[str, object]]] = []

            def read() -> None:
                path = f"/api/workflows/{handle.workflow_id}/streams/out"
                with api.stream("GET", path) as response:
                    block: dict[str, str] = {}
                    for line in response.iter_lines():
                        if line:
                            field, _, value = line.partition(": ")
                            block[field] = value
                        elif block:
                            events.append((block["event"], json.loads(block["data"])))
                            block = {}

            reader = threading.Thread(target=read)
            reader.start()
            wait_until(lambda: len(events) >= 10, 20, "ten values read")
            server.restart()
            reader.join(60)
            assert not reader.is_alive()
            assert handle.result(timeout=30) == n
            values = [data for kind, data in events if kind == "value"]
            assert [(v["offset"], v["value"]) for v in values] == [(i, i) for i in range(n)]
            assert events[-1][0] == "end"
            shown = api.get(f"/api/workflows/{handle.workflow_id}")
            assert shown.status_code == 200 and shown.json()["status"] == "SUCCESS"
    finally:
        rt.shutdown()


def test_the_client_rides_out_a_restart(server: RestartablePostgres, url: str) -> None:
    with da.Client(url) as client:
        first = client.enqueue("fault-tests", "chain", "a", 1)
        server.restart()  # every pooled connection of the client is dead now
        second = client.enqueue("fault-tests", "chain", "b", 1)
        assert {first.status(), second.status()} == {da.WorkflowStatus.ENQUEUED}


def test_past_the_outage_bound_the_caller_gets_an_error_and_the_workflow_continues_later(
    server: RestartablePostgres, url: str, db: Inspector, step_log: Path, executor_id: str
) -> None:
    rt = da.launch(url, executor_id=executor_id, workers=4, outage_timeout=1.0)
    try:
        wid, steps = new_id(), 12
        failure: list[BaseException] = []

        def call() -> None:
            try:
                with da.workflow_id(wid):
                    chain(wid, steps)
            except BaseException as exc:
                failure.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        wait_until(lambda: len(_starts(step_log)) >= 3, 20, "three steps ran")
        with server.down():
            caller.join(30)
            assert not caller.is_alive()
            assert len(failure) == 1 and isinstance(failure[0], da.DatabaseUnavailableError)
            assert "unavailable for 1s" in str(failure[0])
        # The database is back: the workflow was left PENDING and this process takes it back.
        wait_until(lambda: _all_succeeded(db, [wid]), 30, "the workflow finished")
    finally:
        rt.shutdown()
    _check_results(db, [wid], steps)
    starts = _starts(step_log)
    assert sum(starts.values()) - steps <= 1  # at most the step cut off by the outage ran twice
    errors = [w.error for w in db.workflows() if w.error is not None]
    assert errors == []  # the outage was never recorded as the workflow's error


# -- worker processes -------------------------------------------------------------------


def test_killing_the_session_connections_of_healthy_workers_takes_nothing_over(
    server: RestartablePostgres, url: str, db: Inspector, step_log: Path
) -> None:
    ids, steps = [new_id("killconn") for _ in range(6)], 25
    workers = [_worker(url, step_log, "--lease", "2") for _ in range(2)]
    try:
        _enqueue(url, ids, steps)
        wait_until(lambda: len(_starts(step_log)) >= 12, 30, "workflows under way")
        for _ in range(3):  # again and again, past the lease
            # both sessions back (a loaded machine may take longer than the pause below)
            wait_until(lambda: len(db.locked_sessions()) == 2, 10, "both sessions back")
            assert server.terminate(url, "dbos_agent_session") == 2
            time.sleep(1.0)  # not a wait for a condition: the kills go on past the lease
        server.terminate(url, "dbos_agent")  # and every pooled connection too
        wait_until(lambda: _all_succeeded(db, ids), 60, "all workflows finished")
    finally:
        logs = _stop(workers)
    _check_results(db, ids, steps)
    assert set(_starts(step_log).values()) == {1}, "a step ran twice"
    attempts = set(db.recovery_attempts().values())
    assert attempts == {0}, "a healthy worker's workflow was taken over"
    assert "Traceback" not in logs


def test_workers_ride_out_postgres_restarts_without_running_a_step_twice(
    server: RestartablePostgres, url: str, db: Inspector, step_log: Path
) -> None:
    ids, steps = [new_id("restart") for _ in range(6)], 25
    workers = [_worker(url, step_log, "--lease", "2") for _ in range(2)]
    try:
        _enqueue(url, ids, steps)
        for done in (8, 40, 80):

            def ran(n: int = done) -> bool:
                return len(_starts(step_log)) >= n

            wait_until(ran, 60, f"{done} steps ran")
            server.restart()
        wait_until(lambda: _all_succeeded(db, ids), 90, "all workflows finished")
    finally:
        logs = _stop(workers)
    _check_results(db, ids, steps)
    assert set(_starts(step_log).values()) == {1}, "a step ran twice"
    assert set(db.recovery_attempts().values()) == {0}
    assert "Traceback" not in logs


@pytest.mark.parametrize("workflow", ["chain", "paced"], ids=["in-a-step", "between-steps"])
def test_a_paused_worker_runs_nothing_after_it_wakes_up(
    server: RestartablePostgres, url: str, db: Inspector, step_log: Path, workflow: str
) -> None:
    """SIGSTOP past the lease: another worker takes over and finishes the workflows;
    after SIGCONT the paused one starts no step of them (zero side effects), whether
    the pause caught its runs inside a step or in the workflow's code between steps."""
    ids, steps = [new_id("paused") for _ in range(8)], 12
    paused = _worker(url, step_log, "--lease", "2", "--workers", "16", step_seconds=0.25)
    other: subprocess.Popen[str] | None = None
    try:
        _enqueue(url, ids, steps, workflow)
        wait_until(
            lambda: {w for _, _, w, _, _ in _lines(step_log)} >= set(ids), 30, "all under way"
        )
        paused.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        other = _worker(url, step_log, "--lease", "2", "--workers", "16", step_seconds=0.05)
        wait_until(lambda: _all_succeeded(db, ids), 60, "the other worker finished them")
        paused.send_signal(signal.SIGCONT)
        woke_at = time.time()
        wait_until(lambda: _runs_ended(step_log, paused.pid, ids), 30, "its runs of them ended")
        more = [new_id("after") for _ in range(8)]  # and it is a healthy worker again,
        _enqueue(url, more, 3, workflow)  # not a zombie whose new work others take from it
        wait_until(lambda: _all_succeeded(db, more), 30, "new work finished")
    finally:
        logs = _stop([paused, *([other] if other else [])])
    _check_results(db, ids, steps)
    lines = _lines(step_log)
    late = [
        r for r in lines if r[0] == "S" and r[1] == paused.pid and r[2] in ids and r[4] > woke_at
    ]
    assert late == [], f"the paused worker started steps after waking: {late}"
    for wid in ids:  # ownership moved once, cleanly: no start by the old owner after the new one
        starts = [(at, pid) for kind, pid, w, _, at in lines if kind == "S" and w == wid]
        first_other = min((at for at, pid in starts if pid != paused.pid), default=None)
        if first_other is not None:
            assert all(at < first_other for at, pid in starts if pid == paused.pid), wid
    assert max(_starts(step_log).values()) <= 2  # only the steps in flight at the pause
    _check_results(db, more, 3)
    assert all(_starts(step_log)[(wid, seq)] == 1 for wid in more for seq in range(3))
    attempts = db.recovery_attempts(more)
    assert (
        max(attempts.values()) == 0
    )  # nothing dequeued after the wake was taken from either worker
    assert stopped_at < woke_at
    assert "Traceback" not in logs


@pytest.mark.parametrize("same_host", [True, False], ids=["same-host", "other-host"])
def test_workflows_of_a_killed_worker_are_taken_over_promptly(
    server: RestartablePostgres, url: str, db: Inspector, step_log: Path, same_host: bool
) -> None:
    """kill -9 with a 30 s lease: the survivor takes over in seconds, not after the lease.
    From the same host the dead pid is seen at once; from another host (no process key
    to check) the lock has been free for the session's grace."""
    ids, steps = [new_id("killed") for _ in range(4)], 40
    # an hour's lease: only the lost session lock (the process is gone) can hand its
    # workflows over within the test
    victim = _worker(url, step_log, "--lease", "3600", "--workers", "16")
    survivor: subprocess.Popen[str] | None = None
    try:
        _enqueue(url, ids, steps)
        wait_until(
            lambda: {w for _, _, w, _, _ in _lines(step_log)} >= set(ids), 30, "all under way"
        )
        survivor = _worker(url, step_log, "--lease", "3600")
        survivor_pid = survivor.pid
        if not same_host:  # as if the victim ran elsewhere: its pid cannot be checked
            _rows(url, "UPDATE dbos_agent.executors SET process_key = NULL RETURNING 1")
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        wait_until(
            lambda: any(r[1] == survivor_pid for r in _lines(step_log) if r[0] == "S"),
            120,
            "the survivor took over",
        )
        wait_until(lambda: _all_succeeded(db, ids), 120, "all workflows finished")
    finally:
        logs = _stop([victim, *([survivor] if survivor else [])])
    _check_results(db, ids, steps)
    assert max(_starts(step_log).values()) <= 2
    assert "Traceback" not in logs


def test_a_rolling_restart_of_every_worker_under_load_loses_and_repeats_nothing(
    url: str, db: Inspector, step_log: Path
) -> None:
    """Each worker in turn gets SIGTERM (it finishes its running steps and ends its
    session) and a successor starts: with an hour's lease, nothing waits for it (a wait for
    the lease would outlast the test)."""
    ids, steps = [new_id("rolling") for _ in range(9)], 60
    workers = [_worker(url, step_log, "--lease", "3600", step_seconds=0.05) for _ in range(3)]
    try:
        _enqueue(url, ids, steps)
        for i in range(3):

            def ran(n: int = (i + 1) * 90) -> bool:
                return len(_starts(step_log)) >= n

            wait_until(ran, 60, "progress")
            old = workers[i]
            old.send_signal(signal.SIGTERM)
            assert old.wait(timeout=30) == 0
            workers[i] = _worker(url, step_log, "--lease", "3600", step_seconds=0.05)
        wait_until(lambda: _all_succeeded(db, ids), 120, "all workflows finished")
    finally:
        logs = _stop(workers)
    _check_results(db, ids, steps)
    assert set(_starts(step_log).values()) == {1}, "a step ran twice"
    assert "Traceback" not in logs


def test_a_read_only_server_during_a_failover_is_waited_out(
    server: RestartablePostgres, url: str, db: Inspector, step_log: Path, executor_id: str
) -> None:
    """As while a replica is promoted: for a while every new connection is read-only."""
    rt = da.launch(url, executor_id=executor_id, workers=4)
    dbname = url.rsplit("/", 1)[1]
    try:
        wid, steps = new_id(), 30
        handle = da.start(chain, wid, steps, workflow_id=wid)
        wait_until(lambda: len(_starts(step_log)) >= 5, 20, "five steps ran")
        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{dbname}" SET default_transaction_read_only = on')
            server.terminate(url, "dbos_agent")  # its connections come back read-only
            ran = len(_starts(step_log))
            # Once the run retries a write, it starts no step until that write is through
            wait_until(lambda: _retrying_in(chain), 20, "the run waits for a writable server")
            assert len(_starts(step_log)) <= ran + 1  # at most the step under way
            admin.execute(f'ALTER DATABASE "{dbname}" RESET default_transaction_read_only')
        assert handle.result(timeout=30) == expected(steps)
    finally:
        rt.shutdown()
    _check_results(db, [wid], steps)
    assert set(_starts(step_log).values()) == {1}


@da.durable_workflow
def waits_for_a_message(wid: str) -> str:
    da.set_event("ready", True)
    message = da.recv(topic="go", timeout=60)
    da.set_event("got", message)
    return f"got {message}"


def test_messages_and_events_ride_out_restarts(
    server: RestartablePostgres, url: str, executor_id: str
) -> None:
    rt = da.launch(url, executor_id=executor_id, workers=4)
    try:
        wid = new_id()
        handle = da.start(waits_for_a_message, wid, workflow_id=wid)
        assert da.get_event(wid, "ready", timeout=20) is True
        server.restart()  # while it waits in recv (its listener and pool die)
        da.send(wid, "hello", topic="go")  # on a pool whose connections all died
        server.restart()
        assert handle.result(timeout=60) == "got hello"
        assert da.get_event(wid, "got", timeout=0) == "hello"
    finally:
        rt.shutdown()
    with da.Client(url) as client:
        steps = [s.name for s in client.retrieve(wid).steps()]
    assert steps.count("dbos_agent.recv") == 1


def _send_all(url: str, ids: list[str], message: str) -> None:
    with da.Client(url) as client:
        for wid in ids:
            client.send(wid, message, topic="go")


def test_a_worker_paused_past_its_lease_while_waking_wakes_and_runs_nothing_twice(
    server: RestartablePostgres, url: str, db: Inspector, step_log: Path
) -> None:
    """Suspended workflows, some woken and mid-steps when their worker is paused (SIGSTOP)
    past its lease: another worker takes those over and wakes the rest when their
    messages come; after SIGCONT the paused one starts nothing of theirs, and every
    message is received exactly once."""
    woken, later, steps = (
        [new_id("woken") for _ in range(4)],
        [new_id("later") for _ in range(4)],
        8,
    )
    ids = woken + later
    paused = _worker(url, step_log, "--lease", "2", "--workers", "16", step_seconds=0.25)
    other: subprocess.Popen[str] | None = None
    try:
        _enqueue(url, ids, steps, "waiter")
        wait_until(
            lambda: set(db.statuses(ids).values()) == {da.WorkflowStatus.SUSPENDED},
            30,
            "all suspended in recv",
        )
        _send_all(url, woken, "first")
        wait_until(
            lambda: {w for _, _, w, _, _ in _lines(step_log)} >= set(woken), 30, "woken, mid-steps"
        )
        paused.send_signal(signal.SIGSTOP)
        other = _worker(url, step_log, "--lease", "2", "--workers", "16", step_seconds=0.05)
        _send_all(url, later, "second")  # only the other worker can wake these now
        wait_until(lambda: _all_succeeded(db, ids), 60, "the other worker finished them")
        paused.send_signal(signal.SIGCONT)
        woke_at = time.time()
        wait_until(lambda: _runs_ended(step_log, paused.pid, woken), 30, "its runs ended")
    finally:
        logs = _stop([paused, *([other] if other else [])])
    for wid in ids:
        info = db.workflow(wid)
        assert info is not None and info.status is da.WorkflowStatus.SUCCESS, wid
        message = "first" if wid in woken else "second"
        assert info.output == f"{message}:{expected(steps)}", wid
        assert db.step_names(wid) == ["dbos_agent.recv"] + ["work"] * steps, wid
    late = [r for r in _lines(step_log) if r[0] == "S" and r[1] == paused.pid and r[4] > woke_at]
    assert late == [], f"the paused worker started steps after waking: {late}"
    assert all(
        not any(pid == paused.pid for _, pid, w, _, _ in _lines(step_log) if w == wid)
        for wid in later
    )  # it never woke the ones whose messages came during its pause
    assert max(_starts(step_log).values()) <= 2  # only a step in flight at the pause repeats
    assert "Traceback" not in logs


def test_messages_to_waiters_woken_by_two_workers_are_each_received_once_in_order(
    url: str, db: Inspector, step_log: Path
) -> None:
    """Thirty workflows each receive five messages, one recv at a time, suspended before
    each, woken by whichever of two workers gets there first (a wake receives the message
    in its own statement): each message is received once, by the recv at its position,
    and each workflow gets its five in the order sent."""
    ids = [new_id() for _ in range(30)]
    count = 5
    workers = [_worker(url, step_log, step_seconds=0) for _ in range(2)]
    try:
        _enqueue(url, ids, count, workflow="collector")
        with da.Client(url) as client:
            for i in range(count):  # each message wakes a suspended recv
                wait_until(
                    lambda: set(db.statuses(ids).values()) == {da.WorkflowStatus.SUSPENDED},
                    60,
                    f"every collector waiting for message {i}",
                )
                for wid in ids:
                    client.send(wid, i, topic="m")
        wait_until(lambda: _all_succeeded(db, ids), 90, "every collector done")
    finally:
        _stop(workers)
    for wid in ids:
        info = db.workflow(wid)
        assert info is not None and info.output == list(range(count)), wid
        received = [(m.message, m.consumed_seq) for m in db.messages(wid)]
        assert received == [(i, i) for i in range(count)], wid


def test_killing_every_connection_of_a_waking_worker_loses_no_wake_up(
    url: str, db: Inspector, step_log: Path
) -> None:
    """pg_terminate_backend on all of a worker's connections (its pool, its listener, its
    session), again and again, while messages wake 30 suspended workflows: each wakes and
    finishes once (a lost NOTIFY is caught by the sweep)."""
    ids, steps = [new_id("killed-conns") for _ in range(30)], 2
    worker = _worker(url, step_log, "--workers", "8", step_seconds=0.02)
    try:
        _enqueue(url, ids, steps, "waiter")
        wait_until(
            lambda: set(db.statuses(ids).values()) == {da.WorkflowStatus.SUSPENDED},
            30,
            "all suspended in recv",
        )
        for batch in range(3):
            part = ids[batch * 10 : (batch + 1) * 10]
            _rows(
                url,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name LIKE 'dbos_agent%%' "
                "AND application_name <> 'dbos_agent_inspector' AND pid <> pg_backend_pid()",
            )
            _send_all(url, part, f"batch{batch}")
        wait_until(lambda: _all_succeeded(db, ids), 60, "every woken workflow finished")
    finally:
        logs = _stop([worker])
    for wid in ids:
        info = db.workflow(wid)
        assert info is not None and str(info.output).endswith(f":{expected(steps)}"), wid
        assert db.step_names(wid) == ["dbos_agent.recv"] + ["work"] * steps, wid
    assert max(_starts(step_log).values()) == 1
    assert "Traceback" not in logs
