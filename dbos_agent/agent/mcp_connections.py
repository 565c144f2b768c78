"""Connections to MCP servers: opening, holding and reopening a ``ClientSession``, and
what a failure of one means.

A registry's server is reached through a :class:`Connection`: one it opens itself (a
server it starts over stdio, or one it reaches over HTTP, on an event loop thread of its
own, see :class:`OwnedConnection`) or a session the application opened (called on that
session's loop, never reopened). A failure says whether the request may have reached the
server (:class:`McpConnectionError`'s ``sent``): only then is sending it again unsafe.
:func:`is_connection_failure` tells a server that cannot be reached from one that
answered, for code that only sees an exception (the Pydantic AI integration).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from mcp import ClientSession
from mcp import types as mcp_types
from mcp.shared.exceptions import MCPError

from ..errors import AsyncOnlyToolError, McpConnectionError
from .mcp_sources import Transport

T = TypeVar("T")

#: The transport errors of the HTTP libraries an MCP client may be built on, by name (a
#: failure inside them is a server that cannot be reached).
_TRANSPORT_ERROR_NAMES = frozenset({"TransportError", "ConnectError", "ReadError", "WriteError"})


def answer_too_large(error: BaseException) -> bool:
    """Does ``error`` say the server's answer was larger than the client reads (the SDK's
    limit of one server-sent event, see ``McpHttpServer.max_message_bytes``)? It fails the
    same way every time: never a reason to reconnect or to send the request again."""
    return (
        isinstance(error, MCPError)
        and "exceeded the" in error.message
        and "byte limit" in error.message
    )


def is_connection_failure(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it, or a member of its group) says a server could
    not be reached or went away: an OS-level connection or process failure, a timeout, a
    closed stream or session, an HTTP transport error. Not a server's own refusal."""
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if answer_too_large(current):
            return False
        if connection_closed(current) or isinstance(current, TimeoutError):
            return True
        if type(current).__name__ in _TRANSPORT_ERROR_NAMES:
            return True
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False


def connection_closed(exc: BaseException) -> bool:
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


class Connection:
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
        if answer_too_large(exc):  # the session is fine; sending it again would fail again
            raise
        if _session_lost(exc):  # refused before it ran: safe to send on a new session
            raise McpConnectionError.of(exc, session, sent=False) from exc
        if connection_closed(exc):
            raise McpConnectionError.of(exc, session, sent=True) from exc
        raise


class OwnedConnection(Connection):
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
    """The connection thread: run ``loop`` until :meth:`OwnedConnection.close` stops it."""
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


class GivenSession(Connection):
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
