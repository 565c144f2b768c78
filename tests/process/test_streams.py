"""Durable streams: values from the workflow body exactly once, live values from steps
tagged with their attempt and voided by a reset when it fails or re-runs (across a
kill -9), readers that resume from an offset without a gap or a duplicate."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import anthropic
import pytest

import dbos_agent as da
from dbos_agent._engine.runtime.core import Engine
from dbos_agent.agent import Model
from dbos_agent.agent.scripted_server import Reply, ScriptedServer, text
from tests.helpers import cli, new_id, wait_until
from tests.processes import output
from tests.support import zygote

ROOT = Path(__file__).resolve().parents[2]
RUNS: Counter[str] = Counter()
MODELS: dict[str, Model] = {}


@da.durable_workflow(name="streams_body_writer")
def body_writer(n: int) -> int:
    RUNS["body"] += 1
    for i in range(n):
        da.write_stream("progress", {"i": i})
    da.close_stream("progress")
    return n


def values(items: list[da.StreamItem]) -> list[object]:
    return [item.value for item in items]


def test_values_from_the_workflow_body_are_written_exactly_once(runtime: da.Runtime) -> None:
    wid = new_id("body")
    with da.workflow_id(wid):
        assert body_writer(3) == 3
    with da.workflow_id(wid):  # the recorded call: nothing runs, nothing is written again
        assert body_writer(3) == 3
    items = list(da.read_stream(wid, "progress"))
    assert [(i.offset, i.value, i.step, i.reset) for i in items] == [
        (0, {"i": 0}, None, False),
        (1, {"i": 1}, None, False),
        (2, {"i": 2}, None, False),
    ]
    assert [s.name for s in da.operations.list_steps(wid)] == ["dbos_agent.write_stream"] * 3 + [
        "dbos_agent.close_stream"
    ]
    with pytest.raises(da.errors.StreamClosedError), da.workflow_id(new_id("closed")):
        closed_then_written()


@da.durable_workflow(name="streams_closed_then_written")
def closed_then_written() -> None:
    da.close_stream("out")
    da.write_stream("out", 1)


@da.step(retries=1, interval=0.01)
def flaky_speaker() -> str:
    RUNS["flaky"] += 1
    da.write_stream("out", f"a{RUNS['flaky']}")
    da.write_stream("out", f"b{RUNS['flaky']}")
    if RUNS["flaky"] == 1:
        raise RuntimeError("cut off mid-reply")
    return "ok"


@da.durable_workflow(name="streams_retried")
def retried() -> str:
    return flaky_speaker()


def test_a_failed_attempt_is_voided_by_a_reset_before_the_retry_writes(
    runtime: da.Runtime,
) -> None:
    wid = new_id("retried")
    with da.workflow_id(wid):
        assert retried() == "ok"
    items = list(da.read_stream(wid, "out", timeout=5))
    assert [(i.value, i.reset, i.step, i.attempt) for i in items] == [
        ("a1", False, 0, 1),
        ("b1", False, 0, 1),
        (None, True, 0, 1),  # the first attempt failed: its items are void
        ("a2", False, 0, 2),
        ("b2", False, 0, 2),
    ]
    assert [i.offset for i in items] == list(range(5))


@da.durable_workflow(name="streams_live")
def live(n: int) -> str:
    for i in range(n):
        da.write_stream("ticks", i)
        time.sleep(0.05)
    return "finished"


def test_a_reader_follows_live_resumes_from_an_offset_and_stops_at_the_end(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    handle = da.start(live, 10)
    seen = []
    for item in da.read_stream(handle.workflow_id, "ticks", timeout=10):
        seen.append(item)
        if len(seen) == 4:
            break  # the reader goes away...
    rest = list(da.read_stream(handle.workflow_id, "ticks", seen[-1].offset + 1, timeout=10))
    assert values(seen) + values(rest) == list(range(10))  # ...and comes back: no gap, no dup
    assert handle.result(timeout=10) == "finished"  # it ended because the workflow did
    with da.Client(dbos_agent_database_url) as client:
        assert values(list(client.read_stream(handle.workflow_id, "ticks", 7))) == [7, 8, 9]

        async def read_async() -> list[object]:
            return [i.value async for i in client.read_stream_async(handle.workflow_id, "ticks")]

        assert asyncio.run(read_async()) == list(range(10))


def test_bad_stream_use_is_a_clear_error(runtime: da.Runtime) -> None:
    with pytest.raises(da.DbosAgentError, match="only be called inside a durable workflow"):
        da.write_stream("out", 1)
    with pytest.raises(da.WorkflowNotFoundError):
        list(da.read_stream("no-such-workflow", "out", timeout=1))
    with (
        pytest.raises(da.errors.SerializationError, match="stream 'out'"),
        da.workflow_id(new_id()),
    ):
        not_json()
    with pytest.raises(da.errors.InvalidIdentifierError):
        list(da.read_stream("x", "", timeout=1))


@da.durable_workflow(name="streams_not_json")
def not_json() -> None:
    da.write_stream("out", object())


@da.durable_workflow(name="streams_model")
def model_turns(turns: int) -> list[str]:
    model = MODELS["model"]
    out = []
    for _ in range(turns):
        reply = model.stream([{"role": "user", "content": "hi"}], stream_key="output")
        out.append("".join(b.text for b in reply.content if b.type == "text"))
    return out


def test_model_deltas_are_published_and_a_replayed_turn_publishes_nothing(
    runtime: da.Runtime,
) -> None:
    script = [Reply((text("hello there"),)), Reply((text("general"),))]
    with ScriptedServer(script) as server:
        MODELS["model"] = Model(anthropic.Anthropic(base_url=server.url, api_key="x"))
        wid = new_id("model-stream")
        with da.workflow_id(wid):
            assert model_turns(2) == ["hello there", "general"]
        with da.workflow_id(wid):
            assert model_turns(2) == ["hello there", "general"]  # replayed
        assert len(server.requests) == 2
    items = list(da.read_stream(wid, "output", timeout=5))
    assert "".join(str(i.value) for i in items) == "hello theregeneral"
    assert {i.step for i in items} == {0, 1} and not any(i.reset for i in items)


# --------------------------------------------------------------------------- kill -9


def test_a_reader_across_a_kill_of_the_writer_sees_no_gap_no_duplicate_and_a_reset(
    dbos_agent_database_url: str,
) -> None:
    url, wid = dbos_agent_database_url, new_id("kill-stream")
    env = {**os.environ, "DBOS_AGENT_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    items: list[da.StreamItem] = []
    failures: list[BaseException] = []

    def follow() -> None:
        try:
            with da.Client(url) as client:
                wait_until(lambda: client.db.workflows.get(wid) is not None, 30, "the workflow")
                items.extend(client.read_stream(wid, "output", timeout=60))
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    reader = threading.Thread(target=follow)
    reader.start()

    def writer(delay: str) -> subprocess.Popen[str]:
        return zygote.popen(
            [sys.executable, "-m", "tests.apps.stream_app", wid],
            env={**env, "STREAM_DELAY": delay},
            cwd=ROOT,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    first = writer("0.2")
    try:
        wait_until(lambda: len(items) >= 4, 30, "four words read", every=0.02)
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
    second = writer("0.01")
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, output(second, out, err)
    assert out.strip() == "10"
    reader.join(60)
    assert not failures, failures
    offsets = [i.offset for i in items]
    assert offsets == list(range(len(items)))  # no gap, no duplicate
    resets = [n for n, i in enumerate(items) if i.reset]
    assert len(resets) == 1 and items[resets[0]].step == 0  # the killed attempt is void
    before, after = items[: resets[0]], items[resets[0] + 1 :]
    words = [f"word{i}" for i in range(10)]
    assert values(before) == words[: len(before)] and len(before) >= 4
    assert values(after) == [*words, "done"]  # the re-run in full, then the body's value


def test_the_cli_prints_a_stream_and_follows_it(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    wid = new_id("cli-stream")
    RUNS["flaky"] = 0
    with da.workflow_id(wid):
        assert retried() == "ok"  # a1 b1, a reset of step 0, a2 b2
    shown = cli(dbos_agent_database_url, "stream", wid, "out")
    assert shown.returncode == 0, output(shown)
    assert shown.stdout.splitlines() == [
        "a1b1",
        "[step 0: the output above from this step is void; it ran again]",
        "a2b2",
    ]
    as_json = cli(dbos_agent_database_url, "--json", "stream", wid, "out", "--from", "1")
    assert as_json.returncode == 0, output(as_json)
    documents = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [d["offset"] for d in documents] == list(range(1, len(documents) + 1))
    handle = da.start(live, 5)
    followed = cli(dbos_agent_database_url, "stream", handle.workflow_id, "ticks", "--follow")
    assert followed.returncode == 0, output(followed)
    assert followed.stdout.split() == ["0", "1", "2", "3", "4"]  # until the workflow finished
    missing = cli(dbos_agent_database_url, "stream", "no-such-workflow", "out")
    assert missing.returncode != 0 and "no-such-workflow" in missing.stderr


def test_a_step_of_a_session_that_lost_the_workflow_writes_nothing(
    runtime: da.Runtime, engine: Engine
) -> None:
    """A process paused past its lease wakes up inside a step: its live items are void,
    so the guard writes none of them (the step's checkpoint is refused the same way)."""
    handle = da.start(live, 2)
    assert handle.result(timeout=10) == "finished"  # not PENDING any more: nobody owns it
    streams = engine.db.streams
    stale = streams.append_live(
        handle.workflow_id,
        "ticks",
        "value",
        '"late"',
        seq=0,
        attempt=1,
        attempt_id="x",
        owner_key=engine.session_key,
    )
    assert stale is None
    assert values(list(da.read_stream(handle.workflow_id, "ticks", timeout=5))) == [0, 1]
