"""A scripted, offline Anthropic Messages API server.

Durable-execution tests need a model that answers deterministically, fails on cue (529, 429,
timeouts) and counts what it was asked, including from outside a process that was killed.
Mocking the client would skip the real HTTP, retry and streaming code paths, so this is a real
HTTP server on 127.0.0.1 that the official ``anthropic.Anthropic(base_url=server.url)`` client
talks to unchanged, both with ``messages.create`` and ``messages.stream``.

Typical use::

    with ScriptedServer([Fail(529), Reply([text("hi")])]) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key="scripted")
        client.messages.create(model="m", max_tokens=64, messages=[...])
        assert server.paid_calls == 1

Run it as its own process (for kill -9 tests) with
``python -m dbos_agent.agent.scripted_server --script FILE.json --port 0 --port-file F``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast

if TYPE_CHECKING:
    from anthropic.types import ToolParam

__all__ = [
    "CHANGELOG_LINE",
    "CODING_TASK_TOOLS",
    "ContentBlock",
    "Delay",
    "Fail",
    "Reply",
    "RequestRecord",
    "ScriptFn",
    "ScriptItem",
    "ScriptedServer",
    "TextContent",
    "ToolUseContent",
    "coding_task_script",
    "dump_script",
    "item_from_json",
    "item_to_json",
    "load_script",
    "main",
    "seed_coding_task",
    "text",
    "tool_use",
    "validate_request",
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


# --------------------------------------------------------------------------- request log


@dataclass(frozen=True)
class RequestRecord:
    """One POST /v1/messages as the server saw and answered it.

    ``item`` is the top-level script item that answered (a Delay, not what it wraps) and
    ``script_index`` its position (or the callable's call number); both are None when the
    request was rejected before reaching the script (validation) or the script ran out.
    Records are logged just before the reply is written, so a client that has its reply always
    finds it logged. ``status`` is 0 when the server stopped before answering.
    ``client_disconnected`` is set afterwards (in memory only) when writing the reply failed,
    e.g. a client killed mid-stream; such a 200 still counts as paid, as with the real API.
    """

    seq: int
    timestamp: float
    body: Any
    stream: bool
    status: int
    item: ScriptItem | None
    script_index: int | None
    usage: tuple[int, int] | None
    stop_reason: str | None
    retry_count: int | None
    client_disconnected: bool = False

    @property
    def paid(self) -> bool:
        """A 200 reply: the model did (and, for real, would bill) the work."""
        return self.status == 200


class _ScriptExhaustedError(Exception):
    pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], scripted: ScriptedServer) -> None:
        self.scripted = scripted
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ScriptedAnthropic/1.0"

    @property
    def scripted(self) -> ScriptedServer:
        return cast(_HTTPServer, self.server).scripted

    def setup(self) -> None:
        super().setup()
        # Headers and body are separate writes: without NODELAY, Nagle plus the client's
        # delayed ACK add ~40 ms to every reply.
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.scripted._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.scripted._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default per-request stderr line; the request log has it all."""

    # -- writing ------------------------------------------------------------

    def _send_json(
        self, status: int, payload: Any, headers: Mapping[str, str] | None = None
    ) -> bool:
        data = json.dumps(payload).encode("utf-8")
        try:
            self.send_response(status, _REASON_PHRASES.get(status))
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            self.close_connection = True
            return False
        return True

    def _send_error_json(
        self, status: int, error_type: str, message: str, headers: Mapping[str, str] | None = None
    ) -> bool:
        headers = headers or {}
        request_id = headers.get("request-id", "req_unknown")
        return self._send_json(status, _error_body(error_type, message, request_id), headers)

    def _send_sse(
        self, events: list[tuple[str, JSONDict]], chunk_delay: float, headers: Mapping[str, str]
    ) -> bool:
        try:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("cache-control", "no-cache")
            self.send_header("transfer-encoding", "chunked")
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            for position, (name, payload) in enumerate(events):
                if position and chunk_delay > 0 and self.scripted._sleep(chunk_delay):
                    self.close_connection = True
                    return False
                data = f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()
                self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True
            return False
        return True

    # -- routing ------------------------------------------------------------

    def do_GET(self) -> None:
        self._not_found()

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/v1/messages":
            self.scripted._handle_messages(self, raw)
        elif path == "/v1/messages/count_tokens":
            self._count_tokens(raw)
        else:
            self._not_found()

    def _not_found(self) -> None:
        self._send_error_json(
            404, "not_found_error", f"ScriptedServer only serves POST /v1/messages, not {self.path}"
        )

    def _count_tokens(self, raw: bytes) -> None:
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        self._send_json(
            200, {"input_tokens": _input_tokens(body if isinstance(body, dict) else {})}
        )


# --------------------------------------------------------------------------- the server


class ScriptedServer:
    """A local Messages API endpoint that answers from a script.

    ``script`` is a sequence of items consumed one per POST /v1/messages (invalid requests do
    not consume one), or a callable that gets the parsed request body and returns the item, so
    a reply can depend on the conversation. ``log_path`` appends one JSON line per request, for
    counting calls from outside a killed process; ``state_path`` persists the next script index
    so a restarted server process carries on where the previous one stopped.
    """

    def __init__(
        self,
        script: Sequence[ScriptItem] | ScriptFn | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        log_path: str | Path | None = None,
        state_path: str | Path | None = None,
    ) -> None:
        self._fn: ScriptFn | None = None
        self._items: list[ScriptItem] = []
        if callable(script):
            self._fn = script
        elif script is not None:
            self._items = list(script)
        self.host = host
        self._port = port
        self.log_path = Path(log_path) if log_path is not None else None
        self.state_path = Path(state_path) if state_path is not None else None
        self._next_index = 0
        self._seq = 0
        self._records: list[RequestRecord] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> ScriptedServer:
        """Bind and serve in a daemon thread; returns self. ``port=0`` picks a free port."""
        if self._httpd is not None:
            raise RuntimeError("ScriptedServer already started")
        if self.state_path is not None and self.state_path.exists():
            self._next_index = int(json.loads(self.state_path.read_text())["next_index"])
        self._stopping.clear()
        self._httpd = _HTTPServer((self.host, self._port), self)
        self._port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"scripted-anthropic-{self._port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, wake pending Delays and drop open (keep-alive) connections."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (the requested one until started)."""
        return self._port

    @property
    def url(self) -> str:
        """Base URL for ``anthropic.Anthropic(base_url=...)``."""
        if self._httpd is None:
            raise RuntimeError("ScriptedServer is not running; call start() first")
        return f"http://{self.host}:{self._port}"

    # -- script and log access -------------------------------------------------

    def add(self, *items: ScriptItem) -> None:
        """Append items to a sequence script, e.g. after inspecting earlier requests."""
        if self._fn is not None:
            raise TypeError("cannot add items to a callable script")
        with self._lock:
            self._items.extend(items)

    @property
    def next_index(self) -> int:
        """Index of the next script item to serve (or number of callable calls so far)."""
        with self._lock:
            return self._next_index

    @property
    def remaining(self) -> int | None:
        """Items left in a sequence script; None for a callable script."""
        with self._lock:
            return None if self._fn is not None else max(0, len(self._items) - self._next_index)

    @property
    def requests(self) -> list[RequestRecord]:
        """A snapshot of every POST /v1/messages so far, oldest first."""
        with self._lock:
            return list(self._records)

    @property
    def paid_calls(self) -> int:
        """Number of 200 replies: what a real API would have billed."""
        with self._lock:
            return sum(1 for r in self._records if r.paid)

    @property
    def usage_total(self) -> tuple[int, int]:
        """Summed (input_tokens, output_tokens) over the paid replies."""
        with self._lock:
            paid = [r.usage for r in self._records if r.paid and r.usage is not None]
        return sum(u[0] for u in paid), sum(u[1] for u in paid)

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> list[RequestRecord]:
        """Block until ``count`` requests were answered; for clients running in other threads."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._records) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self._records)} of {count} requests after {timeout}s")
                self._changed.wait(left)
            return list(self._records)

    # -- internals ------------------------------------------------------------------

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless the server stops first; True means it is stopping."""
        return self._stopping.wait(seconds)

    def _take(self, body: JSONDict, seq: int) -> tuple[int, ScriptItem]:
        fn = self._fn
        with self._lock:
            index = self._next_index
            if fn is None and index >= len(self._items):
                raise _ScriptExhaustedError(
                    f"ScriptedServer: the script ran out: all {len(self._items)} items were "
                    f"used and request #{seq} asked for item {index}. "
                    "Add more items to the script."
                )
            self._next_index = index + 1
            self._save_state()
            if fn is None:
                return index, self._items[index]
        return index, fn(body)

    def _save_state(self) -> None:
        if self.state_path is None:
            return
        tmp = self.state_path.with_name(self.state_path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"next_index": self._next_index}))
        tmp.replace(self.state_path)

    def _handle_messages(self, handler: _Handler, raw: bytes) -> None:
        with self._lock:
            seq = self._seq
            self._seq += 1
        started = time.time()
        request_id = "req_" + _digest(["req", seq, started])[:24]
        headers = {"request-id": request_id}
        retry_header = handler.headers.get("x-stainless-retry-count")
        retry_count = int(retry_header) if retry_header and retry_header.isdigit() else None
        body: Any = None
        stream = False
        item: ScriptItem | None = None
        index: int | None = None
        usage: tuple[int, int] | None = None
        stop_reason: str | None = None
        status = 0

        def answer_with(send: Callable[[], bool]) -> None:
            # Log first: once the client holds the reply, the log must already show it, even
            # if the client process is killed right after (crash tests read the log).
            position = self._record(
                RequestRecord(
                    seq=seq,
                    timestamp=started,
                    body=body,
                    stream=stream,
                    status=status,
                    item=item,
                    script_index=index,
                    usage=usage,
                    stop_reason=stop_reason,
                    retry_count=retry_count,
                )
            )
            if not send():
                self._mark_disconnected(position)

        def error(code: int, kind: str, message: str, extra: Mapping[str, str]) -> None:
            answer_with(lambda: handler._send_error_json(code, kind, message, extra))

        try:
            body = json.loads(raw) if raw else None
        except ValueError as exc:
            status = 400
            error(400, "invalid_request_error", f"Request body is not valid JSON: {exc}", headers)
            return
        stream = isinstance(body, dict) and body.get("stream") is True
        problem = validate_request(body)
        if problem is not None:
            status = 400
            error(400, "invalid_request_error", problem, headers)
            return
        # Script problems are test bugs: tell the client not to retry them.
        no_retry = {**headers, "x-should-retry": "false"}
        try:
            index, item = self._take(cast(JSONDict, body), seq)
        except _ScriptExhaustedError as exc:
            status = 500
            error(500, "api_error", str(exc), no_retry)
            return
        except Exception as exc:
            status = 500
            error(500, "api_error", f"ScriptedServer: the script callable raised {exc!r}", no_retry)
            return

        answer: ScriptItem = item
        while isinstance(answer, Delay):
            if self._sleep(answer.seconds):
                handler.close_connection = True
                answer_with(lambda: False)  # status 0: the server stopped before answering
                return
            answer = answer.then
        if isinstance(answer, Fail):
            status = answer.status
            fail_headers = dict(headers)
            if answer.retry_after is not None:
                seconds = float(answer.retry_after)
                fail_headers["retry-after"] = (
                    str(int(seconds)) if seconds.is_integer() else str(seconds)
                )
            if answer.should_retry is not None:
                fail_headers["x-should-retry"] = "true" if answer.should_retry else "false"
            error_type = answer.error_type or _ERROR_TYPES.get(answer.status, "api_error")
            message = answer.message or f"ScriptedServer: scripted {error_type} ({answer.status})"
            error(status, error_type, message, fail_headers)
            return
        message_json = _render_message(answer, cast(JSONDict, body), seq)
        usage = (message_json["usage"]["input_tokens"], message_json["usage"]["output_tokens"])
        stop_reason = message_json["stop_reason"]
        status = 200
        if stream:
            events = _sse_events(message_json)
            delay = answer.chunk_delay
            answer_with(lambda: handler._send_sse(events, delay, headers))
        else:
            answer_with(lambda: handler._send_json(200, message_json, headers))

    def _record(self, rec: RequestRecord) -> int:
        with self._changed:
            self._records.append(rec)
            self._changed.notify_all()
            if self.log_path is not None:
                self._append_log(rec)
            return len(self._records) - 1

    def _mark_disconnected(self, position: int) -> None:
        with self._lock:
            self._records[position] = replace(self._records[position], client_disconnected=True)

    def _append_log(self, rec: RequestRecord) -> None:
        body = rec.body if isinstance(rec.body, dict) else {}
        messages = body.get("messages")
        line = {
            "seq": rec.seq,
            "ts": rec.timestamp,
            "pid": os.getpid(),
            "status": rec.status,
            "paid": rec.paid,
            "model": body.get("model"),
            "messages": len(messages) if isinstance(messages, list) else None,
            "stream": rec.stream,
            "item": type(rec.item).__name__.lower() if rec.item is not None else None,
            "script_index": rec.script_index,
            "stop_reason": rec.stop_reason,
            "usage": (
                {"input_tokens": rec.usage[0], "output_tokens": rec.usage[1]}
                if rec.usage is not None
                else None
            ),
            "retry_count": rec.retry_count,
        }
        # Open per line: O_APPEND makes each line one write even with several server processes.
        assert self.log_path is not None
        with self.log_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
            fh.flush()


# --------------------------------------------------------------------------- demo scenario

CODING_TASK_TOOLS: list[ToolParam] = [
    {
        "name": "read_file",
        "description": "Read a text file and return its contents.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {
        "name": "write_file",
        "description": "Create or overwrite a text file.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
    {
        "name": "run_bash",
        "description": "Run a shell command and return its exit code and output.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
]
"""Tool definitions matching :func:`coding_task_script`, to pass as ``tools=``."""

_BUGGY_CALC = '''"""A tiny calculator, the subject of the dbos_agent demo task."""


def add(a: float, b: float) -> float:
    return a + b


def average(values: list[float]) -> float:
    """Arithmetic mean of ``values``."""
    return sum(values) / (len(values) - 1)
'''

_FIXED_CALC = '''"""A tiny calculator, the subject of the dbos_agent demo task."""


def add(a: float, b: float) -> float:
    return a + b


def average(values: list[float]) -> float:
    """Arithmetic mean of ``values``."""
    if not values:
        raise ValueError("average() of an empty list")
    return sum(values) / len(values)
'''

_TEST_CALC = '''"""Tests for calc.py; run with `python test_calc.py` (or pytest)."""

from calc import add, average


def test_add() -> None:
    assert add(2, 3) == 5


def test_average() -> None:
    assert average([1, 2, 3, 4]) == 2.5


def test_average_single() -> None:
    assert average([7]) == 7


if __name__ == "__main__":
    failed = 0
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]
    for name, fn in tests:
        try:
            fn()
        except Exception as exc:
            failed += 1
            print(f"FAIL {name}: {exc!r}")
        else:
            print(f"PASS {name}")
    print(f"{len(tests) - failed} passed, {failed} failed")
    raise SystemExit(1 if failed else 0)
'''

CHANGELOG_LINE = "- Fixed off-by-one in calc.average() (divided by len - 1)"


def seed_coding_task(workdir: Path) -> None:
    """Write the buggy ``calc.py``, its ``test_calc.py`` and an empty ``CHANGELOG.md``."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "calc.py").write_text(_BUGGY_CALC, encoding="utf-8")
    (workdir / "test_calc.py").write_text(_TEST_CALC, encoding="utf-8")
    (workdir / "CHANGELOG.md").write_text("# Changelog\n\n", encoding="utf-8")


def _tool_results(messages: Sequence[Any]) -> list[str]:
    """Text of every tool_result in the conversation, in order."""
    out: list[str] = []
    for message in messages:
        if not isinstance(message, Mapping) or message.get("role") != "user":
            continue
        for block in _content_blocks(message):
            if block.get("type") != "tool_result":
                continue
            content = block.get("content", "")
            if isinstance(content, list):
                content = "".join(str(c.get("text", "")) for c in content if isinstance(c, Mapping))
            out.append(str(content))
    return out


def coding_task_script(workdir: str, python: str = "python3") -> ScriptFn:
    """A believable 6-turn coding task: read, test, fix, re-test, log to CHANGELOG, summarise.

    The turn is the number of assistant messages in the request, not a server-side counter, so
    a client that resumes a conversation after a crash gets the correct next reply. Turn 4 is
    the non-idempotent side effect (``echo ... >> CHANGELOG.md``) that crash tests look for.
    """
    root = Path(workdir)
    calc = str(root / "calc.py")
    cd = f"cd {shlex.quote(str(root))} && "
    run_tests = cd + f"{python} test_calc.py"

    def script(body: JSONDict) -> ScriptItem:
        messages = body.get("messages", [])
        turn = sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant")
        results = _tool_results(messages)
        if turn == 0:
            return Reply(
                [text("I'll start by reading calc.py."), tool_use("read_file", {"path": calc})]
            )
        if turn == 1:
            return Reply(
                [
                    text("Let me run the test suite to see what fails."),
                    tool_use("run_bash", {"command": run_tests}),
                ]
            )
        if turn == 2:
            return Reply(
                [
                    text(
                        "`average` divides by `len(values) - 1`, so the mean is wrong and a "
                        "single value divides by zero. Fixing it to divide by `len(values)`."
                    ),
                    tool_use("write_file", {"path": calc, "content": _FIXED_CALC}),
                ]
            )
        if turn == 3:
            return Reply(
                [text("Re-running the tests."), tool_use("run_bash", {"command": run_tests})]
            )
        if turn == 4:
            command = cd + f"echo {shlex.quote(CHANGELOG_LINE)} >> CHANGELOG.md"
            return Reply(
                [
                    text("Recording the fix in CHANGELOG.md."),
                    tool_use("run_bash", {"command": command}),
                ]
            )
        second_run = results[3] if len(results) > 3 else ""
        verdict = (
            "all tests pass now"
            if "0 failed" in second_run
            else f"but the tests still report problems:\n{second_run.strip()}"
        )
        return Reply(
            [
                text(
                    "Done. `calc.average` divided by `len(values) - 1`; it now divides by "
                    f"`len(values)` and rejects empty input, {verdict}. "
                    "I added a CHANGELOG.md entry for the fix."
                )
            ]
        )

    return script


def _echo_script(body: JSONDict) -> ScriptItem:
    """Answer with the last user text: a never-ending script for smoke tests."""
    messages = body.get("messages", [])
    last = messages[-1] if messages else {}
    content = last.get("content", "") if isinstance(last, Mapping) else ""
    if isinstance(content, list):
        content = " ".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping))
    return Reply([text(f"echo: {content}")])


# --------------------------------------------------------------------------- CLI


def _write_atomic(path: Path, data: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(data, encoding="utf-8")
    tmp.replace(path)


def _with_chunk_delay(
    script: Sequence[ScriptItem] | ScriptFn, seconds: float
) -> Sequence[ScriptItem] | ScriptFn:
    """The same script with ``chunk_delay=seconds`` on every reply (also inside Delays)."""

    def slowed(item: ScriptItem) -> ScriptItem:
        if isinstance(item, Reply):
            return replace(item, chunk_delay=seconds)
        if isinstance(item, Delay):
            return replace(item, then=slowed(item.then))
        return item

    if callable(script):
        fn = script
        return lambda body: slowed(fn(body))
    return [slowed(item) for item in script]


def main(argv: Sequence[str] | None = None) -> int:
    """Run a ScriptedServer as its own process until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(
        prog="python -m dbos_agent.agent.scripted_server",
        description="Scripted offline Anthropic Messages API server.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--script", type=Path, help="JSON script file (list of items)")
    source.add_argument(
        "--scenario", choices=["coding_task", "echo"], help="built-in scripted conversation"
    )
    parser.add_argument("--workdir", type=Path, default=Path.cwd(), help="for coding_task")
    parser.add_argument("--seed", action="store_true", help="seed --workdir for coding_task")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", type=Path, help="append one JSON line per request")
    parser.add_argument("--port-file", type=Path, help="write the port here once listening")
    parser.add_argument("--state", type=Path, help="persist the script position here")
    parser.add_argument(
        "--chunk-delay",
        type=float,
        default=0.0,
        help="seconds between streamed events of each reply (to kill a client mid-stream)",
    )
    args = parser.parse_args(argv)

    script: Sequence[ScriptItem] | ScriptFn
    if args.script is not None:
        script = load_script(args.script)
    elif args.scenario == "coding_task":
        if args.seed:
            seed_coding_task(args.workdir)
        script = coding_task_script(str(args.workdir.resolve()))
    else:
        script = _echo_script
    if args.chunk_delay > 0:
        script = _with_chunk_delay(script, args.chunk_delay)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = ScriptedServer(
        script, host=args.host, port=args.port, log_path=args.log, state_path=args.state
    )
    server.start()
    try:
        if args.port_file is not None:
            _write_atomic(args.port_file, f"{server.port}\n")
        print(f"scripted Anthropic server listening on {server.url}", file=sys.stderr, flush=True)
        while not stop.wait(0.2):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
