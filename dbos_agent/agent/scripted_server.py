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

from .scripted import *  # noqa: F403 - this module is the package's stable public facade
from .scripted import __all__ as __all__
from .scripted import main

if __name__ == "__main__":
    raise SystemExit(main())
