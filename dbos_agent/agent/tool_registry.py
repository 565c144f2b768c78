"""Dispatching the model's ``tool_use`` blocks to tools, one log position per block.

Whatever goes wrong with a call (unknown tool, input that fails validation, the tool
raising, a result too large to record) is recorded in the step log as that position's
error and handed back to the model as an ``is_error`` tool result, so the agent can correct
itself instead of crashing; on replay the recorded error yields the same result again.

Several blocks of one reply may run concurrently (in threads with ``call_all(parallel=True)``,
as tasks with ``call_all_async``), yet each takes the log position its place in the reply
gives it: the registry reserves one position per block before any starts, so replay never
depends on which tool started or finished first.

Tools of MCP servers (:meth:`ToolRegistry.from_mcp`, :meth:`ToolRegistry.add_mcp`, see
``mcp.py``) are known once the run has listed them: every method that needs the tools
(:meth:`ToolRegistry.params`, the calls) lists them first, as a step, once per run.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol, Unpack

from anthropic.types import ToolParam, ToolResultBlockParam

from .._engine.approvals import Approval, request_approval, request_approval_async
from .._engine.extending import at_position, reserve_positions
from .._engine.step import step as engine_step
from ..errors import (
    CheckpointTooLargeError,
    DbosAgentError,
    ToolCallRejected,
    ToolErrorResult,
    ToolInputError,
)
from .replay import note_step
from .tool_options import McpOptions
from .tools import Tool

if TYPE_CHECKING:
    from .mcp import McpServer, McpSource

__all__ = ["ToolRegistry", "ToolUse"]

#: The step recorded for a call the registry refused before any tool ran.
REJECTED_STEP_NAME = "tool_call_rejected"


class ToolUse(Protocol):
    """What the registry needs of a ``tool_use`` block (``anthropic.types.ToolUseBlock``)."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def input(self) -> object: ...


@engine_step(name=REJECTED_STEP_NAME)
def _reject(tool: str, reason: str) -> None:
    """Record a refused call in the log like any other outcome (as its error)."""
    raise ToolInputError(reason)


def _check(approval: Approval) -> None:
    if not approval.approved:
        raise ToolCallRejected(
            "a human rejected this call" + (f": {approval.reason}" if approval.reason else "")
        )


def error_text(error: BaseException) -> str:
    """How a failed call is described to the model."""
    if isinstance(error, ToolInputError | ToolCallRejected | ToolErrorResult):
        return str(error)
    if isinstance(error, CheckpointTooLargeError):
        return too_large_text(error)
    return f"{type(error).__name__}: {error}"


def too_large_text(error: CheckpointTooLargeError) -> str:
    """What the model reads of a result too large to record: its size and the limit, and
    what to do (its caller's workflow goes on: it is the model's to handle)."""
    return (
        f"the tool's result was {error.size / 2**20:.1f} MiB of JSON, over the "
        f"{error.limit / 2**20:.1f} MiB a recorded result may be: it was not kept. Ask for "
        "a smaller part of it (a range, a filter, a summary)."
    )


def result_block(block: ToolUse, content: str | BaseException) -> ToolResultBlockParam:
    """The ``tool_result`` of a call: its text, or its failure as ``is_error``."""
    if isinstance(content, BaseException):
        return {
            "type": "tool_result",
            "tool_use_id": block.id,
            "content": error_text(content),
            "is_error": True,
        }
    return {"type": "tool_result", "tool_use_id": block.id, "content": content}


def tool_uses(content: Iterable[Any]) -> list[ToolUse]:
    """The ``tool_use`` blocks of a reply's content, in reply order."""
    return [block for block in content if getattr(block, "type", None) == "tool_use"]


class ToolRegistry:
    """The tools an agent may call, by name: functions, and the tools of MCP servers."""

    def __init__(self, tools: Iterable[Tool[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool[..., Any]] = {}
        self._servers: list[McpServer] = []
        for item in tools:
            self.add(item)

    @classmethod
    def from_mcp(cls, source: McpSource, **options: Unpack[McpOptions]) -> ToolRegistry:
        """A registry of one MCP server's tools (see :meth:`add_mcp`)."""
        registry = cls()
        registry.add_mcp(source, **options)
        return registry

    def add_mcp(self, source: McpSource, **options: Unpack[McpOptions]) -> McpServer:
        """Add the tools of an MCP server (needs the ``mcp`` extra).

        ``source``: ``StdioServerParameters`` or ``[command, *args]`` (the server is started
        on first use and stopped by :meth:`aclose`), an ``http(s)://`` URL or
        ``McpHttpServer(url, headers=...)`` (a running server, over Streamable HTTP; the
        URL's credentials and the headers' values are never shown or recorded), or an open
        ``mcp.ClientSession``. The ``options`` are :class:`McpOptions`: every option of
        ``@da.step`` and ``requires_approval`` for every tool of the server,
        ``tool_options`` (an MCP tool's name to its own :class:`ToolOptions`; ``name``
        renames it for the model), and how to reach the server: ``server_name`` (names the
        listing step ``mcp:list_tools:<server_name>``; default: the server script's name,
        or the URL's last path part or host), ``errlog`` (where the server's stderr goes),
        ``connect_timeout`` and ``request_timeout`` (seconds; default 30 and 300), and
        ``reconnects`` (how often a broken connection is reopened per request, default 2).
        """
        from .mcp import McpServer

        server = McpServer(source, **options)
        if any(known.name == server.name for known in self._servers):
            raise ValueError(f"an MCP server named {server.name!r} is already registered")
        self._servers.append(server)
        return server

    def list_tools(self) -> list[Tool[..., Any]]:
        """Every tool, the MCP servers' listed first if this run has not yet (a step each)."""
        return self._merged([server.list_tools() for server in self._servers])

    async def list_tools_async(self) -> list[Tool[..., Any]]:
        """:meth:`list_tools` for async code (``Model.create_async`` calls it)."""
        return self._merged([await server.list_tools_async() for server in self._servers])

    def _merged(self, listings: Iterable[Iterable[Tool[..., Any]]]) -> list[Tool[..., Any]]:
        merged = dict(self._tools)
        for listing in listings:
            for item in listing:
                if item.name in merged:
                    raise ValueError(
                        f"two tools are named {item.name!r}: rename one with "
                        f"tool_options={{{getattr(item, 'mcp_name', item.name)!r}: "
                        "{'name': ...}}"
                    )
                merged[item.name] = item
        return list(merged.values())

    def _listed(self) -> dict[str, Tool[..., Any]]:
        """The function tools and the MCP tools this run has listed, by name."""
        known = dict(self._tools)
        for server in self._servers:
            known.update((item.name, item) for item in server.listed() or ())
        return known

    def close(self) -> None:
        """Stop the MCP servers this registry started."""
        for server in self._servers:
            server.close()

    async def aclose(self) -> None:
        """:meth:`close` for async code."""
        for server in self._servers:
            await server.aclose()

    def add(self, item: Tool[..., Any]) -> None:
        """Register a tool; names are unique."""
        if item.name in self._tools:
            raise ValueError(f"a tool named {item.name!r} is already registered")
        self._tools[item.name] = item

    def __contains__(self, name: object) -> bool:
        return name in self._listed()

    def __iter__(self) -> Iterator[Tool[..., Any]]:
        """The function tools and the MCP tools this run has listed."""
        return iter(self._listed().values())

    def __len__(self) -> int:
        return len(self._listed())

    def get(self, name: str) -> Tool[..., Any] | None:
        return self._listed().get(name)

    def params(self) -> list[ToolParam]:
        """Definitions for the Messages API ``tools`` list (listing MCP tools if needed)."""
        return [item.param() for item in self.list_tools()]

    def _resolve(self, block: ToolUse) -> tuple[Tool[..., Any], dict[str, Any]] | str:
        """The tool and its arguments for ``block``, or why the call is refused."""
        note_step()
        tools = self._listed()
        item = tools.get(block.name)
        if item is None:
            known = ", ".join(sorted(tools)) or "none"
            return f"unknown tool {block.name!r}; available tools: {known}"
        try:
            return item, item.validate(block.input)
        except ToolInputError as exc:
            return str(exc)

    def _needs_approval(self, block: ToolUse) -> bool:
        item = self._listed().get(block.name)
        return item is not None and item.requires_approval

    def approve_first(self, uses: list[ToolUse]) -> dict[str, Approval]:
        """Ask (in reply order, one after the other) for the approvals the calls need,
        before any of them runs concurrently at its reserved position."""
        return {b.id: request_approval(b.name, b.input) for b in uses if self._needs_approval(b)}

    async def approve_first_async(self, uses: list[ToolUse]) -> dict[str, Approval]:
        """:meth:`approve_first` for async code."""
        return {
            b.id: await request_approval_async(b.name, b.input)
            for b in uses
            if self._needs_approval(b)
        }

    def run(self, block: ToolUse, approval: Approval | None = None) -> str:
        """Run one call as one step and return its text; raises what the call raised.

        A tool that requires approval asks for it first (unless ``approval`` is given)
        and raises :class:`ToolCallRejected` when a human said no. An ``async def`` tool
        runs to its end on an event loop of its own (use :meth:`run_async` from async code).
        """
        self.list_tools()
        resolved = self._resolve(block)
        if isinstance(resolved, str):
            _reject(block.name, resolved)
            raise AssertionError("unreachable")  # pragma: no cover
        item, kwargs = resolved
        if item.requires_approval:
            _check(approval or request_approval(block.name, block.input))
        value = asyncio.run(item(**kwargs)) if item.is_async else item(**kwargs)
        return item.render(value)

    async def run_async(self, block: ToolUse, approval: Approval | None = None) -> str:
        """:meth:`run` on the event loop: an async tool is awaited, a sync one (and the
        log write of a refused call) runs in a worker thread."""
        await self.list_tools_async()
        resolved = self._resolve(block)
        if isinstance(resolved, str):
            await asyncio.to_thread(_reject, block.name, resolved)
            raise AssertionError("unreachable")  # pragma: no cover
        item, kwargs = resolved
        if item.requires_approval:
            _check(approval or await request_approval_async(block.name, block.input))
        if item.is_async:
            return item.render(await item(**kwargs))
        return item.render(await asyncio.to_thread(item, **kwargs))

    def call(self, block: ToolUse, approval: Approval | None = None) -> ToolResultBlockParam:
        """Run one ``tool_use`` block and return its ``tool_result`` (``is_error`` on failure).

        Engine signals (divergence, cancellation, an in-doubt step) are not tool failures
        and propagate.
        """
        try:
            return result_block(block, self.run(block, approval))
        except CheckpointTooLargeError as too_large:  # recorded as the step's error
            return result_block(block, too_large)
        except DbosAgentError:
            raise
        except Exception as exc:
            return result_block(block, exc)

    async def call_async(
        self, block: ToolUse, approval: Approval | None = None
    ) -> ToolResultBlockParam:
        """:meth:`call` for async code (see :meth:`run_async`)."""
        try:
            return result_block(block, await self.run_async(block, approval))
        except CheckpointTooLargeError as too_large:  # recorded as the step's error
            return result_block(block, too_large)
        except DbosAgentError:
            raise
        except Exception as exc:
            return result_block(block, exc)

    def call_all(
        self, content: Iterable[Any], *, parallel: bool = False, max_workers: int = 8
    ) -> list[ToolResultBlockParam]:
        """Run every ``tool_use`` block of a reply's content; results in reply order.

        With ``parallel=True`` the calls run in threads (context copied), each at the
        log position reserved for its place in the reply.
        """
        uses = tool_uses(content)
        self.list_tools()  # before positions are reserved: the listing takes its own
        if not parallel or len(uses) < 2:
            return [self.call(block) for block in uses]
        approvals = self.approve_first(uses)
        positions = reserve_positions(len(uses))

        def call_at(index: int) -> ToolResultBlockParam:
            with at_position(positions[index]):
                return self.call(uses[index], approvals.get(uses[index].id))

        with ThreadPoolExecutor(max_workers=min(max_workers, len(uses))) as pool:
            futures = [
                pool.submit(contextvars.copy_context().run, call_at, i) for i in range(len(uses))
            ]
            return [future.result() for future in futures]

    async def call_all_async(self, content: Iterable[Any]) -> list[ToolResultBlockParam]:
        """Run every ``tool_use`` block of a reply concurrently, as tasks; results in reply
        order, each call at the log position reserved for its place in the reply (replay
        does not depend on which finished first). If a call raises an engine signal the
        others are cancelled and it propagates."""
        uses = tool_uses(content)
        await self.list_tools_async()  # before positions are reserved: it takes its own
        approvals = await self.approve_first_async(uses)
        positions = reserve_positions(len(uses))

        async def call_at(index: int) -> ToolResultBlockParam:
            with at_position(positions[index]):
                return await self.call_async(uses[index], approvals.get(uses[index].id))

        tasks = [asyncio.ensure_future(call_at(i)) for i in range(len(uses))]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            raise
