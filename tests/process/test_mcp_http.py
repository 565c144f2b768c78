"""MCP tools over Streamable HTTP (``McpHttpServer``, or a URL): a real MCP server
(tests/apps/mcp_server_app.py --http) started by the test, its effects counted from the file
it appends to.

* the listing and each call are steps, as over stdio; a replay does not call the server;
* a server restarted on its port is reached again (a new MCP session) and an idempotent
  call goes through;
* the URL's credentials and query and the headers' values (``Authorization``) appear in no
  error, no result, no ``repr`` and no row of the step log.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import ToolResultBlockParam

import dbos_agent as da
from dbos_agent.agent import ToolRegistry
from dbos_agent.agent.mcp import McpConnectionError, McpHttpServer
from dbos_agent.testing import Inspector
from tests.helpers import new_id, wait_until
from tests.process.test_mcp_tools import CURRENT, async_calls, effects, use
from tests.support import zygote
from tests.support.web import free_port

ROOT = Path(__file__).resolve().parents[2]
LISTING = "mcp:list_tools:127_0_0_1"
SECRETS = ("pw-sekrit", "tok-sekrit", "hdr-sekrit")


def start_server(port: int, log: Path) -> subprocess.Popen[bytes]:
    server = zygote.popen(
        [sys.executable, "-m", "tests.apps.mcp_server_app", "--http", str(port)],
        cwd=ROOT,
        env={**os.environ, "MCP_SIDE_EFFECTS": str(log)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert server.poll() is None, "the MCP HTTP server exited"
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return server
        time.sleep(0.05)
    server.kill()
    raise TimeoutError("the MCP HTTP server did not listen")


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "effects.log"


@pytest.fixture
def http_server(log: Path) -> Iterator[tuple[int, Callable[[], None]]]:
    """A server on a free port, and a way to kill it -9 and start it again there."""
    port = free_port()
    running = [start_server(port, log)]

    def restart() -> None:
        running[0].kill()
        running[0].wait(10)
        running[0] = start_server(port, log)

    yield port, restart
    running[0].kill()
    running[0].wait(10)


@pytest.fixture
def registries() -> Iterator[Callable[..., ToolRegistry]]:
    made: list[ToolRegistry] = []

    def make(source: Any, **options: Any) -> ToolRegistry:
        made.append(ToolRegistry.from_mcp(source, **options))
        CURRENT["tools"] = made[-1]
        return made[-1]

    yield make
    for registry in made:
        registry.close()
    CURRENT.clear()


def results_of(workflow_id: str) -> list[ToolResultBlockParam]:
    return da.retrieve(workflow_id).result(timeout=60)  # type: ignore[no-any-return]


def test_calls_over_http_are_steps_and_a_replay_does_not_call_the_server(
    runtime: da.Runtime,
    inspector: Inspector,
    http_server: tuple[int, Callable[[], None]],
    registries: Callable[..., ToolRegistry],
    log: Path,
) -> None:
    port, _ = http_server
    server = McpHttpServer(
        f"http://127.0.0.1:{port}/mcp", headers={"Authorization": "Bearer hdr-sekrit"}
    )
    registries(server)
    handle = da.start(async_calls, [use(0, "add", a=1, b=2), use(1, "append", text="once")])
    added, appended = handle.result(timeout=60)
    assert (added["content"], appended["content"]) == ("3", "appended once")
    assert inspector.step_names(handle.workflow_id) == [LISTING, "tool:add", "tool:append"]
    assert len(effects(log, "add")) == 1 and len(effects(log, "append")) == 1

    registries(f"http://127.0.0.1:{port}/mcp")  # a URL does as well: the same name
    fork = da.operations.fork(handle.workflow_id, from_step=3)  # every step replayed
    assert fork.result(timeout=60) == [added, appended]
    assert len(effects(log, "add")) == 1 and len(effects(log, "append")) == 1
    assert "hdr-sekrit" not in repr(server) and "Authorization" in repr(server)


def test_a_server_restarted_on_its_port_is_reached_again(
    runtime: da.Runtime,
    http_server: tuple[int, Callable[[], None]],
    registries: Callable[..., ToolRegistry],
    log: Path,
) -> None:
    port, restart = http_server
    registries(McpHttpServer(f"http://127.0.0.1:{port}/mcp"), connect_timeout=10)
    first = da.start(async_calls, [use(0, "add", a=1, b=1)])
    assert first.result(timeout=60)[0]["content"] == "2"
    restart()  # the session the registry held is gone with the old process
    second = da.start(async_calls, [use(0, "add", a=2, b=2)])
    (result,) = second.result(timeout=60)
    assert result["content"] == "4" and not result.get("is_error")
    assert len(effects(log, "server-start")) == 2 and len(effects(log, "add")) == 2


def test_no_secret_of_the_url_or_headers_reaches_an_error_the_log_or_a_repr(
    runtime: da.Runtime, inspector: Inspector, registries: Callable[..., ToolRegistry]
) -> None:
    port = free_port()  # nothing listens there
    server = McpHttpServer(
        f"http://user:pw-sekrit@127.0.0.1:{port}/mcp?token=tok-sekrit",
        headers={"Authorization": "Bearer hdr-sekrit"},
    )
    assert not any(secret in repr(server) for secret in SECRETS)
    registry = registries(server, connect_timeout=5, reconnects=1)
    with pytest.raises(McpConnectionError) as refused:  # the listing cannot reach it
        registry.list_tools()
    assert f"127.0.0.1:{port}/mcp" in str(refused.value)
    assert not any(secret in str(refused.value) for secret in SECRETS)
    alone = ToolRegistry()
    mcp_server = alone.add_mcp(server, connect_timeout=5, reconnects=1)
    try:
        with pytest.raises(McpConnectionError) as unreachable:  # a call waits for it too
            asyncio.run(mcp_server.call_tool("add", {"a": 1, "b": 2}, idempotent=True))
    finally:
        alone.close()
    assert not any(secret in str(unreachable.value) for secret in SECRETS)

    # in a workflow the listing waits for the server, its error on the RETRYING row
    wid = new_id("mcp-http-secrets")
    handle = da.start(async_calls, [use(0, "add", a=1, b=2)], workflow_id=wid)
    wait_until(lambda: handle.get_info().retrying is not None, 60, "the listing to wait")
    info = handle.get_info()
    assert info.retrying is not None and info.retrying.waiting_for == f"MCP server {LISTING[15:]!r}"
    assert f"127.0.0.1:{port}/mcp" in info.retrying.error_line()
    recorded = [repr(step) for step in inspector.steps(wid)] + [
        repr(info),
        info.retrying.describe(),
    ]
    assert recorded and not any(secret in text for text in recorded for secret in SECRETS)
    da.operations.cancel(wid)
