"""Waiting for a workflow that another process may be running: poll with backoff.

Written once as a plan (see plans.py): ``handle.result()`` drives it in its thread,
``await handle.result_async()`` on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future

from ..._storage.database import SystemDatabase
from ...errors import WorkflowNotFoundError
from ...records import WorkflowInfo, WorkflowStatus
from .outcome import Outcome, held_error, workflow_outcome
from .plans import Await, Io, Plan, Wait
from .registry import find_workflow

POLL_MIN_S = 0.005
POLL_MAX_S = 0.5


def registered_outcome(info: WorkflowInfo) -> Outcome:
    """A finished workflow's outcome as its row has it, typed through its registered
    function if this process has it."""
    definition = find_workflow(info.name)
    return workflow_outcome(
        info.workflow_id,
        info.status,
        info.output,
        info.error,
        definition.result if definition else None,
    )


def finished_outcome(
    db: SystemDatabase,
    workflow_id: str,
    timeout: float | None,
    local_future: Callable[[], Future[Outcome] | None] = lambda: None,
    *,
    held_is_an_answer: bool = False,
) -> Plan[Outcome]:
    """Poll until the workflow is finished, typed through its registered function if any.

    ``local_future`` is asked on every round: when this process starts running
    the workflow meanwhile, waiting switches to that run. A DIVERGED workflow is not
    finished (code that fits continues it): waiting goes on, unless
    ``held_is_an_answer`` (a direct call, which then gets the divergence). Raises
    TimeoutError.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = POLL_MIN_S
    while True:
        future = local_future()
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if future is not None:
            try:
                outcome: Outcome = yield Await(future, remaining)
            except TimeoutError:
                # The run commits its outcome before it resolves its future: the
                # database may have the answer a moment before the future does.
                info = yield Io(lambda: db.workflows.get(workflow_id))
                if info is None or not info.status.finished:
                    raise TimeoutError(
                        f"workflow {workflow_id!r} did not finish within {timeout}s"
                    ) from None
                return registered_outcome(info)
            return outcome
        info = yield Io(lambda: db.workflows.get(workflow_id))
        if info is None:
            raise WorkflowNotFoundError(workflow_id)
        if held_is_an_answer and info.status is WorkflowStatus.DIVERGED:
            return Outcome(error=held_error(workflow_id, info.diverged))
        if info.status.finished:
            return registered_outcome(info)
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(
                f"workflow {workflow_id!r} did not finish within {timeout}s (status {info.status})"
            )
        pause = delay if deadline is None else min(delay, deadline - time.monotonic())
        yield Wait(None, max(0.0, pause))
        delay = min(delay * 2, POLL_MAX_S)
