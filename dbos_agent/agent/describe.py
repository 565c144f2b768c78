"""How a recorded model step reads to an operator: one line, tokens and cost.

A model step records the whole Anthropic ``Message`` as JSON. Only this layer knows that
shape, so it registers a describer (:func:`dbos_agent.records.register_step_describer`)
when :mod:`dbos_agent.agent` is imported; the ``dbos-agent`` tools then show any
workflow's replies and bill from the database without knowing what a Message is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..records import StepDigest, StepInfo, register_step_describer
from .accounting import usage_of_reply

__all__ = ["describe_model_step"]


def _json(value: Any) -> str:
    """JSON on one line, as the operator tools print every other value."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _summary(reply: Mapping[str, Any]) -> str | None:
    """``[stop_reason] "text" tool(input) ...``: what the model said and asked for."""
    content = reply.get("content")
    if not isinstance(content, list):
        return None
    parts = []
    for block in content:
        if not isinstance(block, Mapping):
            continue
        if block.get("type") == "text":
            parts.append(_json(block.get("text", "")))
        elif block.get("type") == "tool_use":
            parts.append(f"{block.get('name')}({_json(block.get('input'))})")
    return f"[{reply.get('stop_reason')}] " + " ".join(parts)


def describe_model_step(step: StepInfo) -> StepDigest | None:
    """A digest of a step whose output is a recorded ``Message``, else None.

    Recognised by its shape, not its step name, so replies recorded by any step (and by
    processes that never constructed a :class:`~dbos_agent.agent.Model`) are described.
    """
    reply = step.output
    if not (isinstance(reply, Mapping) and reply.get("type") == "message"):
        return None
    summary = _summary(reply)
    if not isinstance(reply.get("usage"), Mapping):
        return None if summary is None else StepDigest(summary=summary)
    usage = usage_of_reply(reply)
    return StepDigest(
        summary=summary,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_creation_input_tokens=usage.cache_creation_input_tokens,
        cache_read_input_tokens=usage.cache_read_input_tokens,
        cost_usd=usage.cost(),
    )


register_step_describer(describe_model_step)
