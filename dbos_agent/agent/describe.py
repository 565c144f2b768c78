"""How a recorded model step reads to an operator: one line, tokens and cost.

A model step records the whole Anthropic ``Message`` as JSON. Only this layer knows that
shape, so it registers a describer (:func:`dbos_agent.records.register_step_describer`)
when :mod:`dbos_agent.agent` is imported; the ``dbos-agent`` tools then show any
workflow's replies and bill from the database without knowing what a Message is.

The Pydantic AI integration records its model steps as ``{"model", "usage", "response"}``
(usage in the Messages API's keys, the response in Pydantic AI's own JSON); that shape is
described here too, by its keys, so the operator tools need not import Pydantic AI.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from ..records import StepDigest, StepInfo, register_step_describer
from .accounting import usage_of_reply

__all__ = ["describe_model_step", "describe_pydantic_ai_step"]


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
    return _digest(summary, reply)


def _digest(summary: str | None, reply: Mapping[str, Any]) -> StepDigest:
    usage = usage_of_reply(reply)
    return StepDigest(
        summary=summary,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_creation_input_tokens=usage.cache_creation_input_tokens,
        cache_read_input_tokens=usage.cache_read_input_tokens,
        cost_usd=usage.cost(),
    )


def _pydantic_ai_summary(response: Mapping[str, Any]) -> str:
    """``[finish_reason] "text" tool(args) ...`` of a Pydantic AI ``ModelResponse`` as JSON."""
    parts = []
    for part in response.get("parts") or []:
        if not isinstance(part, Mapping):
            continue
        if part.get("part_kind") == "text":
            parts.append(_json(part.get("content", "")))
        elif part.get("part_kind") == "tool-call":
            args = part.get("args")
            if isinstance(args, str):  # the model's raw JSON text
                with contextlib.suppress(ValueError):
                    args = json.loads(args)
            parts.append(f"{part.get('tool_name')}({_json(args)})")
    return f"[{response.get('finish_reason')}] " + " ".join(parts)


def describe_pydantic_ai_step(step: StepInfo) -> StepDigest | None:
    """A digest of a Pydantic AI model step (``{"model", "usage", "response"}``), else None."""
    reply = step.output
    if not (
        isinstance(reply, Mapping)
        and isinstance(reply.get("response"), Mapping)
        and isinstance(reply.get("usage"), Mapping)
        and "model" in reply
    ):
        return None
    return _digest(_pydantic_ai_summary(reply["response"]), reply)


register_step_describer(describe_model_step)
register_step_describer(describe_pydantic_ai_step)
