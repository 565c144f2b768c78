"""Durable time: ``sleep`` (the deadlines of ``recv``/``get_event``: runtime/deadlines.py).

Times are taken from the **database's clock** (``clock_timestamp()``), never
from the local one: a workflow that sleeps on one machine may be recovered on
another, and every executor agrees with the database on when "now" is.
``sleep`` records its absolute wake-up time (epoch seconds) as the output of a
``dbos_agent.sleep`` step, so after a crash it wakes at the original time.
A waiting ``recv``/``get_event`` keeps its deadline in its step's intent row
(inputs ``{"deadline": epoch seconds}``), so a timeout does not restart
either. While waiting, the remaining time is counted on the monotonic clock.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial

from .._serialization import codec_for
from .._storage.suspension import WaitCondition
from .runtime.checkpoints import builtin_step, checkpoint, recorded
from .runtime.clock import (
    cancel_key,
    clock,
    database_now,
    stop_if_interrupted,
    wait_end,
    wait_once,
)
from .runtime.context import (
    WorkflowContext,
    current_context,
    in_step,
)
from .runtime.outcome import Outcome
from .runtime.plans import Io, Plan, Wait, run_plan, run_plan_async
from .runtime.suspension import suspend_if_long
from .waits import check_seconds

SLEEP_STEP = "dbos_agent.sleep"
_SLEEP = builtin_step(SLEEP_STEP, codec_for(float))


def _pause(ctx: WorkflowContext, seconds: float, wake_at: float, offset: float) -> Plan[None]:
    """Wait ``seconds`` of database clock (until ``wake_at``); shutdown or a cancel end it
    early, and a background run suspends instead of waiting long (suspension.py)."""
    if seconds <= 0:
        return
    db = ctx.engine.db
    end = wait_end(seconds, offset)
    with ctx.waiting(), ctx.engine.notifications.waiter(cancel_key(ctx)) as waiter:
        yield from suspend_if_long(ctx, WaitCondition("sleep", wake_at=wake_at), seconds)
        # a cancel may have come before the waiter could hear it (it is why the workflow
        # did not suspend): look now, and again at every recheck interval
        stop_if_interrupted(ctx)
        while (left := end - clock(db)) > 0:
            yield from wait_once(ctx.engine, waiter, left, ctx)


def _sleep_plan(seconds: float) -> Plan[None]:
    seconds = check_seconds(seconds, "sleep()")
    ctx = current_context()
    if ctx is None or in_step():
        yield Wait(None, seconds)
        return
    seq, row = ctx.begin_step(SLEEP_STEP)
    db = ctx.engine.db
    now, offset = yield from database_now(db)
    if row is None:
        started_at = datetime.now(UTC)
        done = yield Io(
            partial(checkpoint, ctx, _SLEEP, seq, Outcome(now + seconds), 1, started_at)
        )
        wake_at: float = done.unwrap()
    else:
        wake_at = recorded(ctx, _SLEEP, seq, row).unwrap()
    yield from _pause(ctx, wake_at - now, wake_at, offset)


def sleep(seconds: float) -> None:
    """Sleep durably: the wake-up time is recorded, so a crash does not restart the wait.

    In a workflow this is a step (``dbos_agent.sleep``) whose output is the
    absolute wake-up time on the database's clock; after recovery the workflow
    wakes at that time (at once if it has passed). Outside a workflow, or in a
    step, it is ``time.sleep``. A shutdown ends the wait; the workflow stays PENDING.
    """
    run_plan(_sleep_plan(seconds))


async def sleep_async(seconds: float) -> None:
    """:func:`sleep` for ``async`` workflows (waits on the event loop)."""
    await run_plan_async(_sleep_plan(seconds))
