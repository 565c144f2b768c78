"""Workflows and steps as JSON documents: what ``--json`` prints and the HTTP API serves.

One shape for both, so that a script written against the CLI reads the API too.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from .records import ScheduleInfo, StepDigest, StepInfo, WorkflowInfo

__all__ = [
    "BUDGET_EVENT",
    "budget_json",
    "json_default",
    "schedule_json",
    "step_json",
    "token_totals",
    "tokens_of",
    "wall_seconds",
    "workflow_json",
]


def wall_seconds(info: WorkflowInfo) -> float | None:
    """Creation to finish, for a finished workflow."""
    end = info.finished_at if info.status.finished else None
    return None if end is None else (end - info.created_at).total_seconds()


def tokens_of(digest: StepDigest | None) -> tuple[int, int] | None:
    """(input, output) tokens of a step that is a model call, else None."""
    if digest is None or (digest.input_tokens is None and digest.output_tokens is None):
        return None
    return digest.input_tokens or 0, digest.output_tokens or 0


def token_totals(digests: Sequence[StepDigest | None]) -> dict[str, Any] | None:
    """Tokens and cost over a workflow's model calls (None without any): the ``usage`` of
    ``workflows show --json``. The cost is the exactly rounded sum of the calls' costs,
    None when one of them has no known price."""
    calls = [d for d in digests if d is not None and tokens_of(d) is not None]
    if not calls:
        return None
    costs = [d.cost_usd for d in calls]
    return {
        "model_calls": len(calls),
        "input_tokens": sum(d.input_tokens or 0 for d in calls),
        "output_tokens": sum(d.output_tokens or 0 for d in calls),
        "cache_creation_input_tokens": sum(d.cache_creation_input_tokens or 0 for d in calls),
        "cache_read_input_tokens": sum(d.cache_read_input_tokens or 0 for d in calls),
        "cost_usd": None if None in costs else math.fsum(c for c in costs if c is not None),
    }


def workflow_json(info: WorkflowInfo) -> dict[str, Any]:
    """A workflow as in ``--json`` documents. ``diverged`` (None unless its log and its
    code ever parted) also says it in words: ``summary`` (one short line) and ``why``
    (the sentence ``workflows show`` and the dashboard print); so does ``retrying`` (None
    unless a step waits out a failing dependency): ``summary``. ``waiting`` is what it
    waits for, ``{"kind", "text", "step", "until"}`` (see ``records.Waiting``), or None
    while it runs and once it finished; ``waiting_for`` stays a SUSPENDED workflow's
    wake-up condition as stored."""
    data = dataclasses.asdict(info)
    data["duration_seconds"] = wall_seconds(info)
    if info.diverged is not None:
        data["diverged"]["summary"] = info.diverged.describe()
        data["diverged"]["why"] = info.diverged.why()
    if info.retrying is not None:
        data["retrying"]["summary"] = info.retrying.describe()
    return data


def step_json(step: StepInfo, digest: StepDigest | None) -> dict[str, Any]:
    """A step as in ``--json`` documents; ``tokens`` for a model call, else None;
    ``internal`` for a step the library records for itself (``dbos_agent.*``)."""
    data = dataclasses.asdict(step)
    data["duration_ms"] = step.duration_ms
    data["internal"] = step.internal
    data["waiting"] = step.wait_text() if step.waiting else None
    tokens = tokens_of(digest)
    data["tokens"] = None if tokens is None else {"input": tokens[0], "output": tokens[1]}
    data["cost_usd"] = None if digest is None or tokens is None else digest.cost_usd
    return data


#: The event where a workflow publishes its model budget (agent/budget.py).
BUDGET_EVENT = "dbos_agent.budget"


def budget_json(event: str | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """A workflow's budget (its ``dbos_agent.budget`` event, JSON text) beside what it
    spent (:func:`token_totals`), or None without a budget."""
    if event is None:
        return None
    limits = json.loads(event)
    if not isinstance(limits, dict):
        return None
    spent = usage or {}
    tokens = sum(
        int(spent.get(key) or 0)
        for key in (
            "input_tokens",
            "output_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        )
    )
    return {
        "max_tokens": limits.get("max_tokens"),
        "max_cost_usd": limits.get("max_cost_usd"),
        "spent_tokens": tokens,
        "spent_cost_usd": spent.get("cost_usd"),
    }


def schedule_json(info: ScheduleInfo) -> dict[str, Any]:
    """A schedule: its fields as they are, times as ISO 8601 (UTC), the catch-up window in
    seconds."""
    document = dataclasses.asdict(info)
    document["catch_up_window"] = info.catch_up_window.total_seconds()
    return document


def json_default(value: Any) -> Any:
    """``json.dumps``'s ``default`` for the documents: times as ISO 8601."""
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot encode {type(value).__name__}")


def edited_steps(edits: list[dict[str, Any]]) -> set[int]:
    """The positions whose recorded output an edit replaced (an edited fork's steps)."""
    return {e["seq"] for e in edits if e.get("kind") == "output" and isinstance(e.get("seq"), int)}
