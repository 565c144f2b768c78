"""The Messages API wire format: request checks and response rendering.

Validates request bodies the way the real API does and renders replies as messages, SSE
event sequences and error bodies, with deterministic ids and token estimates.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from .script import JSONDict, Reply, TextContent

__all__ = ["validate_request"]

# Default error `type` per HTTP status, as the real API names them.
_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_REASON_PHRASES: dict[int, str] = {529: "Overloaded"}


# --------------------------------------------------------------------------- request checks


def _content_blocks(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content")
    if isinstance(content, list):
        return [b for b in content if isinstance(b, Mapping)]
    return []


def validate_request(body: Any) -> str | None:
    """Return the real API's style of error message for an invalid request, or None.

    Beyond required fields, it checks tool_use/tool_result pairing like the real API does,
    because a durable agent that replays or resumes badly breaks exactly there.
    """
    if not isinstance(body, Mapping):
        return "Request body must be a JSON object"
    for name in ("model", "max_tokens", "messages"):
        if name not in body:
            return f"{name}: Field required"
    if not isinstance(body["model"], str) or not body["model"]:
        return "model: Input should be a valid string"
    max_tokens = body["max_tokens"]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens: Input should be a positive integer"
    messages = body["messages"]
    if not isinstance(messages, list):
        return "messages: Input should be a valid list"
    if not messages:
        return "messages: at least one message is required"
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            return f"messages.{i}: Input should be an object"
        if message.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        if "content" not in message:
            return f"messages.{i}.content: Field required"
    for i, message in enumerate(messages):
        prev_ids: set[str] = set()
        if i > 0 and messages[i - 1].get("role") == "assistant":
            prev_ids = {
                str(b.get("id"))
                for b in _content_blocks(messages[i - 1])
                if b.get("type") == "tool_use"
            }
        results = [b for b in _content_blocks(message) if b.get("type") == "tool_result"]
        if results and message.get("role") != "user":
            return f"messages.{i}: tool_result blocks are only allowed in user messages"
        for j, block in enumerate(results):
            if str(block.get("tool_use_id")) not in prev_ids:
                return (
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` "
                    f"blocks: {block.get('tool_use_id')}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message."
                )
        if message.get("role") == "assistant" and i + 1 < len(messages):
            ids = [
                str(b.get("id")) for b in _content_blocks(message) if b.get("type") == "tool_use"
            ]
            answered = {
                str(b.get("tool_use_id"))
                for b in _content_blocks(messages[i + 1])
                if b.get("type") == "tool_result"
            }
            missing = [tid for tid in ids if tid not in answered]
            if missing:
                return (
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                    "corresponding `tool_result` block in the next message."
                )
    return None


# --------------------------------------------------------------------------- rendering


def _digest(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _input_tokens(body: Mapping[str, Any]) -> int:
    # Only the prompt parts, so the streamed and non-streamed forms of a request agree.
    prompt = {k: body.get(k) for k in ("system", "messages", "tools")}
    return max(1, len(json.dumps(prompt, separators=(",", ":"))) // 4)


def _render_message(reply: Reply, body: Mapping[str, Any], seq: int) -> JSONDict:
    """The full Messages API response object for ``reply`` to request ``body``."""
    conversation = _digest(body.get("messages"))
    content: list[JSONDict] = []
    for index, block in enumerate(reply.content):
        if isinstance(block, TextContent):
            content.append({"type": "text", "text": block.text})
        else:
            tool_id = block.id or "toolu_" + _digest([conversation, index, block.name])[:24]
            content.append(
                {"type": "tool_use", "id": tool_id, "name": block.name, "input": dict(block.input)}
            )
    stop_reason = reply.stop_reason or (
        "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    )
    if reply.usage is not None:
        input_tokens, output_tokens = reply.usage
    else:
        input_tokens = _input_tokens(body)
        output_tokens = max(1, len(json.dumps(content, separators=(",", ":"))) // 4)
    return {
        "id": "msg_" + _digest([seq, conversation])[:24],
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def _text_chunks(value: str) -> list[str]:
    """Split after whitespace, a few words per delta, like a model streaming tokens."""
    words = re.split(r"(?<=\s)(?=\S)", value)
    return ["".join(words[i : i + 3]) for i in range(0, len(words), 3) if words[i : i + 3]]


def _sse_events(message: Mapping[str, Any]) -> list[tuple[str, JSONDict]]:
    """The SSE event sequence the real API sends for ``message``."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {"input_tokens": usage["input_tokens"], "output_tokens": 1}
    events: list[tuple[str, JSONDict]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            events.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
            )
            for chunk in _text_chunks(block["text"]):
                delta = {"type": "text_delta", "text": chunk}
                events.append(
                    (
                        "content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": delta},
                    )
                )
        else:
            events.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {**block, "input": {}},
                    },
                )
            )
            raw = json.dumps(block["input"])
            for chunk in ["", *(raw[i : i + 24] for i in range(0, len(raw), 24))]:
                delta = {"type": "input_json_delta", "partial_json": chunk}
                events.append(
                    (
                        "content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": delta},
                    )
                )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": dict(usage),
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _error_body(error_type: str, message: str, request_id: str) -> JSONDict:
    return {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": request_id,
    }
