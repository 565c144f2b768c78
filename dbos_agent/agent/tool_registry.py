"""Dispatching the model's ``tool_use`` blocks to tools, one log position per block.

Whatever goes wrong with a call (unknown tool, input that fails validation, the tool
raising) is recorded in the step log as that position's error and handed back to the model
as an ``is_error`` tool result, so the agent can correct itself instead of crashing; on
replay the recorded error yields the same result again.

Several blocks of one reply may run concurrently (in threads with ``call_all(parallel=True)``,
as tasks with ``call_all_async``), yet each takes the log position its place in the reply
gives it: the registry reserves one position per block before any starts, so replay never
depends on which tool started or finished first.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from anthropic.types import ToolParam, ToolResultBlockParam

from ..engine.approvals import Approval, request_approval, request_approval_async
from ..engine.extending import at_position, reserve_positions
from ..engine.step import step as engine_step
from ..errors import DbosAgentError
from .replay import note_step
from .tools import Tool, ToolCallRejected, ToolInputError

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
    if isinstance(error, ToolInputError | ToolCallRejected):
        return str(error)
    return f"{type(error).__name__}: {error}"


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
    """The tools an agent may call, by name."""

    def __init__(self, tools: Iterable[Tool[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool[..., Any]] = {}
        for item in tools:
            self.add(item)

    def add(self, item: Tool[..., Any]) -> None:
        """Register a tool; names are unique."""
        if item.name in self._tools:
            raise ValueError(f"a tool named {item.name!r} is already registered")
        self._tools[item.name] = item

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool[..., Any]]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def get(self, name: str) -> Tool[..., Any] | None:
        return self._tools.get(name)

    def params(self) -> list[ToolParam]:
        """Definitions for the Messages API ``tools`` list."""
        return [item.param() for item in self._tools.values()]

    def _resolve(self, block: ToolUse) -> tuple[Tool[..., Any], dict[str, Any]] | str:
        """The tool and its arguments for ``block``, or why the call is refused."""
        note_step()
        item = self._tools.get(block.name)
        if item is None:
            known = ", ".join(sorted(self._tools)) or "none"
            return f"unknown tool {block.name!r}; available tools: {known}"
        try:
            return item, item.validate(block.input)
        except ToolInputError as exc:
            return str(exc)

    def _needs_approval(self, block: ToolUse) -> bool:
        item = self._tools.get(block.name)
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
        resolved = self._resolve(block)
        if isinstance(resolved, str):
            _reject(block.name, resolved)
            raise AssertionError("unreachable")  # pragma: no cover
        item, kwargs = resolved
        if item.requires_approval:
            _check(approval or request_approval(block.name, block.input))
        value = asyncio.run(item(**kwargs)) if item.is_async else item(**kwargs)
        return Tool.render(value)

    async def run_async(self, block: ToolUse, approval: Approval | None = None) -> str:
        """:meth:`run` on the event loop: an async tool is awaited, a sync one (and the
        log write of a refused call) runs in a worker thread."""
        resolved = self._resolve(block)
        if isinstance(resolved, str):
            await asyncio.to_thread(_reject, block.name, resolved)
            raise AssertionError("unreachable")  # pragma: no cover
        item, kwargs = resolved
        if item.requires_approval:
            _check(approval or await request_approval_async(block.name, block.input))
        if item.is_async:
            return Tool.render(await item(**kwargs))
        return Tool.render(await asyncio.to_thread(item, **kwargs))

    def call(self, block: ToolUse, approval: Approval | None = None) -> ToolResultBlockParam:
        """Run one ``tool_use`` block and return its ``tool_result`` (``is_error`` on failure).

        Engine signals (divergence, cancellation, an in-doubt step) are not tool failures
        and propagate.
        """
        try:
            return result_block(block, self.run(block, approval))
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
