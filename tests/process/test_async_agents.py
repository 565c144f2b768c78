"""Async agents on the process's shared event loop: hundreds of concurrent model calls
without a thread each, parallel async tool calls at reserved log positions (kept across
a kill -9), and the blocking waits that would stall the loop refused with a clear error."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types import MessageParam, ToolResultBlockParam, ToolUseBlock

import dbos_agent as da
from dbos_agent.agent import Model, ToolRegistry, tool
from dbos_agent.agent.scripted_server import Delay, Reply, ScriptedServer, text, tool_use
from dbos_agent.testing import Inspector
from tests.helpers import new_id, per_test, wait_until
from tests.processes import output
from tests.support import zygote

ROOT = Path(__file__).resolve().parents[2]
CURRENT: dict[str, Any] = per_test({})
HELLO: list[MessageParam] = [{"role": "user", "content": "hello"}]


def engine_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("dbos-agent"))


@da.durable_workflow(name="async_agents_one_call")
async def one_call(i: int) -> str:
    model: Model = CURRENT["model"]
    reply = await model.create_async([{"role": "user", "content": f"agent {i}"}])
    CURRENT["answered"] = CURRENT.get("answered", 0) + 1  # on the one event loop
    return "".join(block.text for block in reply.content if block.type == "text")


def test_five_hundred_async_agents_make_their_model_calls_at_once(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    """Each model call takes 1 s at the server; counted there as they arrive, hundreds are
    waiting for their answer at once (one thread per workflow: at most the 8 workers)."""
    waiting: list[int] = []

    def script(body: object) -> Delay:
        waiting.append(len(waiting) + 1 - CURRENT.get("answered", 0))  # asked, not answered
        return Delay(1.0, Reply((text("done"),)))

    with ScriptedServer(script) as server:
        CURRENT["model"] = Model(anthropic.Anthropic(base_url=server.url, api_key="x"))
        prefix = new_id("many-async")
        handles = [da.start(one_call, i, workflow_id=f"{prefix}-{i}") for i in range(500)]
        most_threads = 0
        while not all(h._future is None or h._future.done() for h in handles):
            most_threads = max(most_threads, engine_threads())
            time.sleep(0.05)
        results = [h.result(timeout=120) for h in handles]
    assert results == ["done"] * 500
    assert len(server.requests) == 500
    assert max(waiting) > 32, f"at most {max(waiting)} model calls waited at once"
    # the loop, its I/O threads (one per database connection) and the background daemons;
    # never one per agent
    assert most_threads < 40, f"{most_threads} dbos-agent threads for 500 async agents"
    assert set(inspector.statuses([h.workflow_id for h in handles]).values()) == {"SUCCESS"}


@tool
async def pause_then(i: int, seconds: float) -> int:
    """Sleep, then return i."""
    CURRENT.setdefault("started", []).append(i)
    await asyncio.sleep(seconds)
    CURRENT.setdefault("finished", []).append(i)
    return i


@tool
def plain(i: int) -> int:
    """A sync tool among async ones."""
    return -i


TOOLS = ToolRegistry([pause_then, plain])


def use(n: int, name: str, **tool_input: Any) -> ToolUseBlock:
    return ToolUseBlock(type="tool_use", id=f"toolu_{n:02d}", name=name, input=tool_input)


@da.durable_workflow(name="async_agents_fan_out")
async def fan_out(blocks: list[ToolUseBlock]) -> list[ToolResultBlockParam]:
    first = await TOOLS.call_all_async(blocks)
    second = await TOOLS.call_all_async([use(9, "plain", i=9)])
    return first + second


def test_parallel_async_tool_calls_take_positions_in_reply_order(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    blocks = [
        use(0, "pause_then", i=0, seconds=0.6),
        use(1, "pause_then", i=1, seconds=0.3),
        use(2, "nope"),
        use(3, "plain", i=3),
        use(4, "pause_then", i=4, seconds=0.0),
    ]
    results = asyncio.run(fan_out(blocks))
    assert [r["content"] for r in results] == ["0", "1", results[2]["content"], "-3", "4", "-9"]
    assert results[2].get("is_error") and "unknown tool 'nope'" in str(results[2]["content"])
    # in reverse, so they ran together: one after another, they would end in reply order
    assert CURRENT["finished"] == [4, 1, 0]
    wid = inspector.workflows(name="async_agents_fan_out")[0].workflow_id
    steps = inspector.steps(wid)
    assert [(s.seq, s.name) for s in steps] == [
        (0, "tool:pause_then"),
        (1, "tool:pause_then"),
        (2, "tool_call_rejected"),
        (3, "tool:plain"),
        (4, "tool:pause_then"),
        (5, "tool:plain"),
    ]
    assert [s.output for s in steps if s.output is not None] == [0, 1, -3, 4, -9]
    # replayed: the same results from the log, in the same places, nothing runs again
    CURRENT.clear()
    with da.workflow_id(wid):
        assert asyncio.run(fan_out(blocks)) == results
    assert "started" not in CURRENT


@tool(timeout=0.2)
async def too_slow() -> str:
    """Never finishes in time."""
    CURRENT["slow_attempts"] = CURRENT.get("slow_attempts", 0) + 1
    await asyncio.sleep(3600)  # only its timeout ends it within the test
    return "late"


@da.durable_workflow(name="async_agents_timeout")
async def times_out() -> list[ToolResultBlockParam]:
    return await ToolRegistry([too_slow]).call_all_async([use(0, "too_slow")])


def test_an_async_tool_past_its_timeout_is_an_error_for_the_model(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    result = da.start(times_out).result(timeout=120)[0]  # its 0.2 s timeout, not an hour
    assert result.get("is_error") and "TimeoutError" in str(result["content"])
    assert CURRENT["slow_attempts"] == 1
    wid = inspector.workflows(name="async_agents_timeout")[0].workflow_id
    assert inspector.steps(wid)[0].status == "ERROR"


@da.durable_workflow(name="async_agents_stream")
async def streams(turns: int) -> list[str]:
    model: Model = CURRENT["model"]
    texts = []
    for _ in range(turns):
        reply = await model.stream_async(HELLO, on_text=CURRENT.setdefault("deltas", []).append)
        texts.append("".join(block.text for block in reply.content if block.type == "text"))
    return texts


def test_a_streamed_async_model_call_is_checkpointed_and_replayed_silently(
    runtime: da.Runtime,
) -> None:
    script = [Reply((text("one two three"),)), Reply((text("four"),))]
    with ScriptedServer(script) as server:
        CURRENT["model"] = Model(anthropic.Anthropic(base_url=server.url, api_key="x"))
        wid = new_id("stream-async")
        with da.workflow_id(wid):
            assert asyncio.run(streams(2)) == ["one two three", "four"]
        assert "".join(CURRENT["deltas"]) == "one two threefour"
        assert [r.stream for r in server.requests] == [True, True]
        CURRENT["deltas"] = []
        with da.workflow_id(wid):
            assert asyncio.run(streams(2)) == ["one two three", "four"]
        assert CURRENT["deltas"] == []  # replayed: nothing streamed, nothing paid
        assert len(server.requests) == 2


def test_the_sync_registry_runs_async_tools_too(runtime: da.Runtime) -> None:
    results = TOOLS.call_all([use(0, "pause_then", i=7, seconds=0.0)], parallel=True)
    assert results[0]["content"] == "7"


@da.durable_workflow(name="async_agents_blocking_sleep")
async def sleeps_the_wrong_way() -> None:
    da.sleep(0.1)  # the sync sleep in an async workflow


def test_a_blocking_wait_on_the_shared_loop_is_refused_with_a_clear_error(
    runtime: da.Runtime,
) -> None:
    handle = da.start(sleeps_the_wrong_way)
    with pytest.raises(da.DbosAgentError, match="shared event loop: use its async form"):
        handle.result(timeout=30)


@da.step(name="async_agents_sync_double")
def sync_double(x: int) -> int:
    return 2 * x


@da.durable_workflow(name="async_agents_sync_steps")
async def calls_sync_steps(x: int) -> list[int]:
    direct = [sync_double(x), sync_double(x + 1)]  # on the loop: it waits for them
    off_loop = await asyncio.to_thread(sync_double, x + 2)
    return [*direct, off_loop]


def test_a_sync_step_on_the_shared_loop_works_and_is_warned_about_once(
    runtime: da.Runtime, inspector: Inspector, caplog: pytest.LogCaptureFixture
) -> None:
    """A sync step called in an async workflow still runs and is checkpointed, but it
    holds the loop every async workflow shares: one warning says so and what to do; the
    same step called through asyncio.to_thread keeps its position and draws none."""
    with caplog.at_level("WARNING", logger="dbos_agent"):
        handle = da.start(calls_sync_steps, 1)
        assert handle.result(timeout=30) == [2, 4, 6]
    warnings = [r.getMessage() for r in caplog.records if "blocks the event loop" in r.message]
    assert len(warnings) == 1, warnings
    assert "'async_agents_sync_double'" in warnings[0] and "asyncio.to_thread" in warnings[0]
    steps = inspector.steps(handle.workflow_id)
    assert [(s.seq, s.name, s.output) for s in steps] == [
        (0, "async_agents_sync_double", 2),
        (1, "async_agents_sync_double", 4),
        (2, "async_agents_sync_double", 6),
    ]


@da.durable_workflow(name="async_agents_child")
async def child(x: int) -> int:
    await da.aio.sleep(0.05)
    return x + 1


@da.durable_workflow(name="async_agents_parent")
async def parent(x: int) -> int:
    handle = da.start(child, x)
    return await handle.result_async()


def test_an_async_workflow_awaits_its_child_without_blocking_the_loop(runtime: da.Runtime) -> None:
    assert da.start(parent, 1).result(timeout=30) == 2


# --------------------------------------------------------------------------- kill -9


def _app(url: str, model_url: str, log: Path, wid: str, *, hang: bool) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "DBOS_AGENT_DATABASE_URL": url,
        "MODEL_URL": model_url,
        "TOOL_LOG": str(log),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("HANG_ODD", None)
    if hang:
        env["HANG_ODD"] = "1"
    return zygote.popen(
        [sys.executable, "-m", "tests.apps.async_agent_app", wid],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_parallel_async_tool_calls_keep_their_positions_across_a_kill(
    dbos_agent_database_url: str, inspector: Inspector, tmp_path: Path
) -> None:
    """Parts 0, 2 and 4 finish while 1 and 3 are still running; the process is killed -9.
    The next process replays the model call and the finished parts (not run, not paid
    again), runs only 1 and 3, and every part keeps the position of its place in the reply."""
    script = [
        Reply(tuple(tool_use("work", {"i": i}, id=f"toolu_{i}") for i in range(5))),
        Reply((text("all five parts done"),)),
    ]
    log = tmp_path / "tools.log"
    wid = new_id("async-kill")
    with ScriptedServer(script) as server:
        first = _app(dbos_agent_database_url, server.url, log, wid, hang=True)
        try:
            wait_until(
                lambda: (
                    {line.rsplit(" ", 1)[0] for line in _lines(log)}
                    >= {"done 0", "done 2", "done 4", "start 1", "start 3"}
                    # a part's "done" is written before its step is: wait for the steps
                    and {s.seq for s in inspector.steps(wid)} >= {0, 1, 3, 5}
                ),
                timeout=60,
                message="even parts done and recorded, odd parts running",
            )
        finally:
            first.send_signal(signal.SIGKILL)
            first.communicate(timeout=30)
        before = _lines(log)
        second = _app(dbos_agent_database_url, server.url, log, wid, hang=False)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 0, output(second, out, err)
        assert json.loads(out) == ["all five parts done"]
        assert len(server.requests) == 2  # the first model call was replayed, not paid again
    after = [line.rsplit(" ", 1)[0] for line in _lines(log)[len(before) :]]
    assert sorted(after) == ["done 1", "done 3", "start 1", "start 3"]
    steps = inspector.steps(wid)
    assert [(s.seq, s.name) for s in steps] == [
        (0, "anthropic.messages"),
        *((1 + i, "tool:work") for i in range(5)),
        (6, "anthropic.messages"),
    ]
    assert [s.output for s in steps[1:6]] == [0, 10, 20, 30, 40]
    assert inspector.status(wid) == "SUCCESS"
