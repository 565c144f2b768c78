"""``@durable_workflow`` and the calls that start workflows."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any, ParamSpec, TypeVar, overload

from .._limits import check_delay
from ..errors import DbosAgentError, WorkflowInterruptedError
from ..records import StepInfo, WorkflowInfo, WorkflowStatus
from .children import workflow_id_for_start, workflow_id_for_start_async
from .handle import WorkflowHandle
from .runtime.admission import admit
from .runtime.context import OwnershipLost
from .runtime.context import current_workflow_id as current_workflow_id
from .runtime.context import workflow_id as workflow_id
from .runtime.context import workflow_timeout as workflow_timeout
from .runtime.core import Engine
from .runtime.current import current_engine
from .runtime.registry import WorkflowDefinition, register_workflow

P = ParamSpec("P")
R = TypeVar("R")


def definition_of(fn: Callable[..., Any]) -> WorkflowDefinition:
    """The definition behind a ``@durable_workflow`` function."""
    definition = getattr(fn, "__dbos_agent_workflow__", None)
    if not isinstance(definition, WorkflowDefinition):
        raise DbosAgentError(f"{fn!r} is not a @durable_workflow function")
    return definition


@overload
def durable_workflow(fn: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def durable_workflow(
    *, name: str | None = None, max_recovery_attempts: int = 50
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def durable_workflow(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    max_recovery_attempts: int = 50,
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a function a durable workflow: recorded before it runs, resumable after a crash.

    Calling it runs it now under a fresh id (or the one set by
    :func:`workflow_id`); its steps are checkpointed as they complete. A
    workflow recovered more than ``max_recovery_attempts`` times is moved to
    ``MAX_RECOVERY_ATTEMPTS_EXCEEDED`` instead of crash-looping the process.
    """

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        definition = register_workflow(func, name, max_recovery_attempts)
        wrapper: Any
        if definition.is_async:

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                engine = current_engine()
                wid, recorded = await workflow_id_for_start_async()
                return await call_here_async(engine, definition, wid, args, kwargs, recorded)

            wrapper = async_wrapper
        else:

            @functools.wraps(func)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                engine = current_engine()
                wid, recorded = workflow_id_for_start()
                return call_here(engine, definition, wid, args, kwargs, recorded)

            wrapper = sync_wrapper
        wrapper.__dbos_agent_workflow__ = definition
        return wrapper  # type: ignore[no-any-return]

    return decorate(fn) if fn is not None else decorate


#: A direct call of a workflow another session runs looks again this often whether
#: that session died (and the caller should take the workflow over).
_READMIT_EVERY_S = 1.0


def call_here(
    engine: Engine,
    definition: WorkflowDefinition,
    workflow_id: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    recorded_start: bool = False,
) -> Any:
    """A direct call of a sync workflow: run it here, now, durably."""
    admission = admit(engine, definition, workflow_id, args, kwargs, recorded_start=recorded_start)
    while admission.remote:  # another session runs it: wait, or take it once it died
        try:
            return engine.wait_for_outcome(workflow_id, _READMIT_EVERY_S, direct=True).unwrap()
        except TimeoutError:
            admission = admit(
                engine, definition, workflow_id, args, kwargs, recorded_start=recorded_start
            )
    if admission.run is not None:
        outcome = engine.execute(admission.run)
    else:
        future = admission.future()
        assert future is not None
        outcome = future.result()
    if isinstance(outcome.error, (OwnershipLost, WorkflowInterruptedError)):
        outcome = engine.wait_for_outcome(workflow_id, direct=True)
    return outcome.unwrap()


async def call_here_async(
    engine: Engine,
    definition: WorkflowDefinition,
    workflow_id: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    recorded_start: bool = False,
) -> Any:
    """A direct call of an async workflow: run it on this event loop, durably."""
    readmit = functools.partial(
        admit, engine, definition, workflow_id, args, kwargs, recorded_start=recorded_start
    )
    admission = await asyncio.to_thread(readmit)
    while admission.remote:  # another session runs it: wait, or take it once it died
        try:
            found = await asyncio.to_thread(
                engine.wait_for_outcome, workflow_id, _READMIT_EVERY_S, direct=True
            )
            return found.unwrap()
        except TimeoutError:
            admission = await asyncio.to_thread(readmit)
    future = admission.future()
    if admission.run is not None:
        outcome = await engine.execute_async(admission.run)
    else:
        assert future is not None
        outcome = await asyncio.wrap_future(future)
    if isinstance(outcome.error, (OwnershipLost, WorkflowInterruptedError)):
        outcome = await asyncio.to_thread(engine.wait_for_outcome, workflow_id, direct=True)
    return outcome.unwrap()


@overload
def start(
    fn: Callable[P, Coroutine[Any, Any, R]],
    /,
    *args: Any,
    workflow_id: str | None = None,
    delay: float | None = None,
    **kwargs: Any,
) -> WorkflowHandle[R]: ...


@overload
def start(
    fn: Callable[P, R],
    /,
    *args: Any,
    workflow_id: str | None = None,
    delay: float | None = None,
    **kwargs: Any,
) -> WorkflowHandle[R]: ...


def start(
    fn: Callable[..., Any],
    /,
    *args: Any,
    workflow_id: str | None = None,
    delay: float | None = None,
    **kwargs: Any,
) -> WorkflowHandle[Any]:
    """Start a workflow in the background and return its handle.

    The workflow is durably recorded before this returns, so a crash right
    after still recovers it. An id that exists returns a handle on that
    workflow without running it twice. With ``delay`` (seconds) it starts that
    long from now (database clock): it waits SUSPENDED on a timer, holding no
    thread, and any process that can run it starts it when it is due, even if
    this one has exited.
    """
    definition = definition_of(fn)
    engine = current_engine()
    wid, recorded = workflow_id_for_start(workflow_id)
    admission = admit(
        engine, definition, wid, args, kwargs, delay=check_delay(delay), recorded_start=recorded
    )
    future = engine.submit(admission.run) if admission.run is not None else admission.future()
    return WorkflowHandle(engine, wid, future)


def list_workflows(
    status: WorkflowStatus | str | None = None,
    name: str | None = None,
    limit: int = 100,
    *,
    executor_id: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    queue_name: str | None = None,
    partition_key: str | None = None,
    load_input: bool = True,
    load_output: bool = True,
) -> list[WorkflowInfo]:
    """Stored workflows matching every given filter, newest first; without
    ``load_input``/``load_output`` their inputs/output are None, unread (DBOS's options)."""
    if status is not None:
        status = WorkflowStatus(status)
    return current_engine().db.workflows.list(
        load_input=load_input,
        load_output=load_output,
        status=status,
        name=name,
        executor_id=executor_id,
        created_after=created_after,
        created_before=created_before,
        limit=limit,
        queue_name=queue_name,
        partition_key=partition_key,
    )


def list_steps(workflow_id: str) -> list[StepInfo]:
    """The recorded steps of a workflow, in order (empty for an unknown id)."""
    return current_engine().db.steps.list(workflow_id)
