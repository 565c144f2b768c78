"""Plans: durable waits written once, for sync and async workflows alike.

A wait (sleep, recv, get_event, a send, a workflow's result) is a generator that
yields :class:`Io` (a blocking database call), :class:`Wait` (block on a waiter) and
:class:`Await` (a run of this process) requests.
:func:`run_plan` performs them in the calling thread; :func:`run_plan_async`
runs the calls in a worker thread and waits on the event loop, so an ``async``
workflow waiting for hours holds no thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from ...errors import DatabaseUnavailableError
from .context import StopReason, current_context, in_step
from .executors import refuse_blocking_wait
from .notifications import Waiter

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Io:
    """A blocking call for the driver to make (a database round trip)."""

    call: Callable[[], Any]


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait on ``waiter`` (or just sleep, when None) for at most ``seconds``."""

    waiter: Waiter | None
    seconds: float


@dataclass(frozen=True, slots=True)
class Await:
    """Wait for ``future`` (a run of this process) for at most ``seconds`` (None: no
    limit); the reply is its result, or TimeoutError."""

    future: Future[Any]
    seconds: float | None


Plan: TypeAlias = Generator[Io | Wait | Await, Any, T]


def _noted(exc: BaseException) -> BaseException:
    """A database failure under a workflow's own wait or message ends its run unfinished,
    even if user code catches it (see WorkflowContext.noting_database_failures)."""
    if isinstance(exc, DatabaseUnavailableError):
        ctx = current_context()
        if ctx is not None and not in_step():
            return ctx.halt(StopReason.DATABASE, exc)
    return exc


def _replay_stops(request: Wait | Await) -> BaseException | None:
    """In a replay check a wait that would block is where the live run would wait for
    something new: the check stops there (the code fits the log up to here)."""
    if isinstance(request, Await) and request.future.done():
        return None
    ctx = current_context()
    if ctx is not None and ctx.engine.replay_only and not in_step():
        return ctx.stop_past_log()
    return None


def run_plan(plan: Plan[T], *, blocking: bool = False) -> T:
    """Drive a plan in this thread: calls are made here, waits block here (refused on a
    shared event loop's thread unless the caller accepts ``blocking`` it, as a sync step
    that the user put in an async workflow does)."""
    reply: Any = None
    failure: BaseException | None = None
    try:
        while True:
            try:
                request = plan.throw(failure) if failure is not None else plan.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            reply, failure = None, None
            try:
                if isinstance(request, Io):
                    reply = request.call()
                    continue
                stop = _replay_stops(request)
                if stop is not None:
                    raise stop
                if not blocking:
                    refuse_blocking_wait("a sync durable wait (sleep, recv, get_event, result)")
                if isinstance(request, Await):
                    reply = request.future.result(request.seconds)
                elif request.waiter is None:
                    time.sleep(max(0.0, request.seconds))
                else:
                    request.waiter.wait(request.seconds)
            except BaseException as exc:  # handed to the plan, which may clean up
                failure = _noted(exc)
    finally:
        plan.close()


async def run_plan_async(plan: Plan[T]) -> T:
    """Drive a plan on the event loop: calls run in a worker thread, waits do not block."""
    reply: Any = None
    failure: BaseException | None = None
    try:
        while True:
            try:
                request = plan.throw(failure) if failure is not None else plan.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            reply, failure = None, None
            try:
                if isinstance(request, Io):
                    reply = await asyncio.to_thread(request.call)
                elif (stop := _replay_stops(request)) is not None:
                    raise stop
                elif isinstance(request, Await):
                    reply = await asyncio.wait_for(
                        asyncio.shield(asyncio.wrap_future(request.future)), request.seconds
                    )
                elif request.waiter is None:
                    await asyncio.sleep(max(0.0, request.seconds))
                else:
                    await request.waiter.wait_async(request.seconds)
            except BaseException as exc:  # handed to the plan, which may clean up
                failure = _noted(exc)
    finally:
        plan.close()
