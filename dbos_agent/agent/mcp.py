"""Tools of an MCP server as durable steps (``ToolRegistry.from_mcp``).

An MCP server's tools join a :class:`~dbos_agent.agent.ToolRegistry` beside function tools,
with the same :class:`~dbos_agent.agent.ToolOptions` (approvals, ``idempotent=False`` and
its guard, retries, ``timeout``), so an agent loop cannot tell them apart:

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
  What is left after that is recorded as an ``isError`` result naming the failure.

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
import concurrent.futures
import contextlib
import itertools
import json
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TextIO, TypeVar, Unpack

import anyio
from mcp import ClientSession
from mcp import types as mcp_types
from mcp.shared.exceptions import MCPError

from ..engine.extending import WorkflowContext, current_context
from ..engine.step import step as engine_step
from ..errors import DbosAgentError
from .mcp_sources import (
    McpHttpServer,
    McpSource,
    Transport,
    default_name,
    safe_name,
    transport_for,
)
from .replay import note_step
from .tools import Tool, ToolErrorResult, ToolInputError, ToolOptions, _checked_name

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_REQUEST_TIMEOUT",
    "AsyncOnlyToolError",
    "McpConnectionError",
    "McpHttpServer",
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


class AsyncOnlyToolError(TypeError):
    """An MCP tool called from sync code where it cannot run: its ``ClientSession``
    belongs to an event loop that this thread would block (or that is not running)."""


class McpConnectionError(DbosAgentError):
    """The connection to an MCP server failed: the server died, closed its pipes, never
    came up or cannot be reached (raised by a listing; a call gets an ``isError`` result
    instead). Its message names the server without its secrets.

    ``sent``: the request may have reached the server; ``session``: the one that broke.
    """

    def __init__(self, message: str, *, sent: bool, session: ClientSession | None) -> None:
        super().__init__(message)
        self.sent = sent
        self.session = session

    @classmethod
    def of(cls, exc: BaseException, session: ClientSession, *, sent: bool) -> McpConnectionError:
        return cls(str(exc) or type(exc).__name__, sent=sent, session=session)


def error_result(text: str) -> mcp_types.CallToolResult:
    """An ``isError`` result of our own, for a call the server could not answer."""
    return mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text=text)], is_error=True
    )


def _closed(exc: BaseException) -> bool:
    """Does ``exc`` mean the connection is gone (rather than the server refusing)?"""
    if isinstance(exc, MCPError):
        return exc.code == mcp_types.CONNECTION_CLOSED
    return isinstance(
        exc, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream | OSError
    )


#: What an HTTP server answers (404) to a request of a session it does not know (it was
#: restarted, or let the session expire): the spec says to start a new session.
_LOST_SESSION = ("Session not found", "Session terminated")


def _session_lost(exc: BaseException) -> bool:
    """Does ``exc`` say the server no longer knows the session (nothing was run)?"""
    return (
        isinstance(exc, MCPError)
        and exc.code == mcp_types.INVALID_REQUEST
        and exc.message in _LOST_SESSION
    )


class _Connection:
    """Runs coroutines against one live ``ClientSession``, opening it when needed."""

    async def run(self, use: Callable[[ClientSession], Awaitable[T]], timeout: float) -> T:
        raise NotImplementedError

    def run_sync(self, use: Callable[[ClientSession], Awaitable[T]], timeout: float) -> T:
        raise NotImplementedError

    def reconnectable(self) -> bool:
        return False

    def reset_sync(self, broken: ClientSession | None) -> None:
        """Drop the connection of session ``broken`` if it is still the current one
        (calls that broke together reopen it once); the next :meth:`run` opens a new one."""

    def close(self) -> None:
        """Close what this object opened."""

    def scrub(self, text: str) -> str:
        """``text`` without the secrets of how this connection reaches its server."""
        return text


async def _guarded(
    session: ClientSession, use: Callable[[ClientSession], Awaitable[T]], timeout: float
) -> T:
    try:
        return await asyncio.wait_for(use(session), timeout)
    except TimeoutError:
        raise
    except Exception as exc:
        if _session_lost(exc):  # refused before it ran: safe to send on a new session
            raise McpConnectionError.of(exc, session, sent=False) from exc
        if _closed(exc):
            raise McpConnectionError.of(exc, session, sent=True) from exc
        raise


class _OwnedConnection(_Connection):
    """A connection this registry opens (a server it starts over stdio, or one it reaches
    over HTTP), on an event loop thread of its own.

    The session and its transport are entered and left by one task (anyio's task groups
    require it), which holds them open until :meth:`reset_sync` or :meth:`close`. What it
    says of a failure is scrubbed of the server's secrets (see ``mcp_sources``).
    """

    def __init__(self, transport: Transport, connect_timeout: float) -> None:
        self.transport = transport
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: ClientSession | None = None
        self._holder: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._opening: asyncio.Lock | None = None

    def reconnectable(self) -> bool:
        return True

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=_serve, args=(loop,), name="dbos-agent-mcp", daemon=True
                ).start()
                self._loop = loop
            return self._loop

    def _submit(
        self, use: Callable[[ClientSession], Awaitable[T]], timeout: float
    ) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(self._on_loop(use, timeout), self._ensure_loop())

    async def run(self, use: Callable[[ClientSession], Awaitable[T]], timeout: float) -> T:
        return await asyncio.wrap_future(self._submit(use, timeout))

    def run_sync(self, use: Callable[[ClientSession], Awaitable[T]], timeout: float) -> T:
        if self._loop is not None and _on_thread(self._loop):
            raise AsyncOnlyToolError("an MCP call cannot wait for its own connection's loop")
        return self._submit(use, timeout).result(timeout + self.connect_timeout + 5)

    async def _on_loop(self, use: Callable[[ClientSession], Awaitable[T]], timeout: float) -> T:
        session = await self._open()
        try:
            return await _guarded(session, use, timeout)
        except McpConnectionError as broken:
            scrubbed = self.transport.scrub(str(broken))
            raise McpConnectionError(scrubbed, sent=broken.sent, session=broken.session) from None
        except (MCPError, TimeoutError):
            raise  # the server's answer, or our own words
        except Exception as exc:  # the transport's: its text may name the URL
            text = self.transport.scrub(f"{type(exc).__name__}: {exc}")
            raise McpConnectionError(text, sent=True, session=session) from None

    def scrub(self, text: str) -> str:
        return self.transport.scrub(text)

    async def _open(self) -> ClientSession:
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._session is not None:
                return self._session
            ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            self._holder = asyncio.ensure_future(self._hold(ready, self._stop))
            try:
                self._session = await asyncio.wait_for(asyncio.shield(ready), self.connect_timeout)
            except BaseException as exc:
                await self._end_holder()
                if isinstance(exc, asyncio.CancelledError):
                    raise
                said = self.transport.scrub(repr(exc))
                message = f"could not connect to {self.transport.describe}: {said}"
                raise McpConnectionError(message, sent=False, session=None) from exc
            return self._session

    async def _hold(self, ready: asyncio.Future[ClientSession], stop: asyncio.Event) -> None:
        try:
            async with (
                self.transport.streams() as streams,
                ClientSession(*streams) as session,
            ):
                await session.initialize()
                ready.set_result(session)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            if not isinstance(exc, Exception):
                raise

    async def _end_holder(self, only: ClientSession | None = None) -> None:
        """End the task holding the connection open (if it holds ``only``, when given)."""
        if only is not None and self._session is not only:
            return
        holder, self._holder, self._session = self._holder, None, None
        if self._stop is not None:
            self._stop.set()
        if holder is not None:
            done, _ = await asyncio.wait({holder}, timeout=10)
            if not done:
                holder.cancel()
                await asyncio.gather(holder, return_exceptions=True)

    def reset_sync(self, broken: ClientSession | None) -> None:
        loop = self._loop
        if loop is not None and broken is not None:
            asyncio.run_coroutine_threadsafe(self._end_holder(broken), loop).result(30)

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._end_holder(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        self._opening = None  # bound to that loop; a later use starts a new one


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The connection thread: run ``loop`` until :meth:`_OwnedConnection.close` stops it."""
    try:
        loop.run_forever()
    finally:
        loop.close()


def _on_thread(loop: asyncio.AbstractEventLoop) -> bool:
    """Is ``loop`` the loop running in this thread?"""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class _GivenSession(_Connection):
    """A session the application opened: called on its own event loop, never reopened."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session
        self.loop: asyncio.AbstractEventLoop | None = None
        with contextlib.suppress(RuntimeError):
            self.loop = asyncio.get_running_loop()

    async def run(self, use: Callable[[ClientSession], Awaitable[T]], timeout: float) -> T:
        running = asyncio.get_running_loop()
        if self.loop is None or self.loop.is_closed():
            self.loop = running
        if self.loop is running:
            return await _guarded(self.session, use, timeout)
        future = asyncio.run_coroutine_threadsafe(_guarded(self.session, use, timeout), self.loop)
        return await asyncio.wrap_future(future)

    def run_sync(self, use: Callable[[ClientSession], Awaitable[T]], timeout: float) -> T:
        loop = self.loop
        if loop is None or not loop.is_running() or _on_thread(loop):
            raise AsyncOnlyToolError(
                "this MCP ClientSession belongs to an event loop that sync code here cannot "
                "wait on: use the registry's async methods (call_all_async, "
                "Model.create_async) from that loop, or give from_mcp server parameters"
            )
        future = asyncio.run_coroutine_threadsafe(_guarded(self.session, use, timeout), loop)
        return future.result(timeout + 5)


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
            return await server.call_tool(self.mcp_name, arguments, idempotent=self.idempotent)

        self._init_step(call_mcp_tool, options)

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

    def __init__(
        self,
        source: McpSource,
        *,
        server_name: str | None = None,
        tool_options: dict[str, ToolOptions] | None = None,
        errlog: TextIO | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        reconnects: int = 2,
        **options: Unpack[ToolOptions],
    ) -> None:
        unknown = sorted(set(options) - ToolOptions.__optional_keys__)
        if unknown:
            raise TypeError(f"MCP server options: unknown {unknown}; see ToolOptions")
        if "name" in options or "description" in options:
            raise TypeError("name= and description= are per tool: pass them in tool_options")
        self.name = server_name or default_name(source)
        self.defaults = options
        self.tool_options = dict(tool_options or {})
        self.request_timeout = request_timeout
        self.reconnects = reconnects
        self._connection: _Connection = (
            _GivenSession(source)
            if isinstance(source, ClientSession)
            else _OwnedConnection(transport_for(source, errlog), connect_timeout)
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

        self._list_step = engine_step(name=step_name)(list_mcp_tools)
        self._list_step_async = engine_step(name=step_name)(list_mcp_tools_async)

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
                if tries_left == 0 or not self._connection.reconnectable():
                    raise
                self._connection.reset_sync(broken.session)
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
                if (
                    tries_left == 0
                    or not self._connection.reconnectable()
                    or (broken.sent and not resend)
                ):
                    raise
                await asyncio.to_thread(self._connection.reset_sync, broken.session)
        raise AssertionError("unreachable")  # pragma: no cover

    async def call_tool(
        self, name: str, arguments: dict[str, Any], *, idempotent: bool
    ) -> mcp_types.CallToolResult:
        """The server's result for one call, or an ``isError`` result saying why there is
        none (never an exception for a server that died, hung or refused)."""
        timeout = self._call_timeout(name)

        async def call(session: ClientSession) -> mcp_types.CallToolResult:
            if not idempotent:  # a connection found dead now is reopened before sending
                try:
                    await asyncio.wait_for(session.send_ping(), min(timeout, PING_TIMEOUT))
                except Exception as exc:
                    if _closed(exc) or isinstance(exc, TimeoutError):
                        raise McpConnectionError.of(exc, session, sent=False) from exc
                    raise
            return await session.call_tool(name, arguments)

        try:
            return await self._with_reconnects(call, timeout, resend=idempotent)
        except McpConnectionError as broken:
            unknown = " (it may or may not have run)" if broken.sent else ""
            return error_result(
                f"MCP server {self.name!r} failed during {name!r}{unknown}: {broken}"
            )
        except TimeoutError:
            return error_result(f"MCP tool {name!r} did not answer within {timeout:g}s")
        except MCPError as refused:
            said = self._connection.scrub(refused.message)
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
            options: ToolOptions = {**self.defaults, **self.tool_options.get(listed.name, {})}
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
