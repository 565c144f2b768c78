"""A durable wait with a deadline (recv and get_event with a timeout): the deadline is
recorded as its step's intent before the first wait, so a crash does not restart the
timeout, and a background run suspends instead of waiting long in memory. The database
clock and what ends a wait (a shutdown, a cancel) are in clock.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from ..._storage.rows import StepRow, StepWrite
from ..._storage.suspension import WaitCondition
from ...records import StepStatus, WorkflowStatus
from .checkpoints import adopt_recorded, checkpoint
from .clock import clock, database_now, wait_end, wait_once
from .context import WorkflowContext
from .notifications import Waiter
from .outcome import Outcome
from .plans import Io, Plan
from .registry import StepDefinition
from .suspension import suspend_if_long


def continue_or_adopt(
    ctx: WorkflowContext, step: StepDefinition, seq: int, write: StepWrite
) -> Outcome | None:
    """After a write that did not happen: None to keep waiting at our own position, or
    what another run recorded there (raising if the workflow is no longer ours to run)."""
    existing = write.existing
    ours = existing is None or (
        existing.status is StepStatus.PENDING and existing.name == step.name
    )
    if ours and write.owned and write.workflow_status is WorkflowStatus.PENDING:
        return None
    if ours:  # our own intent, but the workflow was cancelled, finished or taken over
        write = dataclasses.replace(write, existing=None)
    return adopt_recorded(ctx, step, seq, write)


def durable_wait(
    ctx: WorkflowContext,
    step: StepDefinition,
    seq: int,
    row: StepRow | None,
    inputs: dict[str, Any],
    timeout: float | None,
    waiter: Waiter,
    attempt: Callable[[], Plan[Outcome | None]],
    condition: WaitCondition,
) -> Plan[Outcome]:
    """Run ``attempt`` until it records step ``seq`` or the durable deadline passes.

    ``attempt`` records the step itself when it finds what it waits for. The
    deadline (database clock) is written as the step's intent before the first
    wait, or read back from it when ``row`` is that intent after a crash; on
    timeout the step records None. A background run suspends on ``condition`` (with
    the deadline as its wake-up time) instead of waiting long in memory.
    """
    db = ctx.engine.db
    started_at = datetime.now(UTC)
    resumed = row is not None  # our own intent: the wait began before a crash
    deadline: float | None = None
    if row is not None:
        text = row.inputs
        if text is None:  # a log read without inputs
            text = yield Io(partial(db.steps.inputs, ctx.workflow_id, seq))
        deadline = json.loads(text or "{}").get("deadline")
    found = yield from attempt()
    if found is not None:
        return found
    if resumed or timeout is None or timeout > 0:
        now, offset = yield from database_now(db)
        if not resumed:
            deadline = None if timeout is None else now + timeout
            write = yield Io(
                partial(
                    db.steps.record_intent,
                    workflow_id=ctx.workflow_id,
                    seq=seq,
                    name=step.name,
                    inputs=json.dumps({**inputs, "deadline": deadline}),
                    owner_key=ctx.engine.session_key,
                )
            )
            other = None if write.written else continue_or_adopt(ctx, step, seq, write)
            if other is not None:
                return other
        end = math.inf if deadline is None else wait_end(deadline - now, offset)
        with ctx.waiting():
            condition = dataclasses.replace(condition, wake_at=deadline)
            yield from suspend_if_long(ctx, condition, end - clock(db))
            while (left := end - clock(db)) > 0:
                yield from wait_once(ctx.engine, waiter, left, ctx)
                found = yield from attempt()
                if found is not None:
                    return found
    done: Outcome = yield Io(
        partial(checkpoint, ctx, step, seq, Outcome(None), 1, started_at)  # timed out
    )
    return done
