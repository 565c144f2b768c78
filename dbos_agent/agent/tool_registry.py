"""Dispatching the model's ``tool_use`` blocks to tools, one log position per block.

Whatever goes wrong with a call (unknown tool, input that fails validation, the tool
raising) is recorded in the step log as that position's error and handed back to the model
as an ``is_error`` tool result, so the agent can correct itself instead of crashing; on
replay the recorded error yields the same result again.

Several blocks of one reply may run concurrently, yet each takes the log position its
place in the reply gives it: call ``i`` starts only once call ``i - 1`` holds its position
(which is at the start of its step, not its end), so replay never depends on which tool
finished first.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from anthropic.types import ToolParam, ToolResultBlockParam

from ..engine.step import step as engine_step
from ..errors import DbosAgentError
from .replay import note_step
from .tools import Tool, ToolInputError, _position_taken, mark_position_taken

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
    mark_position_taken()
    raise ToolInputError(reason)


def error_text(error: BaseException) -> str:
    """How a failed call is described to the model."""
    if isinstance(error, ToolInputError):
        return str(error)
    return f"{type(error).__name__}: {error}"


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

    def run(self, block: ToolUse) -> str:
        """Run one call as one step and return its text; raises what the call raised."""
        note_step()
        item = self._tools.get(block.name)
        if item is None:
            known = ", ".join(sorted(self._tools)) or "none"
            _reject(block.name, f"unknown tool {block.name!r}; available tools: {known}")
            raise AssertionError("unreachable")  # pragma: no cover
        try:
            kwargs = item.validate(block.input)
        except ToolInputError as exc:
            _reject(block.name, str(exc))
            raise AssertionError("unreachable") from exc  # pragma: no cover
        return Tool.render(item(**kwargs))

    def call(self, block: ToolUse) -> ToolResultBlockParam:
        """Run one ``tool_use`` block and return its ``tool_result`` (``is_error`` on failure).

        Engine signals (divergence, cancellation, an in-doubt step) are not tool failures
        and propagate.
        """
        try:
            content = self.run(block)
        except DbosAgentError:
            raise
        except Exception as exc:
            return {
                "type": "tool_result",
                "tool_use_id": block.id,
                "content": error_text(exc),
                "is_error": True,
            }
        return {"type": "tool_result", "tool_use_id": block.id, "content": content}

    def call_all(
        self, content: Iterable[Any], *, parallel: bool = False, max_workers: int = 8
    ) -> list[ToolResultBlockParam]:
        """Run every ``tool_use`` block of a reply's content; results in reply order.

        With ``parallel=True`` the calls run in threads (context copied), positions still
        fixed by reply order.
        """
        uses: list[ToolUse] = [b for b in content if getattr(b, "type", None) == "tool_use"]
        if not parallel or len(uses) < 2:
            return [self.call(block) for block in uses]
        gates = [threading.Event() for _ in uses]

        def run_in_order(index: int) -> ToolResultBlockParam:
            if index:
                gates[index - 1].wait()
            token = _position_taken.set(gates[index])
            try:
                return self.call(uses[index])
            finally:
                gates[index].set()
                _position_taken.reset(token)

        with ThreadPoolExecutor(max_workers=min(max_workers, len(uses))) as pool:
            futures = [
                pool.submit(contextvars.copy_context().run, run_in_order, i)
                for i in range(len(uses))
            ]
            return [future.result() for future in futures]
