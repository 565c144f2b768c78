"""Waiting on the database clock: what every durable wait of a run builds on.

Times of durable waits (a sleep's wake-up, a recv's deadline, a retry's next attempt)
are the database's (``dbos_agent.now()``), so that every process agrees on them and a
test moves them with ``advance_clock``; while a run waits, the time left is counted on
the monotonic clock moved by the same offset. A wait ends early at shutdown and on a
cancel (a NOTIFY on the cancel channel).
"""

from __future__ import annotations

import time

from ..._storage.database import SystemDatabase
from ...errors import NotLaunchedError
from .context import RuntimeStopping, WorkflowContext, WorkflowHost
from .notifications import CANCEL_CHANNEL, Waiter
from .plans import Io, Plan, Wait


def clock(db: SystemDatabase) -> float:
    """A monotonic clock that moves with the database clock's offset (tests move it)."""
    return time.monotonic() + db.clock_offset


def database_now(db: SystemDatabase) -> Plan[tuple[float, float]]:
    """The database clock now, and the offset this process's clock had just before it
    was read: an end computed from both stays right if a test moves the clock meanwhile
    (it then errs towards the moved clock)."""
    offset = db.clock_offset
    now: float = yield Io(db.messages.database_time)
    return now, offset


def wait_end(seconds: float, offset: float) -> float:
    """When, on :func:`clock`, ``seconds`` from a reading taken at ``offset`` are over."""
    return time.monotonic() + offset + seconds


def cancel_key(ctx: WorkflowContext) -> tuple[str, str]:
    """The NOTIFY that wakes a waiting workflow when it is cancelled."""
    return (CANCEL_CHANNEL, ctx.workflow_id)


def stop_if_interrupted(ctx: WorkflowContext) -> None:
    """End a wait in a workflow that is shutting down here (it stays PENDING and resumes
    later), that was cancelled, or that must stop for another reason (as at a step
    boundary)."""
    if ctx.engine.notifications.closed:
        raise RuntimeStopping()
    ctx.check_not_stopped()


def wait_once(
    engine: WorkflowHost, waiter: Waiter, seconds: float, ctx: WorkflowContext | None
) -> Plan[None]:
    """Wait up to ``seconds`` (at most one poll interval), then stop if interrupted."""
    yield Wait(waiter, min(seconds, engine.notifications.recheck_interval()))
    if ctx is not None:
        stop_if_interrupted(ctx)
    elif engine.stopping or engine.notifications.closed:
        raise NotLaunchedError("the dbos_agent engine is shutting down")
