"""Tools of an MCP server as durable steps (``ToolRegistry.from_mcp``).

An MCP server's tools join a :class:`~dbos_agent.agent.ToolRegistry` beside function tools,
with the same :class:`~dbos_agent.agent.ToolOptions` (approvals, ``idempotent=False`` and
its guard, every retry option of ``@da.step``, ``timeout``), so an agent loop cannot tell
them apart:

* **The listing is a step**, ``mcp:list_tools:<server>``, taken once per run of a workflow
  (the first time the run needs the tools: a model call's ``tools`` or a tool call) and
  replayed on recovery, so a replayed turn sees the tools the live one saw, and a run that
  replays to its end never starts the server.
* **Each call is a step** ``tool:<name>`` recording the whole ``CallToolResult``. A result
  the server marks ``isError`` is recorded as it is (a result, not retried) and reaches the
  model as an ``is_error`` tool result.
* **A server that dies or hangs never hangs the agent.** A broken connection is reopened
  (a new server process) and an idempotent call tried again, at most ``reconnects`` times;
  a non-idempotent call is never sent twice. Connecting and every request have a timeout.
* **A server that is down is waited out, never recorded.** A listing, or a call, that
  cannot reach the server (it does not start, refuses connections, closes before the
  request could be sent; for an idempotent tool, also after it was sent) raises
  :class:`McpConnectionError`, a ``DependencyUnavailableError``: its step waits durably
  for its next attempt (``workflows list`` says it waits for ``MCP server 'name'``), up to
  ``give_up_after`` (24 hours by default, a tool option like any other). A non-idempotent
  call that may have reached the server is never sent again: it is recorded as an
  ``isError`` result saying so, and so is a call the server refused or that timed out.

The connection to a server given as parameters (``StdioServerParameters``, or a command
list) or as a URL (:class:`~.mcp_sources.McpHttpServer`, Streamable HTTP) is opened lazily
and lives on an event loop thread of its own, so the same registry
serves async workflows on the shared loop, sync workflows in threads, and plain code. A
``mcp.ClientSession`` given instead belongs to the event loop that opened it: the
registry calls it there, and sync use from that loop's own thread is refused with
:class:`AsyncOnlyToolError`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, Unpack, cast

from mcp import ClientSession
from mcp import types as mcp_types
from mcp.shared.exceptions import MCPError

from .._engine.extending import (
    STEP_OPTIONS,
    StepSettings,
    WorkflowContext,
    check_known,
    current_context,
    layered,
)
from .._engine.step import step as engine_step
from ..errors import AsyncOnlyToolError, McpConnectionError, ToolErrorResult, ToolInputError
from .mcp_connections import (
    Connection,
    GivenSession,
    OwnedConnection,
    answer_too_large,
    connection_closed,
)
from .mcp_sources import (
    McpHttpServer,
    McpSource,
    default_name,
    safe_name,
    transport_for,
)
from .replay import note_step
from .tool_options import MCP_OWN, McpOptions, ToolOptions, check_tool_options
from .tools import Tool, _checked_name

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_REQUEST_TIMEOUT",
    "AsyncOnlyToolError",
    "McpConnectionError",
    "McpHttpServer",
    "McpOptions",
    "McpServer",
    "McpSource",
    "McpTool",
    "ToolErrorResult",
]

T = TypeVar("T")

#: Seconds to start a server and complete the MCP handshake.
DEFAULT_CONNECT_TIMEOUT = 30.0
#: Seconds a request (a listing, a call) may take when the tool has no ``timeout``.
DEFAULT_REQUEST_TIMEOUT = 300.0
#: Seconds a server may take to answer the ping sent before a non-idempotent call.
PING_TIMEOUT = 10.0
#: Step name of a server's tool listing.
LIST_STEP_PREFIX = "mcp:list_tools:"
#: How long a listing or call waits out a server that is down (seconds) unless the tool
#: options say otherwise (``give_up_after``).
DEFAULT_GIVE_UP_AFTER = 24 * 3600.0


def _step_part(options: ToolOptions) -> dict[str, Any]:
    """The options of ``options`` that are its step's."""
    return {name: value for name, value in options.items() if name in STEP_OPTIONS}


def error_result(text: str) -> mcp_types.CallToolResult:
    """An ``isError`` result of our own, for a call the server could not answer."""
    return mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text=text)], is_error=True
    )


def stored_once(result: mcp_types.CallToolResult) -> mcp_types.CallToolResult:
    """``result`` without its structured content where that only repeats its text (a
    server answers both, the text for older clients): recorded once, not twice, so a
    result may be nearly as large as the checkpoint limit. The model reads the text
    either way; a structured content that says more than the text is kept."""
    structured = result.structured_content
    texts = [item.text for item in result.content if isinstance(item, mcp_types.TextContent)]
    if structured is None or len(texts) != 1 or len(result.content) != 1:
        return result
    try:
        parsed: Any = json.loads(texts[0])
    except ValueError:
        parsed = texts[0]
    if parsed == structured or (set(structured) == {"result"} and parsed == structured["result"]):
        return result.model_copy(update={"structured_content": None})
    return result


class McpTool(Tool[..., Coroutine[Any, Any, mcp_types.CallToolResult]]):
    """One tool of an MCP server, as the registry runs it: a step ``tool:<name>``.

    It is a :class:`Tool` for the registry (name, description, schema, approval and step
    options); its schema is the server's, its input is checked by the server (a refusal is
    an ``isError`` result), and its value is the whole ``CallToolResult``.
    """

    def __init__(self, server: McpServer, listed: mcp_types.Tool, options: ToolOptions) -> None:
        # Not Tool.__init__: the schema is the server's, not derived from a signature.
        self.server = server
        self.mcp_name = listed.name
        self.name = _checked_name(options.get("name") or safe_name(listed.name)[:128], options)
        self.description = options.get("description") or listed.description or ""
        self.input_schema: dict[str, Any] = dict(listed.input_schema)

        async def call_mcp_tool(**arguments: Any) -> mcp_types.CallToolResult:
            result = await server.call_tool(self.mcp_name, arguments, idempotent=self.idempotent)
            return stored_once(result)

        # Its ``timeout`` is the request's (a hang is an isError result for the model, see
        # call_tool), never the step's: the step only ever sees a server it cannot reach.
        step_options = cast(ToolOptions, {k: v for k, v in options.items() if k != "timeout"})
        self._init_step(call_mcp_tool, step_options)

    def validate(self, raw: object) -> dict[str, Any]:
        """The input as keyword arguments; the server checks it against its schema."""
        if not isinstance(raw, dict):
            raise ToolInputError(f"invalid input for tool {self.name!r}: expected an object")
        return dict(raw)

    @staticmethod
    def render(value: object) -> str:
        """The result's content as tool_result text; an ``isError`` result raises
        :class:`ToolErrorResult` (the model gets it as an ``is_error`` result)."""
        if not isinstance(value, mcp_types.CallToolResult):
            return Tool.render(value)
        parts = [
            item.text
            if isinstance(item, mcp_types.TextContent)
            else item.model_dump_json(exclude_none=True)
            for item in value.content
        ]
        if not parts and value.structured_content is not None:
            parts.append(json.dumps(value.structured_content))
        text = "\n".join(parts)
        if value.is_error:
            raise ToolErrorResult(text or "the MCP tool failed")
        return text or "(no result)"


class McpServer:
    """One MCP server of a registry: its connection, its per-run listing and its tools.

    Made by :meth:`ToolRegistry.add_mcp` (see there for the arguments).
    """

    def __init__(self, source: McpSource, **options: Unpack[McpOptions]) -> None:
        if "name" in options or "description" in options:
            raise TypeError("name= and description= are per tool: pass them in tool_options")
        self.name = options.get("server_name") or default_name(source)
        check_known(options, McpOptions.__optional_keys__, f"MCP server {self.name!r}")
        tool_options = dict(options.get("tool_options") or {})
        for mcp_name, own in tool_options.items():
            check_tool_options(own, f"MCP tool {mcp_name!r}")
        #: The options every tool of the server starts from: a server that is down is
        #: waited for (``give_up_after``), and named as what the step waits for.
        self.defaults = cast(
            ToolOptions,
            layered(
                {"give_up_after": DEFAULT_GIVE_UP_AFTER, "waits_for": f"MCP server {self.name!r}"},
                {k: v for k, v in options.items() if k not in MCP_OWN},
            ),
        )
        # the server's step options, checked now (a mistake is the code's, not a run's)
        paced = StepSettings.of(_step_part(self.defaults), f"MCP server {self.name!r}").retry
        self.tool_options = tool_options
        request_timeout = options.get("request_timeout")
        self.request_timeout = (
            DEFAULT_REQUEST_TIMEOUT if request_timeout is None else request_timeout
        )
        self.reconnects = options.get("reconnects", 2)
        connect_timeout = options.get("connect_timeout")
        self._connection: Connection = (
            GivenSession(source)
            if isinstance(source, ClientSession)
            else OwnedConnection(
                transport_for(source, options.get("errlog")),
                DEFAULT_CONNECT_TIMEOUT if connect_timeout is None else connect_timeout,
            )
        )
        self._lock = threading.Lock()
        self._runs: weakref.WeakKeyDictionary[WorkflowContext, list[McpTool]] = (
            weakref.WeakKeyDictionary()
        )
        self._outside: list[McpTool] | None = None
        self._made: dict[str, McpTool] = {}
        step_name = LIST_STEP_PREFIX + self.name

        def list_mcp_tools() -> list[mcp_types.Tool]:
            return self._with_reconnects_sync(self._list_all, self.request_timeout)

        async def list_mcp_tools_async() -> list[mcp_types.Tool]:
            return await self._with_reconnects(self._list_all, self.request_timeout)

        listing = engine_step(  # paced as the server's calls are, retrying only outages
            name=step_name,
            retry_policy=dataclasses.replace(
                paced, retries=0, retry_on=(McpConnectionError, TimeoutError), retry_if=None
            ),
        )
        self._list_step = listing(list_mcp_tools)
        self._list_step_async = listing(list_mcp_tools_async)

    def __repr__(self) -> str:
        return f"<McpServer {self.name}>"

    async def _list_all(self, session: ClientSession) -> list[mcp_types.Tool]:
        listed: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _page in itertools.count():
            params = None if cursor is None else mcp_types.PaginatedRequestParams(cursor=cursor)
            page = await session.list_tools(params=params)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                return listed
        raise AssertionError("unreachable")  # pragma: no cover

    def _with_reconnects_sync(
        self, use: Callable[[ClientSession], Awaitable[T]], timeout: float
    ) -> T:
        """:meth:`_with_reconnects` for sync code (the listing: safe to send again)."""
        for tries_left in range(self.reconnects, -1, -1):
            try:
                return self._connection.run_sync(use, timeout)
            except McpConnectionError as broken:
                # a broken session is dropped whatever comes next: the next use (this
                # loop's, or the step's next attempt) opens a new one
                self._connection.reset_sync(broken.session)
                if tries_left == 0 or not self._connection.reconnectable():
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _with_reconnects(
        self,
        use: Callable[[ClientSession], Awaitable[T]],
        timeout: float,
        *,
        resend: bool = True,
    ) -> T:
        """Run ``use`` on the session, reopening a broken connection (a new server) and
        running it again, at most ``reconnects`` times; a request that may have reached
        the server is sent again only with ``resend``."""
        for tries_left in range(self.reconnects, -1, -1):
            try:
                return await self._connection.run(use, timeout)
            except McpConnectionError as broken:
                await asyncio.to_thread(self._connection.reset_sync, broken.session)
                if (
                    tries_left == 0
                    or not self._connection.reconnectable()
                    or (broken.sent and not resend)
                ):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def call_tool(
        self, name: str, arguments: dict[str, Any], *, idempotent: bool
    ) -> mcp_types.CallToolResult:
        """The server's result for one call, or an ``isError`` result saying why there is
        none (the server refused, hung, or may have run a non-idempotent call before its
        connection broke); :class:`McpConnectionError` when the server cannot be reached
        and sending the call again is safe (the step waits for the server)."""
        timeout = self._call_timeout(name)

        async def call(session: ClientSession) -> mcp_types.CallToolResult:
            if not idempotent:  # a connection found dead now is reopened before sending
                try:
                    await asyncio.wait_for(session.send_ping(), min(timeout, PING_TIMEOUT))
                except Exception as exc:
                    if connection_closed(exc) or isinstance(exc, TimeoutError):
                        raise McpConnectionError.of(exc, session, sent=False) from exc
                    raise
            return await session.call_tool(name, arguments)

        try:
            return await self._with_reconnects(call, timeout, resend=idempotent)
        except McpConnectionError as broken:
            if idempotent or not broken.sent:
                raise  # nothing that must not repeat may have happened: wait for the server
            return error_result(
                f"MCP server {self.name!r} failed during {name!r} (it may or may not have "
                f"run): {broken}"
            )
        except TimeoutError:
            return error_result(f"MCP tool {name!r} did not answer within {timeout:g}s")
        except MCPError as refused:
            said = self._connection.scrub(refused.message)
            if answer_too_large(refused):
                return error_result(
                    f"the answer of MCP server {self.name!r} to {name!r} was larger than this "
                    f"client reads ({said}): ask for a smaller part of it"
                )
            return error_result(f"MCP server {self.name!r} refused {name!r}: {said}")

    def _call_timeout(self, mcp_name: str) -> float:
        own = self.tool_options.get(mcp_name, {}).get("timeout", self.defaults.get("timeout"))
        return own if own is not None else self.request_timeout

    # -- the listing, once per run -------------------------------------------------

    def listed(self) -> list[McpTool] | None:
        """This run's tools if it has listed them (outside a workflow: the last listing)."""
        ctx = current_context()
        with self._lock:
            return self._outside if ctx is None else self._runs.get(ctx)

    def _keep(self, listed: list[mcp_types.Tool]) -> list[McpTool]:
        tools = [self._tool(item) for item in listed]
        ctx = current_context()
        with self._lock:
            if ctx is None:
                self._outside = tools
            else:
                self._runs[ctx] = tools
        return tools

    def _tool(self, listed: mcp_types.Tool) -> McpTool:
        """One McpTool per tool definition (a changed definition makes a new one)."""
        key = listed.model_dump_json()
        with self._lock:
            made = self._made.get(key)
        if made is None:
            options = cast(
                ToolOptions, layered(self.defaults, self.tool_options.get(listed.name, {}))
            )
            made = McpTool(self, listed, options)
            with self._lock:
                self._made[key] = made
        return made

    def list_tools(self) -> list[McpTool]:
        """This run's tools, listing them (a step) the first time the run asks."""
        known = self.listed()
        if known is not None:
            return known
        note_step()
        return self._keep(self._list_step())

    async def list_tools_async(self) -> list[McpTool]:
        """:meth:`list_tools` for async code."""
        known = self.listed()
        if known is not None:
            return known
        note_step()
        return self._keep(await self._list_step_async())

    def close(self) -> None:
        """Stop the server this registry started (a session given to it stays open)."""
        self._connection.close()

    async def aclose(self) -> None:
        """:meth:`close` for async code."""
        await asyncio.to_thread(self._connection.close)
