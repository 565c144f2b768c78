"""What the CLI shows, without a database: step digests from the registry, and tables
written to something that is not a terminal (a pipe, a file)."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from typing import Any

import pytest

from dbos_agent import _documents as documents
from dbos_agent import records
from dbos_agent.agent.describe import describe_model_step
from dbos_agent.cli import render
from dbos_agent.records import (
    Divergence,
    StepDigest,
    StepInfo,
    StepStatus,
    WorkflowInfo,
    WorkflowStatus,
    describe_step,
)

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _step(output: Any, name: str = "model") -> StepInfo:
    return StepInfo("wf", 0, name, StepStatus.SUCCESS, output, None, 1, NOW, NOW)


def _reply(**usage: int) -> dict[str, Any]:
    return {
        "type": "message",
        "model": "claude-sonnet-4-5",
        "stop_reason": "tool_use",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a.txt"}},
        ],
        "usage": usage,
    }


def test_the_first_describer_that_recognises_a_step_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "_describers", [])
    assert describe_step(_step(1)) is None

    def ints(step: StepInfo) -> StepDigest | None:
        return StepDigest(summary="an int") if isinstance(step.output, int) else None

    def everything(step: StepInfo) -> StepDigest | None:
        return StepDigest(summary="anything")

    assert records.register_step_describer(ints) is ints
    records.register_step_describer(everything)
    records.register_step_describer(ints)  # a second registration changes nothing
    assert describe_step(_step(1)) == StepDigest(summary="an int")
    assert describe_step(_step("x")) == StepDigest(summary="anything")


def test_the_agent_layer_describes_recorded_replies() -> None:
    """Importing the agent package registers it; any step recording a Message is one."""
    assert describe_step(_step(_reply(input_tokens=1000, output_tokens=50))) == StepDigest(
        summary='[tool_use] "Let me look." read_file({"path": "a.txt"})',
        input_tokens=1000,
        output_tokens=50,
        cache_creation_input_tokens=0,
        cache_read_input_tokens=0,
        cost_usd=(1000 * 3.0 + 50 * 15.0) / 1_000_000,
    )
    without_usage = {k: v for k, v in _reply().items() if k != "usage"}
    assert describe_model_step(_step(without_usage)) == StepDigest(
        summary='[tool_use] "Let me look." read_file({"path": "a.txt"})'
    )
    assert describe_model_step(_step({"type": "text", "usage": {}})) is None
    assert describe_model_step(_step([1, 2])) is None


def test_token_totals_come_from_the_digests() -> None:
    digests = [
        StepDigest(input_tokens=10, output_tokens=1, cost_usd=0.25),
        None,
        StepDigest(summary="not a model call"),
        StepDigest(input_tokens=5, output_tokens=2, cache_read_input_tokens=7, cost_usd=0.5),
    ]
    totals = documents.token_totals(digests)
    assert totals == {
        "model_calls": 2,
        "input_tokens": 15,
        "output_tokens": 3,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 7,
        "cost_usd": 0.75,
    }
    assert render.tokens_line(totals) == "15 in, 3 out over 2 model call(s), about $0.7500"
    unpriced = documents.token_totals([*digests, StepDigest(input_tokens=1, output_tokens=1)])
    assert unpriced is not None and unpriced["cost_usd"] is None
    assert documents.token_totals([None, StepDigest(summary="x")]) is None


def test_a_table_off_a_terminal_is_whole_plain_lines() -> None:
    """Cells split by whitespace, nothing cut or wrapped, no colour, no trailing blanks."""
    long_cell = "r" * 300
    out = io.StringIO()
    render.print_table(
        ["WORKFLOW ID", "STATUS", "RESULT"],
        [["wf-1", "SUCCESS", long_cell], ["a-much-longer-id", "ERROR", "[end_turn] x"]],
        status_column=1,
        file=out,
    )
    lines = out.getvalue().splitlines()
    assert [line.split() for line in lines] == [
        ["WORKFLOW", "ID", "STATUS", "RESULT"],
        ["wf-1", "SUCCESS", long_cell],
        ["a-much-longer-id", "ERROR", "[end_turn]", "x"],
    ]
    assert lines[0].index("STATUS") == lines[1].index("SUCCESS") == len("a-much-longer-id  ")
    assert "\x1b" not in out.getvalue() and all(line == line.rstrip() for line in lines)


def test_fields_off_a_terminal() -> None:
    out = io.StringIO()
    render.print_fields([("Workflow", "wf-1"), ("Status", render.status_text("SUCCESS"))], file=out)
    assert out.getvalue() == "Workflow  wf-1\nStatus    SUCCESS\n"


def _info(status: WorkflowStatus, diverged: Divergence | None) -> WorkflowInfo:
    return WorkflowInfo(
        "order 42", "ship", status, {}, None, None, "local", "v2", 0, 50, NOW, NOW, None,
        diverged=diverged,
    )  # fmt: skip


HELD = Divergence(0, "prepare", "audit", "v2", "3f2a9c0d1e2b4a5c", NOW)


def test_a_divergence_in_words() -> None:
    assert HELD.describe() == "step 0: log 'prepare', code 'audit'"
    assert HELD.why() == (
        "at step 0 the log recorded 'prepare' but the code (code version 3f2a9c0d1e2b4a5c, "
        "app version v2) called 'audit'"
    )
    unversioned = Divergence(3, "a", "b", None, "c0de")
    assert unversioned.why() == (
        "at step 3 the log recorded 'a' but the code (code version c0de) called 'b'"
    )
    document = documents.workflow_json(_info(WorkflowStatus.DIVERGED, HELD))
    assert document["diverged"] == {
        "position": 0, "recorded": "prepare", "called": "audit", "app_version": "v2",
        "code_version": "3f2a9c0d1e2b4a5c", "at": NOW, "summary": HELD.describe(),
        "why": HELD.why(),
    }  # fmt: skip
    assert documents.json_default(document["diverged"]["at"]) == "2026-12-03T12:00:00+00:00"
    assert documents.workflow_json(_info(WorkflowStatus.SUCCESS, None))["diverged"] is None


def test_workflows_show_says_why_a_workflow_is_held_and_what_now() -> None:
    fields = render.diverged_fields(_info(WorkflowStatus.DIVERGED, HELD))
    assert fields[0] == ("Diverged", HELD.why() + ", since 2026-12-03 12:00:00 UTC")
    assert fields[1][0] == "What now" and "da.patched" in fields[1][1]
    assert str(fields[2][1]).endswith("dbos-agent workflows fork 'order 42' --from-step 0")
    assert " step 0 (" in fields[2][1], "no 'or earlier' than step 0"
    assert fields[3] == ("", "or cancel it: dbos-agent workflows cancel 'order 42'")
    later = Divergence(4, "prepare", "audit", None, "c0de")
    assert (
        "from step 4 or earlier ("
        in render.diverged_fields(_info(WorkflowStatus.DIVERGED, later))[2][1]
    )
    assert render.diverged_fields(_info(WorkflowStatus.SUCCESS, HELD)) == [
        ("Diverged earlier", HELD.why() + " (held from 2026-12-03 12:00:00 UTC)")
    ]
    assert render.diverged_fields(_info(WorkflowStatus.SUCCESS, None)) == []
