"""Rewind a workflow in place, and fork one with edited inputs or recorded step outputs.

A rewind runs a stopped workflow again from a step, under its own id: one guarded
statement (rewind_workflow in queries.sql) deletes its steps from there on and undoes what
they did to its own rows. A live run cannot be rewound under its feet: a PENDING workflow
(which a process runs, or is about to recover) is refused; cancel it first.

An edited fork is a fork (see operations.py) whose new log differs from the original on
purpose: other inputs, or another recorded output of some steps below the fork point
(LangGraph's ``update_state``). Each edit is checked before anything is written, against
the workflow's signature and the replaced step's return annotation when this process has
imported them (pydantic, as checkpoints are), and against the log in the statement that
forks (the step is a recorded result of that name below the fork point). Both record what
changed, by whom and when, in the workflow's ``edits`` (migration 027): `workflows show`,
the API and the dashboard read it; a replay never does.
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._limits import check_identifier
from .._serialization import Codec, codec_for
from .._storage.database import SystemDatabase
from .._storage.rows import RewindResult
from ..errors import (
    ForkEditError,
    SerializationError,
    WorkflowInputsError,
    WorkflowNotFoundError,
    WorkflowStatusError,
)
from ..records import StepInfo, StepStatus, WorkflowStatus
from .messaging import RECV_STEP
from .runtime.registry import WorkflowDefinition, find_workflow, step_results

#: The library's own steps whose output is a value a person may replace (a message, an
#: event's value); the others record bookkeeping (an offset, a child's id, a patch).
REPLACEABLE_BUILTINS = frozenset({RECV_STEP, "dbos_agent.get_event"})
_ANY = codec_for(Any)

#: ``replace=``: replayed steps by position (``3``, ``"3"``) or position and name
#: (``"3:search"``), each with the output it is given.
Replacements = Mapping[int, Any] | Mapping[str, Any]


def editor(by: str | None) -> str:
    """Who an edit is recorded as: ``by``, else the operating system's user."""
    if by is not None:
        return check_identifier(by, "editor name")
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment (a container without one)
        return "unknown"


def rewind_workflow(
    db: SystemDatabase,
    workflow_id: str,
    to_step: int,
    *,
    by: str | None = None,
    executor_id: str | None = None,
    owner_key: int | None = None,
) -> RewindResult:
    """Run a stopped workflow again in place from ``to_step`` (see rewind_workflow in
    queries.sql for what is undone); raises WorkflowStatusError, writing nothing, when it
    may be running (PENDING), has not started (ENQUEUED), ``to_step`` is past the end of
    its log, or a step below ``to_step`` is in doubt."""
    if to_step < 0:
        raise ValueError(f"to_step must be >= 0, got {to_step}")
    result = db.operations.rewind(
        check_identifier(workflow_id, "workflow id"),
        to_step,
        by=editor(by),
        executor_id=executor_id,
        owner_key=owner_key,
    )
    if result is None:
        raise WorkflowNotFoundError(workflow_id)
    if result.rewound:
        return result
    status = result.previous
    end = 0 if result.last_seq is None else result.last_seq + 1
    if status is WorkflowStatus.PENDING:
        detail = (
            "a process may be running it (or is about to recover it); cancel it first "
            "(`dbos-agent workflows cancel`), then rewind"
        )
    elif status is WorkflowStatus.ENQUEUED:
        detail = "it has not started: there is nothing to rewind"
    elif result.open_intent is not None:
        detail = (
            f"its step {result.open_intent} is in doubt; resolve it first (`dbos-agent "
            f"steps resolve`), or rewind to step {result.open_intent} or earlier to run it "
            "again on purpose"
        )
    else:
        detail = f"its log ends at step {end}; choose a step from 0 to {end}"
    raise WorkflowStatusError(
        workflow_id,
        status,
        f"cannot rewind workflow {workflow_id!r} ({status}) to step {to_step}: {detail}",
    )


@dataclass(frozen=True, slots=True)
class ForkEdits:
    """Checked edits, as the fork statement takes them (JSON text)."""

    #: The fork's inputs, whole (None: the original's).
    inputs: str | None
    #: ``{"seq": {"name": ..., "output": JSON}}``.
    replace: str
    #: What is recorded on the fork (the statement adds the time).
    records: str


def replace_key(key: int | str) -> tuple[int, str | None]:
    """A replaced step as ``replace=`` names it: its position (``3``, ``"3"``), or its
    position and name (``"3:search"``), which must then be the recorded one."""
    seq_text, _, name = str(key).partition(":")
    try:
        seq = int(seq_text)
    except ValueError:
        seq = -1
    if seq < 0 or isinstance(key, bool):
        raise ValueError(
            f"replace key {key!r} is not a step: give its position (3) or position and "
            "name ('3:search')"
        )
    return seq, (name or None)


def check_edits(
    db: SystemDatabase,
    workflow_id: str,
    from_step: int,
    *,
    inputs: Mapping[str, Any] | None,
    replace: Replacements | None,
    by: str | None,
    definition: WorkflowDefinition | None = None,
) -> ForkEdits | None:
    """Check a fork's edits against the workflow's code (when this process has it) and its
    log; ForkEditError names the first that does not fit. None: no edits."""
    if not inputs and not replace:
        return None
    info = db.workflows.get(check_identifier(workflow_id, "workflow id"))
    if info is None:
        raise WorkflowNotFoundError(workflow_id)
    definition = definition or find_workflow(info.name)
    who = editor(by)
    records: list[dict[str, Any]] = []
    new_inputs = None
    if inputs:
        new_inputs = _edited_inputs(workflow_id, info.inputs, dict(inputs), definition)
        records.append(
            {"kind": "inputs", "names": sorted(inputs), "by": who, "checked": bool(definition)}
        )
    steps = {step.seq: step for step in db.steps.list(workflow_id)}
    replaced: dict[str, dict[str, Any]] = {}
    for key, value in (replace or {}).items():
        seq, name = replace_key(key)
        step = _replaced_step(workflow_id, from_step, seq, name, steps)
        output, checked = _edited_output(workflow_id, step, value)
        replaced[str(seq)] = {"name": step.name, "output": output}
        records.append(
            {"kind": "output", "seq": seq, "name": step.name, "by": who, "checked": checked}
        )
    return ForkEdits(
        None if new_inputs is None else json.dumps(new_inputs, separators=(",", ":")),
        json.dumps(replaced, separators=(",", ":")),
        json.dumps(records, separators=(",", ":")),
    )


def _edited_inputs(
    workflow_id: str,
    recorded: Any,
    edits: dict[str, Any],
    definition: WorkflowDefinition | None,
) -> dict[str, Any]:
    """The recorded inputs with the named parameters replaced, checked against the
    signature when the function is at hand."""
    given = {
        name: _ANY.to_jsonable(value, f"fork of {workflow_id!r} input {name!r}")
        for name, value in edits.items()
    }
    recorded_text = json.dumps(recorded)
    if definition is None:
        if not isinstance(recorded, dict) or (set(recorded) <= {"$args", "$kwargs"} and recorded):
            raise ForkEditError(
                workflow_id,
                "inputs",
                "its inputs were enqueued unbound ($args/$kwargs), which only the "
                "workflow's code can bind: edit them where it is imported (the CLI's --app)",
            )
        return {**recorded, **given}
    try:
        merged = {**definition.inputs.bound_data(recorded_text, workflow_id), **given}
        args, kwargs = definition.inputs.loads(json.dumps(merged), workflow_id)
    except WorkflowInputsError as exc:
        where = next((f"inputs.{name}" for name in sorted(given) if repr(name) in str(exc)), "")
        raise ForkEditError(workflow_id, where or "inputs", str(exc)) from None
    data: dict[str, Any] = json.loads(definition.inputs.dumps(args, kwargs))
    return data


def _replaced_step(
    workflow_id: str, from_step: int, seq: int, name: str | None, steps: dict[int, StepInfo]
) -> StepInfo:
    """The recorded step an edit replaces, if it is one that may be replaced."""
    where = f"step {seq}"
    step = steps.get(seq)
    if seq >= from_step:
        raise ForkEditError(
            workflow_id,
            where,
            f"it is not below the fork point {from_step}: only steps the fork replays "
            "can be given another output (the fork runs the others live)",
        )
    if step is None:
        raise ForkEditError(workflow_id, where, "the log has no step there")
    if name is not None and step.name != name:
        raise ForkEditError(workflow_id, where, f"it is {step.name!r}, not {name!r}")
    if step.status not in (StepStatus.SUCCESS, StepStatus.ERROR):
        raise ForkEditError(
            workflow_id, where, f"{step.name!r} has no recorded result ({step.status})"
        )
    if step.name.startswith("dbos_agent.") and step.name not in REPLACEABLE_BUILTINS:
        raise ForkEditError(
            workflow_id,
            where,
            f"{step.name!r} records the library's bookkeeping, not a value to edit; "
            f"only user steps and {', '.join(sorted(REPLACEABLE_BUILTINS))} can be replaced",
        )
    return step


def _edited_output(workflow_id: str, step: StepInfo, value: Any) -> tuple[Any, bool]:
    """The replacing output as JSON data, checked against the return annotation of every
    step of that name this process defines; whether there was one to check it against."""
    where = f"step {step.seq}"
    codecs: list[Codec] = step_results(step.name)
    checked = bool(codecs) or step.name in REPLACEABLE_BUILTINS
    data: Any = None
    try:
        data = _ANY.to_jsonable(value, f"fork of {workflow_id!r} {where}")
        for codec in codecs:
            data = codec.to_jsonable(codec.from_jsonable(data, where), where)
    except SerializationError as exc:
        annotation = codecs[0].annotation if codecs else Any
        raise ForkEditError(
            workflow_id,
            where,
            f"the value does not fit {step.name!r}'s return type {annotation!r}: {exc}",
        ) from None
    return data, checked
