"""Delayed starts: ``da.start(..., delay=)`` and ``Queue.enqueue(..., delay=)`` are durable
rows with a due time, holding no thread, started by whichever process is there then."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

import dbos_agent as da
from dbos_agent._engine.queues import dispatch_once, isolated_queues
from dbos_agent._engine.runtime.core import Engine
from dbos_agent._engine.runtime.current import current_engine
from dbos_agent.testing import Inspector, advance_clock, clock_offset
from tests.helpers import new_id, per_test, wait_until
from tests.processes import ROOT, output
from tests.support import zygote

RUNS: Counter[str] = per_test(Counter())


@da.step
def count(tag: str) -> str:
    RUNS[tag] += 1
    return tag


@da.durable_workflow
def later(tag: str) -> str:
    return count(tag)


@pytest.fixture
def clocked(dbos_agent_database_url: str, executor_id: str) -> Iterator[Engine]:
    """A runtime whose database clock the test moves (and puts back)."""
    with isolated_queues():
        rt = da.launch(dbos_agent_database_url, executor_id=executor_id, workers=8)
        try:
            yield current_engine()
        finally:
            advance_clock(-clock_offset())
            rt.shutdown(grace=5)


def test_a_delayed_start_waits_suspended_until_its_time(clocked: Engine) -> None:
    wid = new_id()
    handle = da.start(later, "a", workflow_id=wid, delay=3600)
    info = handle.get_info()
    assert info.status == da.WorkflowStatus.SUSPENDED and info.waiting_for is not None
    due = info.waiting_for.until
    assert due is not None and due - info.created_at >= timedelta(seconds=3599)
    # no run, no thread (the run that found the delay unwinds a moment after its row)
    wait_until(lambda: clocked.active_ids() == [], message="the delayed run released")
    assert RUNS["a"] == 0
    again = da.start(later, "a", workflow_id=wid, delay=5)  # the same id: the same row
    again_waits = again.get_info().waiting_for
    assert again_waits is not None and again_waits.until == due

    advance_clock(3601)
    assert handle.result(30) == "a"
    assert RUNS["a"] == 1


def test_a_delayed_enqueue_is_not_dequeued_before_its_time(clocked: Engine) -> None:
    q = da.Queue(new_id("q"))
    delayed = q.enqueue(later, "delayed", delay=3600)
    now = q.enqueue(later, "now")
    assert now.result(30) == "now"
    dispatch_once(clocked)
    info = delayed.get_info()
    assert info.status == da.WorkflowStatus.ENQUEUED and RUNS["delayed"] == 0
    assert info.delayed_until is not None
    assert info.delayed_until - info.created_at >= timedelta(seconds=3599)

    advance_clock(3601)
    assert delayed.result(30) == "delayed"
    assert delayed.get_info().delayed_until is None  # dequeued: the due time is spent


def test_a_delayed_start_can_be_cancelled_before_it_starts(clocked: Engine) -> None:
    handle = da.start(later, "never", delay=3600)
    da.operations.cancel(handle.workflow_id)
    advance_clock(3601)
    with pytest.raises(da.WorkflowCancelledError):
        handle.result(30)
    assert RUNS["never"] == 0


@da.durable_workflow
def starts_later(tag: str) -> str:
    child = da.start(later, tag, delay=3600)
    return child.workflow_id


def test_a_workflow_may_start_a_child_later(clocked: Engine) -> None:
    parent = new_id()
    with da.workflow_id(parent):
        child_id = starts_later("child")
    with da.workflow_id(parent):
        assert starts_later("child") == child_id  # recorded: the same child, started once
    child = da.retrieve(child_id)
    assert child.status() == da.WorkflowStatus.SUSPENDED and RUNS["child"] == 0
    advance_clock(3601)
    assert child.result(30) == "child"
    assert RUNS["child"] == 1


@pytest.mark.parametrize("delay", [-1, float("nan"), float("inf"), "5", 1e20, 1e9 + 1])
def test_a_bad_delay_is_refused(clocked: Engine, delay: Any) -> None:
    with pytest.raises(ValueError, match="delay"):
        da.start(later, "x", delay=delay)
    with pytest.raises(ValueError, match="delay"):
        da.Queue(new_id("q")).enqueue(later, "x", delay=delay)


def test_a_delayed_start_survives_its_process_and_starts_at_its_time(
    dbos_agent_database_url: str,
) -> None:
    prefix = new_id("delay")
    env = {**os.environ, "DBOS_AGENT_DATABASE_URL": dbos_agent_database_url}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    first = zygote.popen(
        [sys.executable, "-m", "tests.apps.delay_app", "start", prefix, "3"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None
        assert first.stdout.readline().strip() == "recorded"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    ids = [f"{prefix}-started", f"{prefix}-queued"]
    with Inspector(dbos_agent_database_url) as db:
        infos = {wid: db.workflow(wid) for wid in ids}
        assert {wid: (i.status if i else None) for wid, i in infos.items()} == {
            ids[0]: da.WorkflowStatus.SUSPENDED,
            ids[1]: da.WorkflowStatus.ENQUEUED,
        }
        assert all(db.steps(wid) == [] for wid in ids)  # nothing ran in the killed process
    second = zygote.run(
        [sys.executable, "-m", "tests.apps.delay_app", "wait", prefix],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert second.returncode == 0, output(second)
    results = json.loads(second.stdout.strip().splitlines()[-1])
    for wid, label in zip(ids, ["started", "queued"], strict=True):
        info = infos[wid]
        assert info is not None
        due = info.waiting_for.until if info.waiting_for else info.delayed_until
        assert due is not None
        ran_label, ran_at = results[wid]
        assert ran_label == label
        assert ran_at >= due.timestamp()  # not before its time
