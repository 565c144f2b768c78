"""``@durable_workflow`` and the calls that start workflows."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any, ParamSpec, TypeVar, overload

from ..errors import DbosAgentError
from ..records import StepInfo, WorkflowInfo, WorkflowStatus
from .context import current_context, in_step, take_workflow_id
from .handle import WorkflowHandle
from .registry import WorkflowDefinition, register_workflow
from .state import current_runtime

P = ParamSpec("P")
R = TypeVar("R")


def _workflow_id_for_call(explicit: str | None = None) -> str:
    """Explicit, or derived from the parent workflow (same on replay), or assigned/fresh."""
    if explicit is not None:
        return take_workflow_id(explicit)
    ctx = current_context()
    if ctx is not None and not in_step():
        return ctx.child_workflow_id()
    return take_workflow_id()


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
                runtime = current_runtime()
                return await runtime.call_async(definition, _workflow_id_for_call(), args, kwargs)

            wrapper = async_wrapper
        else:

            @functools.wraps(func)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                runtime = current_runtime()
                return runtime.call(definition, _workflow_id_for_call(), args, kwargs)

            wrapper = sync_wrapper
        wrapper.__dbos_agent_workflow__ = definition
        return wrapper  # type: ignore[no-any-return]

    return decorate(fn) if fn is not None else decorate


@overload
def start(
    fn: Callable[P, Coroutine[Any, Any, R]],
    /,
    *args: Any,
    workflow_id: str | None = None,
    **kwargs: Any,
) -> WorkflowHandle[R]: ...


@overload
def start(
    fn: Callable[P, R], /, *args: Any, workflow_id: str | None = None, **kwargs: Any
) -> WorkflowHandle[R]: ...


def start(
    fn: Callable[..., Any], /, *args: Any, workflow_id: str | None = None, **kwargs: Any
) -> WorkflowHandle[Any]:
    """Start a workflow in the background and return its handle.

    The workflow is durably recorded before this returns, so a crash right
    after still recovers it. An id that exists returns a handle on that
    workflow without running it twice.
    """
    definition = definition_of(fn)
    runtime = current_runtime()
    wid = _workflow_id_for_call(workflow_id)
    admission = runtime.admit(definition, wid, args, kwargs)
    future = runtime.submit(admission.run) if admission.run is not None else admission.future()
    return WorkflowHandle(runtime, wid, future)


def list_workflows(
    status: WorkflowStatus | str | None = None,
    name: str | None = None,
    limit: int = 100,
    *,
    executor_id: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
) -> list[WorkflowInfo]:
    """Stored workflows matching every given filter, newest first."""
    if status is not None:
        status = WorkflowStatus(status)
    return current_runtime().db.workflows.list(
        status=status,
        name=name,
        executor_id=executor_id,
        created_after=created_after,
        created_before=created_before,
        limit=limit,
    )


def list_steps(workflow_id: str) -> list[StepInfo]:
    """The recorded steps of a workflow, in order (empty for an unknown id)."""
    return current_runtime().db.steps.list(workflow_id)
