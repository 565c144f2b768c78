"""Durable time: sleep records its wake-up time; restarts and crashes keep it (and recv's)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import dbos_agent as da
from dbos_agent._engine.runtime.core import Engine
from dbos_agent.testing import Inspector, advance_clock, clock_offset
from tests.helpers import SimulatedCrash, new_id, wait_until
from tests.process.test_messaging import APP, app_env
from tests.processes import run_app
from tests.support import zygote

CRASH: set[str] = set()


@da.step
def clock() -> float:
    return time.time()


@da.durable_workflow
def nap(seconds: float) -> float:
    """How long the workflow slept, by two recorded clock readings."""
    start = clock()
    da.sleep(seconds)
    wid = da.current_workflow_id()
    if wid in CRASH:
        CRASH.discard(wid)
        raise SimulatedCrash(wid)
    return clock() - start


@da.durable_workflow
def wait_for_mail(timeout: float) -> list[Any]:
    start = clock()
    message = da.recv(timeout=timeout)
    return [message, clock() - start]


@da.durable_workflow
async def async_nap(seconds: float) -> float:
    start = clock()
    await da.aio.sleep(seconds)
    return clock() - start


def test_sleep_outside_a_workflow_is_a_plain_sleep() -> None:
    started = time.monotonic()
    da.sleep(0.1)
    asyncio.run(da.aio.sleep(0.1))
    assert time.monotonic() - started >= 0.2
    with pytest.raises(ValueError):
        da.sleep(-1)


def test_sleep_records_its_wake_up_time_on_the_database_clock(
    runtime: da.Runtime, engine: Engine
) -> None:
    wid = new_id("nap")
    before = engine.db.messages.database_time()
    with da.workflow_id(wid):
        assert nap(0.3) >= 0.3
    after = engine.db.messages.database_time()
    [_, sleep_step, _] = da.operations.list_steps(wid)
    assert sleep_step.name == "dbos_agent.sleep"
    assert before + 0.3 <= sleep_step.output <= after


def test_replay_after_the_wake_up_time_does_not_sleep_again(runtime: da.Runtime) -> None:
    """A 10-minute sleep, woken by moving the clock, then the process "crashes": the replay,
    the clock still moved, returns at once (sleeping again would outlast the join)."""
    wid = new_id("nap")
    CRASH.add(wid)
    outcomes: list[object] = []

    def call() -> None:
        try:
            with da.workflow_id(wid):
                outcomes.append(nap(600))
        except BaseException as exc:
            outcomes.append(exc)

    first = threading.Thread(target=call)
    first.start()
    _wait_for_step(wid, "dbos_agent.sleep")
    advance_clock(600)
    try:
        first.join(30)
        assert [type(o) for o in outcomes] == [SimulatedCrash]
        replay = threading.Thread(target=call, daemon=True)
        replay.start()
        replay.join(30)
        assert not replay.is_alive(), "the replay slept again"
        assert isinstance(outcomes[1], float)
    finally:
        advance_clock(-600)


def test_async_workflows_sleep_on_the_event_loop(runtime: da.Runtime) -> None:
    wid = new_id("async-nap")
    with da.workflow_id(wid):
        assert asyncio.run(async_nap(0.3)) >= 0.3
    assert [s.name for s in da.operations.list_steps(wid)] == [
        "clock",
        "dbos_agent.sleep",
        "clock",
    ]


def _wait_for_step(wid: str, name: str) -> None:
    wait_until(
        lambda: any(s.name == name for s in da.operations.list_steps(wid)), 10, f"{wid}: {name}"
    )


def test_shutdown_ends_waits_and_a_restart_keeps_the_original_times(
    dbos_agent_database_url: str, executor_id: str
) -> None:
    """A sleep and a recv timeout both end at the time set before the restart (waits kept
    in memory, not suspended: shutdown ends them and the workflows stay PENDING)."""
    sleeper, receiver = new_id("nap"), new_id("mail")
    runtime = da.launch(
        dbos_agent_database_url, executor_id=executor_id, workers=4, suspend_after=10.0
    )
    try:
        da.start(nap, 2.0, workflow_id=sleeper)
        da.start(wait_for_mail, 2.0, workflow_id=receiver)
        _wait_for_step(sleeper, "dbos_agent.sleep")
        _wait_for_step(receiver, "dbos_agent.recv")  # the recv's deadline intent
        wake_ups = {wid: _recorded_waits(wid) for wid in (sleeper, receiver)}
    finally:
        runtime.shutdown(grace=5)
    runtime = da.launch(dbos_agent_database_url, executor_id=executor_id, workers=4)
    try:
        # not finished at shutdown (its waits ended there, not at their time) and not lost:
        # recovered (PENDING), or already suspended again until its time
        for wid in (sleeper, receiver):
            assert da.retrieve(wid).status() in (
                da.WorkflowStatus.PENDING,
                da.WorkflowStatus.SUSPENDED,
            )
        assert da.retrieve(sleeper).result(timeout=10) >= 2.0
        message, waited = da.retrieve(receiver).result(timeout=10)
        assert message is None and waited >= 2.0
        # the times kept: the ones recorded before the restart, none recorded again
        assert {wid: _recorded_waits(wid) for wid in (sleeper, receiver)} == wake_ups
    finally:
        runtime.shutdown(grace=5)


def _recorded_waits(wid: str) -> list[object]:
    """The wake-up times and deadlines ``wid`` recorded (its sleep and recv steps)."""
    return [
        (s.name, s.output)
        for s in da.operations.list_steps(wid)
        if s.name in ("dbos_agent.sleep", "dbos_agent.recv")
    ]


def _has_step(url: str, wid: str, name: str) -> bool:
    with Inspector(url) as db:
        try:
            return name in db.step_names(wid)
        except psycopg.errors.UndefinedTable:  # the app has not migrated the database yet
            return False


def test_durable_sleep_across_a_real_crash(dbos_agent_database_url: str, tmp_path: Path) -> None:
    """Sleep 10 minutes, SIGKILL, and take the workflow over in a process whose database
    clock is 10 minutes on: it wakes at once, at the wake-up time recorded before the
    crash. Sleeping again after the restart would outlast the take-over's 60 s wait: the
    test needs no clock of its own, however slow the machine."""
    url, wid = dbos_agent_database_url, new_id("crash-nap")
    env = app_env(url, tmp_path, new_id("executor"))
    app = zygote.popen(
        [sys.executable, str(APP), "sleep", wid, "600"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: _has_step(url, wid, "dbos_agent.sleep") or app.poll() is not None,
            30,
            "the app's sleep to begin",
        )
        assert app.poll() is None, app.communicate()
        app.send_signal(signal.SIGKILL)
        app.communicate(timeout=30)
    finally:
        app.kill()
    assert app.returncode == -signal.SIGKILL
    with Inspector(url) as db:
        recorded = [s.output for s in db.steps(wid) if s.name == "dbos_agent.sleep"]
    env["MSG_EXECUTOR"] = new_id("adopter")
    adopted = run_app([sys.executable, str(APP), "adopt", wid, "600"], env=env, timeout=120)
    assert json.loads(adopted.stdout) < 600  # by the apps' real clocks: no 10-minute sleep
    with Inspector(url) as db:
        sleeps = [s.output for s in db.steps(wid) if s.name == "dbos_agent.sleep"]
    assert len(recorded) == 1 and sleeps == recorded  # the wake-up time from before the crash


def test_a_cancel_ends_a_sleep_and_a_recv_at_once(runtime: da.Runtime) -> None:
    # an hour each: only the cancel can end them within the test
    sleeper = da.start(nap, 3600.0, workflow_id=new_id("nap"))
    receiver = da.start(wait_for_mail, 3600.0, workflow_id=new_id("mail"))
    _wait_for_step(sleeper.workflow_id, "dbos_agent.sleep")
    _wait_for_step(receiver.workflow_id, "dbos_agent.recv")
    for handle in (sleeper, receiver):
        da.operations.cancel(handle.workflow_id)
        with pytest.raises(da.WorkflowCancelledError):
            handle.result(timeout=120)
        assert handle.status() == da.WorkflowStatus.CANCELLED


def test_the_database_clock_moves_for_tests_instead_of_sleeping(
    runtime: da.Runtime, engine: Engine
) -> None:
    before = engine.db.messages.database_time()
    advance_clock(3600)
    try:
        assert clock_offset() == 3600
        after = engine.db.messages.database_time()
        assert 3600 <= after - before < 3660
        with engine.db.connection() as conn:  # every connection the library uses moves
            row = conn.execute("SELECT extract(epoch FROM dbos_agent.now()) AS t").fetchone()
        assert row is not None and float(row["t"]) - before >= 3600
    finally:
        advance_clock(-3600)


def test_sleeps_and_timeouts_end_when_the_clock_is_moved(runtime: da.Runtime) -> None:
    """An hour of sleep and an hour's recv timeout, over in moments: no test sleeps."""
    sleeper = da.start(nap, 3600.0, workflow_id=new_id("hour-nap"))
    receiver = da.start(wait_for_mail, 3600.0, workflow_id=new_id("hour-mail"))
    _wait_for_step(sleeper.workflow_id, "dbos_agent.sleep")
    _wait_for_step(receiver.workflow_id, "dbos_agent.recv")
    advance_clock(3600)
    try:
        assert sleeper.result(timeout=120) < 600  # by the real clock: it did not sleep an hour
        message, waited = receiver.result(timeout=120)
        assert message is None and waited < 600  # timed out
    finally:
        advance_clock(-3600)
