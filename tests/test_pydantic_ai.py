"""Pydantic AI agents made durable by ``dbos_agent.integrations.pydantic_ai.Durability``.

The agents (tests/pydantic_ai_app.py) use Pydantic AI's own Anthropic model over real HTTP
to the scripted Messages API server, which counts every request it answers; the crash
tests run the app as a subprocess, kill it with SIGKILL, run it again, and count from
outside the process: the server's request log, the side-effect file (each run of a
workflow body, each tool call, with the pid) and the step log.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelResponse, ToolCallPart

import dbos_agent as da
from dbos_agent.agent import usage_totals
from dbos_agent.agent.accounting import MODEL_STEP_NAMES
from dbos_agent.agent.replay import ReplayReport, track_replay
from dbos_agent.agent.scripted_server import Reply, ScriptedServer, ScriptItem, text, tool_use
from dbos_agent.records import describe_step
from dbos_agent.testing import Inspector
from tests import pydantic_ai_app as app
from tests.helpers import new_id, wait_until

ROOT = Path(__file__).parent.parent
ADD = "calc__function_toolset__math.call_tool:add"
SLOW = "calc__function_toolset__math.call_tool:slow"
MODEL = "calc__model.request"

Serve = Callable[[list[ScriptItem]], ScriptedServer]

#: Three turns: add(1, 2), add(3, 4), then the answer.
TWO_ADDS = [
    Reply((tool_use("add", {"a": 1, "b": 2}),)),
    Reply((tool_use("add", {"a": 3, "b": 4}),)),
    Reply((text("the answer is 10"),)),
]


@pytest.fixture
def side_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "side.log"
    monkeypatch.setenv("SIDE_LOG", str(log))
    return log


@pytest.fixture
def serve() -> Iterator[Callable[[list[ScriptItem]], ScriptedServer]]:
    """Start a scripted server with a script, the app's agents (in this process) on it."""
    started: list[tuple[ScriptedServer, str]] = []

    def start(script: list[ScriptItem]) -> ScriptedServer:
        server = ScriptedServer(script).start()
        started.append((server, app.use_server(server.url)))
        return server

    yield start
    for server, previous in reversed(started):
        app.use_server(previous)
        server.stop()


def lines(log: Path) -> list[str]:
    """The side-effect log without its pids."""
    return [line.rsplit(" ", 1)[0] for line in log.read_text().splitlines()] if log.exists() else []


def pids_of(log: Path, entry: str) -> list[int]:
    """The pids that logged ``entry``, in order."""
    return [
        int(line.rsplit(" ", 1)[1])
        for line in log.read_text().splitlines()
        if line.rsplit(" ", 1)[0] == entry
    ]


def assert_one_body_per_process(log: Path) -> None:
    """Each process ran the workflow body at most once (a resumed process never runs it
    twice, let alone twice at once)."""
    starts = Counter(pids_of(log, "body start"))
    assert starts and max(starts.values()) == 1, f"a body ran twice in one process: {starts}"


# ------------------------------------------------------------------ in-process runs


CURRENT: dict[str, Any] = {}


@da.durable_workflow(name="pai_test_tracked")
async def tracked(task: str) -> str:
    """``solve``, keeping what a test looks at: the replay report and the run's messages."""
    track_replay(CURRENT.setdefault("reports", []).append)
    result = await app.calc.run(task)
    CURRENT["messages"] = result.all_messages()
    return result.output


def test_each_model_request_and_tool_call_is_a_step_and_replays_typed(
    runtime: da.Runtime, inspector: Inspector, serve: Serve, side_log: Path
) -> None:
    server = serve([*TWO_ADDS, Reply((text("the answer is still 10"),))])
    CURRENT.clear()
    wid = new_id("pai-async")
    with da.workflow_id(wid):
        assert asyncio.run(tracked("compute")) == "the answer is 10"
    steps = inspector.steps(wid)
    assert [s.name for s in steps] == [MODEL, ADD, MODEL, ADD, MODEL]
    reply = steps[0].output
    assert reply["model"] == app.MODEL_NAME and reply["usage"]["output_tokens"] > 0
    assert reply["response"]["parts"][0]["tool_name"] == "add"
    assert [s.output["result"] for s in steps if s.name == ADD] == [3, 7]
    assert len(server.requests) == 3
    assert CURRENT["reports"] == []  # a fresh run replays nothing
    # the agent layer counts these replies: totals, and `dbos-agent steps`' description
    totals = usage_totals(wid)
    assert (totals.model_calls, totals.tool_calls) == (3, 2)
    assert totals.input_tokens == sum(s.output["usage"]["input_tokens"] for s in steps[::2])
    assert totals.cost_usd is not None and totals.cost_usd > 0
    digest = describe_step(da.list_steps(wid)[0])
    assert digest is not None and digest.summary == '[tool_call] add({"a": 1, "b": 2})'
    assert digest.input_tokens == reply["usage"]["input_tokens"]

    # A fork from the last model request replays the first four steps, typed: the agent
    # gets ModelResponses back (and runs on from their tool calls), calls nothing again,
    # and makes only the last request live.
    CURRENT.clear()
    fork = da.fork(wid, from_step=4)
    assert fork.result(timeout=30) == "the answer is still 10"
    assert [s.name for s in inspector.steps(fork.workflow_id)] == [MODEL, ADD, MODEL, ADD, MODEL]
    assert len(server.requests) == 4
    assert lines(side_log).count("add 1 2 start") == 1  # not run again by the fork
    responses = [m for m in CURRENT["messages"] if isinstance(m, ModelResponse)]
    assert len(responses) == 3
    call = responses[0].parts[0]
    assert isinstance(call, ToolCallPart) and call.args_as_dict() == {"a": 1, "b": 2}
    assert responses[0].model_name == app.MODEL_NAME and responses[0].usage.output_tokens > 0
    (report,) = CURRENT["reports"]
    assert (report.steps_replayed, report.model_calls_replayed, report.tool_calls_replayed) == (
        4,
        2,
        2,
    )
    assert report.input_tokens_saved == sum(s.output["usage"]["input_tokens"] for s in steps[:3:2])


def test_run_sync_in_a_sync_workflow(
    runtime: da.Runtime, inspector: Inspector, serve: Serve, side_log: Path
) -> None:
    server = serve(TWO_ADDS)
    handle = da.start(app.solve_sync, "compute")
    assert handle.result(timeout=30) == "the answer is 10"
    assert [s.name for s in inspector.steps(handle.workflow_id)] == [MODEL, ADD, MODEL, ADD, MODEL]
    assert len(server.requests) == 3
    assert lines(side_log).count("add 3 4 end") == 1
