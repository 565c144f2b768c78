"""Script items (what the scripted server answers with) and their JSON script form."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias, cast

__all__ = [
    "ContentBlock",
    "Delay",
    "Fail",
    "JSONDict",
    "Reply",
    "ScriptFn",
    "ScriptItem",
    "StopReason",
    "TextContent",
    "ToolUseContent",
    "dump_script",
    "item_from_json",
    "item_to_json",
    "load_script",
    "text",
    "tool_use",
]

JSONDict: TypeAlias = dict[str, Any]
StopReason: TypeAlias = Literal[
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
]
_STOP_REASONS: frozenset[str] = frozenset(
    (
        "end_turn",
        "max_tokens",
        "stop_sequence",
        "tool_use",
        "pause_turn",
        "refusal",
        "model_context_window_exceeded",
    )
)


# --------------------------------------------------------------------------- script items


@dataclass(frozen=True)
class TextContent:
    """A text content block of a scripted reply."""

    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True)
class ToolUseContent:
    """A tool_use block; ``id=None`` gets a ``toolu_<hex>`` derived from the conversation.

    Deriving the id from the request (not a counter) keeps it stable when a resumed client
    re-sends the same conversation, so replayed and fresh runs agree.
    """

    name: str
    input: Mapping[str, Any]
    id: str | None = None
    type: Literal["tool_use"] = "tool_use"


ContentBlock: TypeAlias = TextContent | ToolUseContent


def text(value: str) -> TextContent:
    """Text block helper, so scripts read like the conversation they fake."""
    return TextContent(value)


def tool_use(name: str, input: Mapping[str, Any], id: str | None = None) -> ToolUseContent:
    """tool_use block helper; leave ``id`` unset to get a deterministic generated one."""
    return ToolUseContent(name=name, input=dict(input), id=id)


@dataclass(frozen=True)
class Reply:
    """A successful (200) model reply.

    ``stop_reason=None`` means "tool_use" when a tool_use block is present, else "end_turn".
    ``usage=None`` computes plausible counts from the request and reply size (about 4 bytes of
    JSON per token), so tests can still add usage up. ``chunk_delay`` sleeps between SSE events
    when streamed, to leave time to kill a client mid-stream.
    """

    content: Sequence[ContentBlock] = ()
    stop_reason: StopReason | None = None
    usage: tuple[int, int] | None = None
    chunk_delay: float = 0.0

    def __post_init__(self) -> None:
        # A tuple whatever was passed, so equal scripts compare equal (lists vs loaded JSON).
        object.__setattr__(self, "content", tuple(self.content))


@dataclass(frozen=True)
class Fail:
    """An API error reply with the real error body and optional retry headers.

    ``error_type=None`` picks the API's name for ``status`` (529 -> overloaded_error, ...).
    ``retry_after`` sets the ``retry-after`` header (seconds), which the client obeys;
    ``should_retry`` sets ``x-should-retry``, which overrides the client's status-based choice.
    """

    status: int = 529
    error_type: str | None = None
    message: str | None = None
    retry_after: float | None = None
    should_retry: bool | None = None


@dataclass(frozen=True)
class Delay:
    """Wait ``seconds`` before answering with ``then``: slow models and client timeouts.

    The wait ends early when the server stops, so a test never hangs on teardown.
    """

    seconds: float
    then: ScriptItem = field(default_factory=lambda: Reply((TextContent("(delayed reply)"),)))


ScriptItem: TypeAlias = Reply | Fail | Delay
ScriptFn: TypeAlias = Callable[[JSONDict], ScriptItem]


# --------------------------------------------------------------------------- JSON script form


def _usage_from_json(raw: Any) -> tuple[int, int] | None:
    if raw is None:
        return None
    if isinstance(raw, Mapping):
        return int(raw["input_tokens"]), int(raw["output_tokens"])
    if isinstance(raw, list | tuple) and len(raw) == 2:
        return int(raw[0]), int(raw[1])
    raise ValueError(f"usage must be [input, output] or an object, got {raw!r}")


def _block_from_json(raw: Any) -> ContentBlock:
    if isinstance(raw, str):
        return TextContent(raw)
    if not isinstance(raw, Mapping):
        raise ValueError(f"content block must be a string or object, got {raw!r}")
    kind = raw.get("type", "text")
    if kind == "text":
        _check_keys(raw, {"type", "text"}, "text block")
        return TextContent(str(raw["text"]))
    if kind == "tool_use":
        _check_keys(raw, {"type", "name", "input", "id"}, "tool_use block")
        tool_input = raw.get("input", {})
        if not isinstance(tool_input, Mapping):
            raise ValueError(f"tool_use input must be an object, got {tool_input!r}")
        return ToolUseContent(str(raw["name"]), dict(tool_input), raw.get("id"))
    raise ValueError(f"unknown content block type {kind!r} (expected 'text' or 'tool_use')")


def _check_keys(raw: Mapping[str, Any], allowed: set[str], what: str) -> None:
    unknown = set(raw) - allowed
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)} in {what}; allowed: {sorted(allowed)}")


def item_from_json(raw: Any) -> ScriptItem:
    """Parse one item of the JSON script form (see :func:`load_script`)."""
    if not isinstance(raw, Mapping) or len(raw) != 1:
        raise ValueError(f'script item must be {{"reply"|"fail"|"delay": ...}}, got {raw!r}')
    ((kind, spec),) = raw.items()
    if kind == "reply":
        if not isinstance(spec, Mapping):
            raise ValueError(f"reply must be an object, got {spec!r}")
        _check_keys(spec, {"content", "text", "stop_reason", "usage", "chunk_delay"}, "reply")
        blocks = [_block_from_json(b) for b in spec.get("content", [])]
        if "text" in spec:
            blocks.insert(0, TextContent(str(spec["text"])))
        stop_reason = spec.get("stop_reason")
        if stop_reason is not None and stop_reason not in _STOP_REASONS:
            raise ValueError(f"unknown stop_reason {stop_reason!r}")
        return Reply(
            content=tuple(blocks),
            stop_reason=cast(StopReason | None, stop_reason),
            usage=_usage_from_json(spec.get("usage")),
            chunk_delay=float(spec.get("chunk_delay", 0.0)),
        )
    if kind == "fail":
        if isinstance(spec, int):
            return Fail(status=spec)
        if not isinstance(spec, Mapping):
            raise ValueError(f"fail must be a status or an object, got {spec!r}")
        _check_keys(
            spec, {"status", "error_type", "message", "retry_after", "should_retry"}, "fail"
        )
        retry_after = spec.get("retry_after")
        should_retry = spec.get("should_retry")
        return Fail(
            status=int(spec.get("status", 529)),
            error_type=spec.get("error_type"),
            message=spec.get("message"),
            retry_after=None if retry_after is None else float(retry_after),
            should_retry=None if should_retry is None else bool(should_retry),
        )
    if kind == "delay":
        if isinstance(spec, int | float):
            return Delay(float(spec))
        if not isinstance(spec, Mapping):
            raise ValueError(f"delay must be seconds or an object, got {spec!r}")
        _check_keys(spec, {"seconds", "then"}, "delay")
        if "then" in spec:
            return Delay(float(spec["seconds"]), item_from_json(spec["then"]))
        return Delay(float(spec["seconds"]))
    raise ValueError(f"unknown script item kind {kind!r} (expected reply, fail or delay)")


def item_to_json(item: ScriptItem) -> JSONDict:
    """The JSON form of ``item``; ``item_from_json(item_to_json(x)) == x``."""
    if isinstance(item, Reply):
        blocks: list[JSONDict] = []
        for block in item.content:
            if isinstance(block, TextContent):
                blocks.append({"type": "text", "text": block.text})
            else:
                tool: JSONDict = {"type": "tool_use", "name": block.name, "input": block.input}
                if block.id is not None:
                    tool["id"] = block.id
                blocks.append(tool)
        spec: JSONDict = {"content": blocks}
        if item.stop_reason is not None:
            spec["stop_reason"] = item.stop_reason
        if item.usage is not None:
            spec["usage"] = list(item.usage)
        if item.chunk_delay:
            spec["chunk_delay"] = item.chunk_delay
        return {"reply": spec}
    if isinstance(item, Fail):
        fail: JSONDict = {"status": item.status}
        for key in ("error_type", "message", "retry_after", "should_retry"):
            value = getattr(item, key)
            if value is not None:
                fail[key] = value
        return {"fail": fail}
    return {"delay": {"seconds": item.seconds, "then": item_to_json(item.then)}}


def load_script(source: str | Path | Sequence[Any]) -> list[ScriptItem]:
    """Load a script: a path to a JSON file, or the already-parsed JSON list.

    Format: a list of ``{"reply": {"content": [...], "stop_reason": ..., "usage": [in, out],
    "chunk_delay": s}}`` (content items are ``"text"`` strings, ``{"type": "text", "text": ...}``
    or ``{"type": "tool_use", "name": ..., "input": {...}, "id": optional}``; ``"text": "..."`` is
    shorthand for one text block), ``{"fail": {"status": 529, "error_type": ..., "message": ...,
    "retry_after": s, "should_retry": bool}}`` (or ``{"fail": 529}``) and
    ``{"delay": {"seconds": s, "then": <item>}}`` (or ``{"delay": s}``).
    """
    raw: Any = (
        json.loads(Path(source).read_text(encoding="utf-8"))
        if isinstance(source, str | Path)
        else source
    )
    if not isinstance(raw, list):
        raise ValueError("a script must be a JSON list of items")
    return [item_from_json(entry) for entry in raw]


def dump_script(items: Sequence[ScriptItem], path: str | Path) -> None:
    """Write ``items`` as a JSON script file, e.g. for the subprocess server."""
    Path(path).write_text(json.dumps([item_to_json(i) for i in items], indent=2), "utf-8")
