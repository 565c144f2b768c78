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

from .scripted import (
    CHANGELOG_LINE,
    CODING_TASK_TOOLS,
    ContentBlock,
    Delay,
    Fail,
    Reply,
    RequestRecord,
    ScriptedServer,
    ScriptFn,
    ScriptItem,
    TextContent,
    ToolUseContent,
    coding_task_script,
    dump_script,
    item_from_json,
    item_to_json,
    load_script,
    main,
    seed_coding_task,
    text,
    tool_use,
    validate_request,
)

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


if __name__ == "__main__":
    raise SystemExit(main())
