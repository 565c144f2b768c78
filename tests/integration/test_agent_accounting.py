"""Token and cost accounting from the step log, and the report of what a resume saved."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from anthropic.types import MessageParam, ToolUseBlock

import dbos_agent as da
from dbos_agent.agent import (
    Model,
    Price,
    ReplayReport,
    ToolRegistry,
    replay_report,
    tool,
    track_replay,
    usage_totals,
)
from dbos_agent.agent.replay import last_replay_report, replaying
from dbos_agent.agent.scripted_server import Fail, Reply, ScriptedServer, text, tool_use
from tests.helpers import SimulatedCrash, new_id, per_test

CURRENT: dict[str, Any] = per_test({})
REPORTS: list[ReplayReport] = per_test([])
EVENTS: list[str] = per_test([])


@tool
def shout(word: str) -> str:
    """Upper-case a word."""
    EVENTS.append(f"live shout {word}")
    return word.upper()


TOOLS = ToolRegistry([shout])


@da.durable_workflow(name="agent_test_accounted")
def accounted(turns: int, crash_after: int) -> str:
    track_replay(on_done=REPORTS.append)
    model: Model = CURRENT["model"]
    messages: list[MessageParam] = [{"role": "user", "content": "go"}]
    answer = ""
    for turn in range(turns):
        EVENTS.append(f"turn {turn} replaying={replaying()}")
        reply = model.create(messages)
        answer = "".join(b.text for b in reply.content if b.type == "text")
        messages.append(reply.to_param())
        if reply.stop_reason == "tool_use":
            messages.append({"role": "user", "content": TOOLS.call_all(reply.content)})
        if turn == crash_after and CURRENT.pop("crash", False):
            raise SimulatedCrash(f"after turn {turn}")
        if reply.stop_reason != "tool_use":
            break
    report = replay_report()
    EVENTS.append(f"end report={report is not None}")
    return answer


def script() -> list[Any]:
    return [
        Reply([text("one"), tool_use("shout", {"word": "a"})], usage=(100, 10)),
        Fail(529),
        Reply([text("two"), tool_use("shout", {"word": "b"})], usage=(200, 20)),
        Reply([text("three"), tool_use("shout", {"word": "c"})], usage=(300, 30)),
        Reply([text("done")], usage=(400, 40)),
    ]


def model_for(server: ScriptedServer) -> Model:
    client = anthropic.Anthropic(base_url=server.url, api_key="scripted")
    return Model(client, model="claude-test-1", interval=0.01, max_interval=0.02)


def test_totals_are_summed_from_the_step_log(runtime: da.Runtime) -> None:
    with ScriptedServer(script()) as server:
        CURRENT["model"] = model_for(server)
        wid = new_id()
        with da.workflow_id(wid):
            assert accounted(10, -1) == "done"
    totals = usage_totals(wid)
    assert (totals.model_calls, totals.model_attempts, totals.failed_model_calls) == (4, 5, 0)
    assert totals.tool_calls == 3
    assert (totals.input_tokens, totals.output_tokens) == (1000, 100)
    assert totals.cost_usd is None  # no price for "claude-test-1" in the default table
    priced = usage_totals(wid, prices={"claude-test": Price(input=3.0, output=15.0)})
    assert priced.cost_usd == pytest.approx((1000 * 3.0 + 100 * 15.0) / 1e6)
    assert server.usage_total == (1000, 100)  # the server billed exactly what the log says
    assert REPORTS == [] and "end report=False" in EVENTS  # a fresh run replays nothing


def test_resume_reports_what_replay_saved(runtime: da.Runtime) -> None:
    with ScriptedServer(script()) as server:
        CURRENT["model"] = model_for(server)
        wid = new_id()
        CURRENT["crash"] = True
        with pytest.raises(SimulatedCrash), da.workflow_id(wid):
            accounted(10, 1)
        paid_before = server.paid_calls
        EVENTS.clear()
        with da.workflow_id(wid):
            assert accounted(10, 1) == "done"
        assert server.paid_calls - paid_before == 2  # only turns 2 and 3 were paid now

    (report,) = REPORTS
    assert report == last_replay_report(wid)
    assert report.steps_replayed == 4
    assert report.steps == (
        (0, "anthropic.messages"),
        (1, "tool:shout"),
        (2, "anthropic.messages"),
        (3, "tool:shout"),
    )
    assert (report.model_calls_replayed, report.tool_calls_replayed) == (2, 2)
    assert (report.input_tokens_saved, report.output_tokens_saved) == (300, 30)
    assert report.cost_saved({"claude-test": Price(1.0, 1.0)}) == pytest.approx(330 / 1e6)
    assert report.elapsed_s > 0
    assert "replayed 4 steps" in report.summary()
    # replay lasts until the first live step (turn 2's model call) starts
    assert EVENTS[:4] == [
        "turn 0 replaying=True",
        "turn 1 replaying=True",
        "turn 2 replaying=True",
        "live shout c",
    ]
    assert "turn 3 replaying=False" in EVENTS
    assert [e for e in EVENTS if e.startswith("live")] == ["live shout c"]
    totals = usage_totals(wid)
    assert (totals.model_calls, totals.input_tokens) == (4, 1000)  # counted once


def test_resume_with_nothing_left_to_run_still_reports(runtime: da.Runtime) -> None:
    with ScriptedServer(script()) as server:
        CURRENT["model"] = model_for(server)
        wid = new_id()
        CURRENT["crash"] = True
        with pytest.raises(SimulatedCrash), da.workflow_id(wid):
            accounted(10, 3)  # crashes after the final reply was recorded
        with da.workflow_id(wid):
            assert accounted(10, 3) == "done"
        assert server.paid_calls == 4
    (report,) = REPORTS
    assert report.steps_replayed == 7 and report.model_calls_replayed == 4


def test_tool_block_helpers_accept_sdk_blocks() -> None:
    block = ToolUseBlock(type="tool_use", id="toolu_1", name="shout", input={"word": "x"})
    assert TOOLS.call(block) == {"type": "tool_result", "tool_use_id": "toolu_1", "content": "X"}
