"""What an unfinished workflow waits for (:class:`~dbos_agent.records.Waiting`), told from
the row that lists it.

The statement that lists workflows (``list_workflows`` in queries.sql) reads, beside each
row and in the same snapshot, what says how it waits: its last step (a ``recv`` or
``get_event`` intent is a wait in progress, a ``sleep`` whose wake-up time is ahead a
timer, a ``start_child`` whose child is unfinished a child), the tool of the approval a
``recv`` waits for, and, for a PENDING workflow, the session that owns it. This module
turns those columns into one classification, so that a workflow waiting in the process
that runs it reads as one SUSPENDED on the same wait does, and the CLI, the web API and
the dashboard all say the same thing.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from .._processes import session_gone_here
from ..records import (
    APPROVAL_TOPIC_PREFIX,
    WaitInfo,
    Waiting,
    WorkflowInfo,
    WorkflowStatus,
)

_RECV = "dbos_agent.recv"
_GET_EVENT = "dbos_agent.get_event"
_SLEEP = "dbos_agent.sleep"
_START_CHILD = "dbos_agent.start_child"

#: The column that says a row was read with what tells its wait (list_workflows).
MARK = "db_now"


def _at(when: datetime) -> str:
    return f"{when.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def _until(when: datetime | None) -> str:
    return "" if when is None else f" until {_at(when)}"


def _epoch(value: Any) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if isinstance(value, int | float) else None


def _json(text: Any) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def waiting(row: dict[str, Any], info: WorkflowInfo) -> Waiting | None:
    """What ``info`` waits for, from its row as ``list_workflows`` read it; None while it
    runs, once it finished, or for a row read without those columns."""
    if MARK not in row:
        return None
    status = info.status
    if status is WorkflowStatus.ENQUEUED:
        queue = row.get("queue_name")
        later = "" if info.delayed_until is None else f", not before {_at(info.delayed_until)}"
        return Waiting("queue", f"its turn on queue {queue!r}{later}", None, info.delayed_until)
    if status is WorkflowStatus.DIVERGED and info.diverged is not None:
        found = info.diverged
        text = f"code that fits its log ({found.describe()})"
        return Waiting("divergence", text, found.position, None)
    if status is WorkflowStatus.PENDING and (orphan := _orphan(row)) is not None:
        return orphan
    if status not in (WorkflowStatus.PENDING, WorkflowStatus.SUSPENDED):
        return None
    if info.retrying is not None:
        retry = info.retrying
        return Waiting("dependency", retry.describe(), retry.seq, retry.next_at)
    if status is WorkflowStatus.SUSPENDED and info.waiting_for is not None:
        return _suspended(row, info.waiting_for)
    return _in_process(row)


def _orphan(row: dict[str, Any]) -> Waiting | None:
    """A PENDING workflow whose owner is gone: nobody runs it until a process takes it
    over (the database's rules, or, seen from this host, its process gone)."""
    gone_here = session_gone_here(row.get("owner_process_key"), bool(row.get("owner_lock_free")))
    if not row.get("owner_dead") and not gone_here:
        return None
    if row.get("owner_key") is None:
        owner = "it has no owner"
    elif row.get("owner_executor") is None:
        owner = f"the session that owned it ({row['owner_key']}) has ended"
    else:
        owner = (
            f"its owner (executor {row['owner_executor']!r}, pid {row['owner_pid']} on "
            f"{row['owner_host']}) is gone"
        )
    return Waiting(
        "orphan",
        f"a live process with its function to take it over: {owner}",
        None,
        None,
    )


def _step_if(row: dict[str, Any], name: str, status: str | None = "PENDING") -> int | None:
    """The last step's position when it is ``name`` (in ``status``, unless None)."""
    if row.get("last_name") != name or (status is not None and row.get("last_status") != status):
        return None
    seq: int | None = row.get("last_seq")
    return seq


def _message(row: dict[str, Any], topic: str, until: datetime | None, step: int | None) -> Waiting:
    """A ``recv`` on ``topic``: an approval's decision, or a message."""
    if topic.startswith(APPROVAL_TOPIC_PREFIX):
        asked = topic[len(APPROVAL_TOPIC_PREFIX) :]
        tool = row.get("approval_tool")
        of = f" of {tool!r}" if tool else ""
        waits = "" if step is None else f", waiting at step {step}"
        text = f"a human's approval{of} (requested at step {asked}{waits}){_until(until)}"
        return Waiting("approval", text, step, until)
    on = f"topic {topic!r}" if topic else "the default topic"
    return Waiting("message", f"a message on {on}{_until(until)}", step, until)


def _suspended(row: dict[str, Any], wait: WaitInfo) -> Waiting:
    """A SUSPENDED workflow's wake-up condition, with the step that waits."""
    if wait.kind == "recv":
        return _message(row, wait.name or "", wait.until, _step_if(row, _RECV))
    if wait.kind == "event":
        step = _step_if(row, _GET_EVENT)
        text = f"event {wait.name!r} of workflow {wait.target!r}{_until(wait.until)}"
        return Waiting("event", text, step, wait.until)
    if wait.kind == "child":
        started = _step_if(row, _START_CHILD, None)
        step = started if _json(row.get("last_output")) == wait.target else None
        return Waiting("child", f"child workflow {wait.target!r} to finish", step, None)
    if wait.kind == "retry":
        text = f"the next attempt of step {wait.name!r}{_until(wait.until)}"
        return Waiting("dependency", text, None, wait.until)
    step = _step_if(row, _SLEEP, None)
    if step is None and row.get("last_seq") is None:
        return Waiting("timer", f"its delayed start{_until(wait.until)}", None, wait.until)
    return Waiting("timer", f"a timer{_until(wait.until)}", step, wait.until)


def _in_process(row: dict[str, Any]) -> Waiting | None:
    """A PENDING workflow waiting in the process that runs it: its last step says so (a
    ``recv`` or ``get_event`` in progress, a ``sleep`` not over, a child not finished)."""
    name, seq = row.get("last_name"), row.get("last_seq")
    if seq is None:
        return None
    if row.get("last_status") == "PENDING" and name in (_RECV, _GET_EVENT):
        found = _json(row.get("last_inputs"))
        inputs = found if isinstance(found, dict) else {}
        until = _epoch(inputs.get("deadline"))
        if name == _RECV:
            return _message(row, str(inputs.get("topic") or ""), until, seq)
        text = f"event {inputs.get('key')!r} of workflow {inputs.get('workflow_id')!r}"
        return Waiting("event", text + _until(until), seq, until)
    if row.get("last_status") != "SUCCESS":
        return None
    output = _json(row.get("last_output"))
    if name == _SLEEP and isinstance(output, int | float) and output > row[MARK]:
        until = _epoch(output)
        return Waiting("timer", f"a timer{_until(until)}", seq, until)
    child = row.get("child_status")
    if name == _START_CHILD and child is not None and not WorkflowStatus(child).finished:
        return Waiting("child", f"child workflow {output!r} to finish", seq, None)
    return None
