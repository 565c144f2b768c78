"""The Pydantic AI integration's supported versions, and the pieces of it that need no
database: which steps are its tool calls, its usage in the Messages API's keys, and how
its model steps read in the operator tools."""

from __future__ import annotations

import dataclasses
import importlib
from datetime import UTC, datetime

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

import dbos_agent.integrations.pydantic_ai as integration
from dbos_agent.agent.accounting import is_tool_step, totals_from_steps
from dbos_agent.agent.describe import describe_pydantic_ai_step
from dbos_agent.errors import ConfigurationError
from dbos_agent.integrations.pydantic_ai import versions
from dbos_agent.integrations.pydantic_ai.backend import anthropic_usage
from dbos_agent.records import StepInfo, StepStatus


@pytest.mark.parametrize("installed", ["2.78.0", "2.78.11", "2.78.0b1", "2.78"])
def test_supported_versions_pass(installed: str) -> None:
    versions.check_version(installed)


@pytest.mark.parametrize("installed", ["2.77.9", "2.79.0", "3.0.0", "1.78.0", "nonsense", ""])
def test_other_versions_are_refused_naming_both(installed: str) -> None:
    with pytest.raises(versions.UnsupportedPydanticAIVersionError) as refused:
        versions.check_version(installed)
    assert isinstance(refused.value, ConfigurationError)
    assert repr(installed) in str(refused.value)
    assert "pydantic-ai-slim>=2.78,<2.79" in str(refused.value)


def test_importing_the_integration_under_an_unsupported_release_fails_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(versions, "installed_version", lambda: "2.80.1")
    try:
        with pytest.raises(versions.UnsupportedPydanticAIVersionError, match=r"'2\.80\.1'"):
            importlib.reload(integration)
    finally:
        monkeypatch.undo()
        importlib.reload(integration)


def test_the_installed_release_is_supported() -> None:
    versions.check_version(versions.installed_version())


@pytest.mark.parametrize(
    ("name", "tool"),
    [
        ("calc__function_toolset__math.call_tool:add", True),
        ("calc__dynamic_toolset__user.call_tool:lookup", True),
        ("calc__mcp_server__calc.call_tool", True),
        ("calc__mcp_server__calc.get_tools", False),
        ("calc__function_toolset__math.validate_args:add", False),
        ("calc__model.request", False),
        ("tool:add", True),
        ("call_tool", False),
    ],
)
def test_which_steps_are_tool_calls(name: str, tool: bool) -> None:
    assert integration.is_pydantic_ai_tool_step(name) is tool or name == "tool:add"
    assert is_tool_step(name) is tool


def test_usage_in_the_messages_api_keys_counts_cache_tokens_apart() -> None:
    pydantic_ai_usage = {
        "input_tokens": 1000,
        "cache_write_tokens": 300,
        "cache_read_tokens": 200,
        "output_tokens": 50,
    }
    assert anthropic_usage(pydantic_ai_usage) == {
        "input_tokens": 500,
        "output_tokens": 50,
        "cache_creation_input_tokens": 300,
        "cache_read_input_tokens": 200,
    }
    assert anthropic_usage(None)["input_tokens"] == 0


RECORDED = {
    "model": "claude-sonnet-4-6",
    "usage": anthropic_usage({"input_tokens": 1200, "output_tokens": 30}),
    "response": {
        "kind": "response",
        "finish_reason": "tool_call",
        "parts": [
            {"part_kind": "text", "content": "Let me add."},
            {"part_kind": "tool-call", "tool_name": "add", "args": '{"a": 1}'},
        ],
    },
}


def test_a_model_step_reads_as_its_reply_and_bill() -> None:
    step = StepInfo(
        workflow_id="wf",
        seq=0,
        name="calc__model.request",
        status=StepStatus.SUCCESS,
        output=RECORDED,
        error=None,
        attempts=1,
        started_at=datetime.now(UTC),
        finished_at=datetime.now(UTC),
    )
    digest = describe_pydantic_ai_step(step)
    assert digest is not None
    assert digest.summary == '[tool_call] "Let me add." add({"a": 1})'
    assert (digest.input_tokens, digest.output_tokens) == (1200, 30)
    assert digest.cost_usd == pytest.approx((1200 * 3.0 + 30 * 15.0) / 1e6)
    other = dataclasses.replace(step, output={"type": "message"})
    assert describe_pydantic_ai_step(other) is None


def test_the_totals_count_its_model_and_tool_steps() -> None:
    # binding the capability to an agent named calc makes its model steps model calls
    Agent(TestModel(), name="calc", capabilities=[integration.Durability()])
    rows = [
        ("calc__model.request", "SUCCESS", RECORDED, 1),
        ("calc__function_toolset__math.call_tool:add", "SUCCESS", {"result": 1}, 1),
        ("calc__model.request", "SUCCESS", RECORDED, 1),
    ]
    totals = totals_from_steps("wf", rows)
    assert (totals.model_calls, totals.tool_calls, totals.input_tokens) == (2, 1, 2400)


@pytest.mark.parametrize(
    ("output", "calls"),
    [
        ({"kind": "approval_required", "metadata": {"limit": 100}}, 1),  # asked, then ran
        ({"kind": "call_deferred"}, 1),  # left to run elsewhere
        ({"kind": "model_retry", "message": "again"}, 2),  # it ran, and asked for a retry
    ],
)
def test_a_tool_step_that_recorded_a_deferral_is_not_a_call(output: object, calls: int) -> None:
    Agent(TestModel(), name="calc", capabilities=[integration.Durability()])
    transfer = "calc__function_toolset__bank.call_tool:transfer"
    rows = [
        ("calc__model.request", "SUCCESS", RECORDED, 1),
        (transfer, "SUCCESS", output, 1),
        (transfer, "SUCCESS", {"kind": "tool_return", "result": "moved"}, 1),
    ]
    assert totals_from_steps("wf", rows).tool_calls == calls
