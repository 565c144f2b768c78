"""``da.wait_first(handles)``: the first of several workflows to finish.

Outside a workflow it just waits (polling the database with backoff, as
``handle.result()`` does for a workflow run elsewhere). Inside one the answer is
recorded as a built-in step (``dbos_agent.wait_first``, its output the winner's id),
so a replay returns the same handle even if the others have finished since. The wait
holds the workflow's thread (or task): a suspended workflow waits for one thing only
(see suspension.py), and this waits for any of several.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from .._serialization import codec_for
from ..errors import DbosAgentError
from .handle import WorkflowHandle
from .runtime.checkpoints import builtin_step, checkpoint, recorded
from .runtime.clock import cancel_key, stop_if_interrupted
from .runtime.context import WorkflowContext, current_context, in_step
from .runtime.current import current_engine
from .runtime.notifications import Waiter
from .runtime.outcome import Outcome
from .runtime.plans import Io, Plan, Wait, run_plan, run_plan_async
from .runtime.waiting import POLL_MAX_S, POLL_MIN_S

FIRST_STEP = "dbos_agent.wait_first"
_FIRST = builtin_step(FIRST_STEP, codec_for(str))

H = TypeVar("H", bound=WorkflowHandle[Any])


def _plan(handles: Sequence[H]) -> Plan[H]:
    if not handles:
        raise ValueError("wait_first() needs at least one handle, got none")
    by_id = {handle.workflow_id: handle for handle in handles}
    ids = list(by_id)
    engine = current_engine()
    ctx = current_context()
    if ctx is None or in_step():  # a plain wait
        winner = yield from _poll(engine.db.workflows.first_finished, ids, None, None)
        return by_id[winner]
    seq, row = ctx.begin_step(FIRST_STEP)
    if row is not None:
        known: str = recorded(ctx, _FIRST, seq, row).unwrap()
        if known not in by_id:  # the code now waits on other workflows than it did
            raise DbosAgentError(
                f"workflow {ctx.workflow_id!r} step {seq} ({FIRST_STEP}) recorded that "
                f"{known!r} finished first, but this wait_first() is given {ids!r}"
            )
        return by_id[known]
    started_at = datetime.now(UTC)
    with ctx.waiting(), engine.notifications.waiter(cancel_key(ctx)) as waiter:
        winner = yield from _poll(engine.db.workflows.first_finished, ids, ctx, waiter)
    done = yield Io(partial(checkpoint, ctx, _FIRST, seq, Outcome(winner), 1, started_at))
    chosen: str = done.unwrap()
    return by_id[chosen]


def _poll(
    first_finished: Callable[[list[str]], str | None],
    ids: list[str],
    ctx: WorkflowContext | None,
    waiter: Waiter | None,
) -> Plan[str]:
    """Look until one of ``ids`` has finished. In a workflow a cancel or a shutdown wakes
    ``waiter`` and stops the wait (the workflow stays as a step boundary leaves it)."""
    delay = POLL_MIN_S
    while True:
        winner: str | None = yield Io(partial(first_finished, ids))
        if winner is not None:
            return winner
        yield Wait(waiter, delay)
        if ctx is not None:
            stop_if_interrupted(ctx)
        delay = min(delay * 2, POLL_MAX_S)


def wait_first(handles: Sequence[H]) -> H:
    """The first of ``handles`` whose workflow finishes (succeeds, fails or is cancelled).

    When several have finished, the one that finished first; its ``result()`` then
    returns at once. In a workflow the choice is recorded (a ``dbos_agent.wait_first``
    step), so a replay makes the same choice. An empty list raises ValueError.
    """
    return run_plan(_plan(handles))


async def wait_first_async(handles: Sequence[H]) -> H:
    """:func:`wait_first` for an event loop (polls without blocking it)."""
    return await run_plan_async(_plan(handles))
