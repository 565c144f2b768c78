"""``da.run_step(fn, *args)``: any function called as a durable step, undecorated.

A library's function, a lambda, a bound method: a workflow body may checkpoint a call of
it where it stands, with the options of ``@da.step`` (:class:`StepOptions`, the one list
of them), instead of wrapping it in a decorated function of its own. The call is the step
a decorated function's call would be: the same position in the log, the same replay, the
same retries. Outside a workflow, or inside a step, it is a plain call, as a ``@da.step``
function's call is there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, Unpack, overload

from .runtime.registry import StepDefinition
from .step import run_async, run_sync
from .step_options import StepOptions, StepSettings

R = TypeVar("R")


def _definition(
    fn: Callable[..., Any], name: str | None, options: Mapping[str, Any]
) -> StepDefinition:
    if not callable(fn):
        raise TypeError(f"run_step: {fn!r} is not callable")
    label = getattr(fn, "__qualname__", None) or type(fn).__name__
    settings = StepSettings.of(options, f"run_step {name or label!r}")
    return settings.define(fn, name, counts_in_code_version=False)


def run_step(
    fn: Callable[..., R],
    /,
    *args: Any,
    name: str | None = None,
    kwargs: Mapping[str, Any] | None = None,
    **options: Unpack[StepOptions],
) -> R:
    """Call ``fn(*args, **kwargs)`` as a durable step of the running workflow.

    The step is named ``name`` (default: ``fn``'s qualified name), which the log records
    at its position as for a ``@da.step`` function; ``options`` are those of ``@da.step``
    (``retries=3``, ``idempotent=False``...), an unknown one is a TypeError naming it.
    ``fn``'s own keyword arguments go in ``kwargs`` (a dict), so that they never collide
    with the step's options. Outside a workflow, or in a step, it is ``fn(*args,
    **kwargs)``. An ``async def`` function is awaited with :func:`dbos_agent.aio.run_step`.
    """
    definition = _definition(fn, name, options)
    if definition.is_async:
        raise TypeError(
            f"run_step: {definition.name!r} is an async function; "
            "`await dbos_agent.aio.run_step(...)` runs it"
        )
    return run_sync(definition, args, dict(kwargs or {}))  # type: ignore[no-any-return]


@overload
async def run_step_async(
    fn: Callable[..., Awaitable[R]],
    /,
    *args: Any,
    name: str | None = None,
    kwargs: Mapping[str, Any] | None = None,
    **options: Unpack[StepOptions],
) -> R: ...
@overload
async def run_step_async(
    fn: Callable[..., R],
    /,
    *args: Any,
    name: str | None = None,
    kwargs: Mapping[str, Any] | None = None,
    **options: Unpack[StepOptions],
) -> R: ...


async def run_step_async(
    fn: Callable[..., Any],
    /,
    *args: Any,
    name: str | None = None,
    kwargs: Mapping[str, Any] | None = None,
    **options: Unpack[StepOptions],
) -> Any:
    """:func:`run_step` for ``async`` workflows: an ``async def`` function is awaited on the
    loop, a plain one runs in a thread (it never holds the loop), either way as a step."""
    definition = _definition(fn, name, options)
    if not definition.is_async:
        definition = dataclasses.replace(definition, fn=_in_thread(fn), is_async=True)
    return await run_async(definition, args, dict(kwargs or {}))


def _in_thread(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """``fn`` run in a worker thread, awaited (the thread gets the caller's context, so
    the step it is part of is known there)."""

    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    return call
