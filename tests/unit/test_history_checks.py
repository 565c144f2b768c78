"""The rules of an imported history, one by one, without Postgres (``pytest tests/unit``):
the boundaries the import's subprocess tests (tests/process/test_import_checks.py) do
not walk."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from dbos_agent._limits import MAX_JSON_DEPTH
from dbos_agent._storage.histories import read_histories
from dbos_agent._storage.history_checks import load_history
from dbos_agent.errors import InvalidHistoryError
from tests.process.test_import_checks import history


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _loads(doc: dict[str, Any]) -> str:
    return json.dumps(doc)


def test_a_document_as_exported_passes_and_reads_back() -> None:
    [(where, _, found)] = list(read_histories([_loads(history("a")).encode()], "f.jsonl"))
    assert where == "f.jsonl, line 1"
    assert (found.workflow_id, sorted(found.steps), found.steps[1].inputs) == (
        "a",
        [0, 1],
        '{"topic":"go","deadline":null}',
    )


def test_the_depth_limit_sits_above_what_the_engine_writes() -> None:
    """pydantic serializes at most 255 levels; the limit is 512, and 513 is refused."""
    text = _loads(history("a"))
    deepest = text.replace('"inputs": {"task": "t"}', f'"inputs": {{"x": {_nested(511)}}}')
    assert load_history(deepest, "f")["workflow"]["inputs"]["x"] == json.loads(_nested(511))
    deeper = text.replace('"inputs": {"task": "t"}', f'"inputs": {{"x": {_nested(512)}}}')
    with pytest.raises(InvalidHistoryError, match=f"deeper than {MAX_JSON_DEPTH} levels"):
        load_history(deeper, "f")


def _change(change: Callable[[dict[str, Any]], None]) -> str:
    doc = copy.deepcopy(history("a"))
    change(doc)
    return _loads(doc)


CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("a stream value on a close item", lambda d: d["streams"][0].update(kind="close"),
     "streams[0].value: must be null for a 'close' item"),
    ("a decided approval without a time", lambda d: d["approvals"][0].update(status="APPROVED"),
     "approvals[0].decided_at: missing for an APPROVED approval"),
    ("half a fork origin", lambda d: d["workflow"].update(forked_from="b"),
     "workflow.forked_from_step: forked_from and forked_from_step go together"),
    ("a time without its offset", lambda d: d["steps"][0].update(started_at="2026-12-05T10:11"),
     "steps[0].started_at: must be a time with its UTC offset"),
    ("an unknown field", lambda d: d["events"][0].update(owner=1),
     "events[0].owner: unknown field"),
    ("a retry state without numbers", lambda d: d["steps"][0].update(
        status="RETRYING", output=None, finished_at=None, error={}, retry={"since": "x"}),
     "steps[0].retry.since: must be a number, got str"),
    ("a SUCCESS workflow without its finish", lambda d: d["workflow"].update(
        status="SUCCESS", wait_kind=None), "workflow.finished_at: missing for a SUCCESS workflow"),
    ("a DIVERGED workflow without where", lambda d: d["workflow"].update(
        status="DIVERGED", wait_kind=None), "workflow.diverged: missing for a DIVERGED workflow"),
    ("a step's attempts at 0", lambda d: d["steps"][0].update(attempts=0),
     "steps[0].attempts: must be between 1 and"),
    ("a lone surrogate", lambda d: d["events"][0].update(value="\ud800"),
     "events[0].value: holds an unpaired surrogate (\\ud800)"),
    ("a stream offset twice", lambda d: d["streams"].append(dict(d["streams"][0])),
     "streams[1]: offset ('log', 0) again (as streams[0])"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_rule_names_its_field(change: Callable[[dict[str, Any]], None], message: str) -> None:
    with pytest.raises(InvalidHistoryError) as refused:
        load_history(_change(change), "f.jsonl, line 1")
    assert str(refused.value).startswith(f"f.jsonl, line 1, {message}"), str(refused.value)
