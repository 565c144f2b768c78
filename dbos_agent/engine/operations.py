"""Operator actions on stored workflows (the CLI calls these too)."""

from __future__ import annotations

from typing import Any

from ..errors import DbosAgentError, WorkflowNotFoundError
from ..records import StepStatus, WorkflowStatus
from ..serialization import codec_for
from .handle import WorkflowHandle
from .registry import find_workflow
from .runtime import current_runtime

_UNSET: Any = object()


def resolve_in_doubt(
    workflow_id: str, seq: int, *, result: Any = _UNSET, rerun: bool = False
) -> WorkflowHandle[Any]:
    """Settle the in-doubt step ``seq`` of an IN_DOUBT workflow, and let it continue.

    Pass ``result=`` when the effect did happen (the step returns that value,
    stored as JSON), or ``rerun=True`` when it did not (the step runs again).
    The workflow becomes PENDING; if this process knows its function it
    resumes at once, otherwise the next recovery of its executor picks it up.
    """
    if rerun == (result is not _UNSET):
        raise ValueError("pass exactly one of result=... (it happened) or rerun=True")
    runtime = current_runtime()
    db = runtime.db
    info = db.get_workflow(workflow_id)
    if info is None:
        raise WorkflowNotFoundError(workflow_id)
    steps = {s.seq: s for s in db.list_steps(workflow_id)}
    step = steps.get(seq)
    if (
        info.status is not WorkflowStatus.IN_DOUBT
        or step is None
        or (step.status is not StepStatus.PENDING)
    ):
        raise DbosAgentError(
            f"workflow {workflow_id!r} has no in-doubt step {seq} to settle "
            f"(workflow status {info.status}, step "
            f"{'missing' if step is None else step.status})"
        )
    output = None if rerun else codec_for(Any).dumps(result, f"workflow {workflow_id!r} step {seq}")
    definition = find_workflow(info.name)
    owner = runtime.session_key if definition is not None else None
    settled = db.settle_in_doubt_step(workflow_id, seq, output, owner)
    if settled is None:
        raise DbosAgentError(f"workflow {workflow_id!r} step {seq} was settled concurrently")
    _, inputs = settled
    future = None if definition is None else runtime.resume(definition, workflow_id, inputs)
    return WorkflowHandle(runtime, workflow_id, future)
