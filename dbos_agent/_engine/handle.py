"""WorkflowHandle: a reference to a workflow by id, from this process or another."""

from __future__ import annotations

import math
import time
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from .._limits import check_identifier
from .._storage.suspension import WaitCondition
from ..errors import WorkflowInterruptedError, WorkflowNotFoundError
from ..records import StepInfo, WorkflowInfo, WorkflowStatus
from .runtime.context import OwnershipLost, WorkflowContext, current_context, in_step
from .runtime.core import Engine
from .runtime.current import current_engine
from .runtime.outcome import Outcome
from .runtime.plans import Await, Io, Plan, run_plan, run_plan_async
from .runtime.suspension import suspend_if_long

R = TypeVar("R")


class WorkflowHandle(Generic[R]):
    """Waits for, and inspects, one workflow.

    When this process runs the workflow, :meth:`result` waits on it directly;
    otherwise it polls the database until another process finishes it.
    """

    def __init__(
        self, engine: Engine, workflow_id: str, future: Future[Outcome] | None = None
    ) -> None:
        self._runtime = engine
        self._workflow_id = workflow_id
        self._future = future

    @property
    def workflow_id(self) -> str:
        return self._workflow_id

    def __repr__(self) -> str:
        return f"WorkflowHandle({self._workflow_id!r})"

    def result(self, timeout: float | None = None) -> R:
        """The workflow's return value (typed as annotated), or raise its error.

        Raises ``TimeoutError`` if it has not finished within ``timeout`` seconds. In a
        background run of a workflow (without a timeout), waiting for an unfinished
        workflow suspends the caller until that one finishes (see suspension.py). In an
        async workflow use :meth:`result_async`.
        """
        return run_plan(self._result(timeout))  # type: ignore[no-any-return]

    async def result_async(self, timeout: float | None = None) -> R:
        """:meth:`result` for an event loop: waiting blocks no thread."""
        return await run_plan_async(self._result(timeout))

    def _result(self, timeout: float | None) -> Plan[Any]:
        ctx = current_context()
        if timeout is None and ctx is not None and not in_step() and ctx.may_suspend():
            yield from _suspend_until_finished(ctx, self._workflow_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._future is not None:
            try:
                outcome = yield Await(self._future, timeout)
            except TimeoutError:
                pass  # the run may have committed its outcome and not yet said so: look
            else:
                if not isinstance(outcome.error, (OwnershipLost, WorkflowInterruptedError)):
                    return outcome.unwrap()
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        outcome = yield from self._runtime.outcome_of(self._workflow_id, remaining)
        return outcome.unwrap()

    def get_info(self) -> WorkflowInfo:
        """The stored row of the workflow."""
        info = self._runtime.db.workflows.describe(self._workflow_id)
        if info is None:
            raise WorkflowNotFoundError(self._workflow_id)
        return info

    def status(self) -> WorkflowStatus:
        """The workflow's current status."""
        found = self._runtime.db.workflows.owner(self._workflow_id)
        if found is None:
            raise WorkflowNotFoundError(self._workflow_id)
        return found[0]

    def steps(self) -> list[StepInfo]:
        """The workflow's recorded steps, in order."""
        return self._runtime.db.steps.list(self._workflow_id)


def _suspend_until_finished(ctx: WorkflowContext, workflow_id: str) -> Plan[None]:
    """Suspend the calling workflow until ``workflow_id`` finishes, unless it has."""
    info = yield Io(lambda: ctx.engine.db.workflows.get(workflow_id))
    if info is None or info.status.finished:
        return
    with ctx.waiting():
        yield from suspend_if_long(ctx, WaitCondition("child", target=workflow_id), math.inf)


def retrieve(workflow_id: str) -> WorkflowHandle[Any]:
    """A handle on an existing workflow; raises WorkflowNotFoundError for an unknown id."""
    check_identifier(workflow_id, "workflow id")
    engine = current_engine()
    handle: WorkflowHandle[Any] = WorkflowHandle(
        engine, workflow_id, engine.active_future(workflow_id)
    )
    handle.status()  # it exists
    return handle
