"""What the storage layer hands the engine: rows as small frozen records.

JSON columns stay text (the engine parses them through the right codec), read
back through ``jsonb.from_db`` so NUL-escaped values come back as written.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any, Literal

import psycopg

from ..records import (
    Divergence,
    RetryInfo,
    StepStatus,
    WaitInfo,
    WorkflowInfo,
    WorkflowStatus,
)
from . import jsonb
from .waiting import waiting

Row = dict[str, Any]

#: The partial unique index that refuses a second unfinished workflow of a queue with
#: one deduplication id (migration 018).
DEDUP_INDEX = "workflows_queue_dedup"


def is_duplicate_enqueue(exc: BaseException) -> bool:
    """Whether a statement failed because a queue's deduplication id is held."""
    return (
        isinstance(exc, psycopg.errors.UniqueViolation) and exc.diag.constraint_name == DEDUP_INDEX
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class NewWorkflow:
    """A workflow to record, said once from the call that starts it to the statement that
    inserts it (``WorkflowStore.insert``): a direct call, ``Queue.enqueue``, a delayed
    start and ``Client.enqueue`` all build one. Its status follows from it (``status``)."""

    workflow_id: str
    name: str
    #: The call's inputs as JSON text (``InputsCodec.dumps``, or ``dumps_unbound``).
    inputs: str
    executor_id: str
    app_version: str | None
    max_recovery_attempts: int
    #: The session that runs it; only a PENDING workflow is owned (else nobody's).
    owner_key: int | None
    queue_name: str | None = None
    priority: int = 0
    #: The workflow that started it (a cancel reaches it through that).
    parent_id: str | None = None
    #: Seconds from now after which it is cancelled if unfinished.
    timeout: float | None = None
    #: Refused (DuplicateEnqueueError) while an unfinished workflow of the queue holds it.
    dedup_id: str | None = None
    #: Seconds from now before which it does not start.
    delay: float | None = None
    #: The partition of a partitioned queue it is enqueued on (its limits count per key).
    partition_key: str | None = None

    @property
    def status(self) -> WorkflowStatus:
        """ENQUEUED on a queue; else SUSPENDED on a timer when delayed; else PENDING."""
        if self.queue_name is not None:
            return WorkflowStatus.ENQUEUED
        if self.delay is not None:
            return WorkflowStatus.SUSPENDED
        return WorkflowStatus.PENDING

    def insert_params(self, inputs: object) -> dict[str, Any]:
        """The parameters of the ``insert_workflow`` statement, whichever store sends it
        (a start, a schedule's slot), with ``inputs`` as the connector adapted them
        (``Connector.json_in``). Only a PENDING workflow is owned; a delayed one waits on
        a timer."""
        status = self.status
        params = {field.name: getattr(self, field.name) for field in fields(self)}
        params.update(
            status=status,
            inputs=inputs,
            owner_key=self.owner_key if status is WorkflowStatus.PENDING else None,
            wait_kind="sleep" if status is WorkflowStatus.SUSPENDED else None,
        )
        return params


@dataclass(frozen=True, slots=True)
class WorkflowRow:
    """What the engine needs of a workflow row; JSON columns stay text."""

    workflow_id: str
    name: str
    status: WorkflowStatus
    inputs: str
    output: str | None
    error: str | None
    owner_key: int | None = None
    owner_live: bool = False


@dataclass(frozen=True, slots=True)
class StepRow:
    """One recorded step as the engine replays it; JSON columns stay text."""

    seq: int
    name: str
    status: StepStatus
    output: str | None
    error: str | None
    attempts: int
    #: An intent's inputs, when the log was read for replay (other rows: None).
    inputs: str | None = None
    #: A RETRYING row's retry state (JSON: since, next_at, waiting_for), else None.
    retry: str | None = None


@dataclass(frozen=True, slots=True)
class StepWrite:
    """The outcome of a log write: whether it wrote, and what the workflow and the
    position held instead when it did not."""

    written: bool
    workflow_status: WorkflowStatus | None
    existing: StepRow | None
    #: False when the workflow is PENDING under another session (it was taken over).
    owned: bool = True


@dataclass(frozen=True, slots=True)
class StepEffect:
    """A write asked for inside a step, made in the transaction of its checkpoint (so
    exactly once, with it): event ``key`` set to ``value`` (JSON, ready to store), or
    stream ``key`` closed by ``attempt`` of the step (tagged like its live items, so that
    a rewind before the step reopens the stream and a fork after it copies the close)."""

    kind: Literal["event", "close"]
    key: str
    value: str | None = None
    attempt: int | None = None
    attempt_id: str | None = None


@dataclass(frozen=True, slots=True)
class RecoveryClaim:
    """A PENDING workflow taken for recovery (or dead-lettered by the claim)."""

    workflow_id: str
    name: str
    status: WorkflowStatus
    inputs: str
    created_at: datetime
    recovery_attempts: int
    max_recovery_attempts: int


@dataclass(frozen=True, slots=True)
class CancelResult:
    """What :meth:`OperationStore.cancel` found and did."""

    cancelled: bool
    previous: WorkflowStatus


@dataclass(frozen=True, slots=True)
class ResumeResult:
    """What :meth:`SystemDatabase.resume_workflow` found and did, and what a runner needs."""

    resumed: bool
    previous: WorkflowStatus
    #: PENDING, or ENQUEUED for a queued workflow that had not left its queue (None: refused).
    now: WorkflowStatus | None
    #: The first step whose intent has no result (why an IN_DOUBT workflow was refused).
    open_intent: int | None
    name: str
    inputs: str
    executor_id: str


@dataclass(frozen=True, slots=True)
class ForkResult:
    """What :meth:`SystemDatabase.fork_workflow` found and did, and what a runner needs."""

    forked: bool
    copied_steps: int
    name: str
    inputs: str
    executor_id: str
    last_seq: int | None
    #: The first in-doubt step below the fork point (why a fork was refused).
    open_intent: int | None
    #: The fork point: the ``from_step`` asked for, moved back over the approval steps
    #: just below it (the fork asks for those approvals again).
    from_step: int
    #: What the original had published below the fork point, copied into the fork.
    stream_items: int = 0
    events: int = 0
    #: Approval requests copied (decided, or PENDING: asked again).
    approvals: int = 0
    #: The first replaced step that is no recorded result of that name below the fork
    #: point (why an edited fork was refused).
    bad_edit: int | None = None


@dataclass(frozen=True, slots=True)
class RewindResult:
    """What a rewind found and did (see rewind_workflow in queries.sql), and what a runner
    needs."""

    rewound: bool
    #: The status before, and after (None: refused).
    previous: WorkflowStatus
    now: WorkflowStatus | None
    last_seq: int | None
    #: The first in-doubt step below ``to_step`` (why a rewind was refused).
    open_intent: int | None
    name: str
    inputs: str
    executor_id: str
    #: What was undone: steps deleted, messages put back, stream items deleted, events
    #: restored or deleted, approval requests deleted (asked again).
    deleted_steps: int = 0
    unconsumed_messages: int = 0
    stream_items: int = 0
    events: int = 0
    approvals: int = 0


@dataclass(frozen=True, slots=True)
class Runner:
    """What a process can run, as every statement that gives it workflows asks
    (``dbos_agent.may_run``): the workflow names it registered, its application version
    (None: every version) and the version of its code (workflows whose replay diverged
    under that code are left to others)."""

    names: list[str]
    app_version: str | None
    code_version: str

    def params(self) -> dict[str, Any]:
        """The statement parameters ``names``, ``app_version`` and ``code_version``."""
        return {
            "names": self.names,
            "app_version": self.app_version,
            "code_version": self.code_version,
        }


@dataclass(frozen=True, slots=True)
class UnlockedSession:
    """An executor session whose lock is free and which is not yet known dead."""

    session_key: int
    pid: int
    process_key: str | None


def text_of(value: Any) -> str | None:
    """A JSON column read as text, as the caller stored it."""
    return jsonb.from_db(value)


def workflow_info(row: Row) -> WorkflowInfo:
    """A workflow row as a record; read by ``list_workflows``, with what it waits for."""
    info = WorkflowInfo(
        workflow_id=row["workflow_id"],
        name=row["name"],
        status=WorkflowStatus(row["status"]),
        inputs=jsonb.parse(row["inputs"]),
        output=jsonb.parse(row["output"]),
        error=jsonb.parse(row["error"]),
        executor_id=row["executor_id"],
        app_version=row["app_version"],
        recovery_attempts=row["recovery_attempts"],
        max_recovery_attempts=row["max_recovery_attempts"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        finished_at=row["finished_at"],
        waiting_for=(
            None
            if row.get("wait_kind") is None
            else WaitInfo(row["wait_kind"], row["wait_target"], row["wait_name"], row["wake_at"])
        ),
        run_started_at=row.get("run_started_at"),
        diverged=divergence(row.get("diverged")),
        delayed_until=(
            row.get("wake_at")
            if row["status"] == WorkflowStatus.ENQUEUED and row.get("wait_kind") is None
            else None
        ),
        retrying=retry_info(
            row.get("retry_seq"),
            row.get("retry_step"),
            row.get("retry_attempts"),
            row.get("retry_error"),
            row.get("retry_state"),
        ),
        partition_key=row.get("partition_key"),
        priority=row.get("priority") or 0,
        dequeued_at=row.get("dequeued_at"),
        deduplication_id=row.get("dedup_id"),
        forked_from=row.get("forked_from"),
        forked_from_step=row.get("forked_from_step"),
        parent_workflow_id=row.get("parent_id"),
    )
    found = waiting(row, info)
    return info if found is None else dataclasses.replace(info, waiting=found)


def retry_info(
    seq: int | None, step: str | None, attempts: int | None, error: Any, state: Any
) -> RetryInfo | None:
    """A RETRYING step's columns (its ``retry`` state, migration 023) as a record."""
    found = jsonb.parse(state) if isinstance(state, str) else state
    if seq is None or step is None or not isinstance(found, dict):
        return None
    last = jsonb.parse(error) if isinstance(error, str) else error
    return RetryInfo(
        seq=seq,
        step=step,
        waiting_for=str(found.get("waiting_for") or step),
        attempts=int(attempts or 0),
        since=datetime.fromtimestamp(float(found["since"]), UTC),
        next_at=datetime.fromtimestamp(float(found["next_at"]), UTC),
        last_error=last if isinstance(last, dict) else None,
    )


def divergence(value: Any) -> Divergence | None:
    """The ``diverged`` column (JSON written by the engine's hold), as a record."""
    found = jsonb.parse(value) if isinstance(value, str) else value
    if not isinstance(found, dict):
        return None
    at = found.get("at")
    return Divergence(
        position=int(found["position"]),
        recorded=str(found["recorded"]),
        called=str(found["called"]),
        app_version=found.get("app_version"),
        code_version=str(found.get("code_version", "")),
        at=datetime.fromisoformat(at) if isinstance(at, str) else None,
    )


def step_row(row: Row, seq: int | None = None) -> StepRow:
    return StepRow(
        row["seq"] if seq is None else seq,
        row["name"],
        StepStatus(row["status"]),
        text_of(row["output"]),
        text_of(row["error"]),
        row["attempts"],
        text_of(row.get("inputs")),
        text_of(row.get("retry")),
    )


def step_write(seq: int, row: Row | None) -> StepWrite:
    assert row is not None
    existing = None if row["name"] is None else step_row(row, seq)
    status = row["workflow_status"]
    if status == "NOT_OWNER":
        return StepWrite(bool(row["written"]), WorkflowStatus.PENDING, existing, owned=False)
    return StepWrite(
        bool(row["written"]), None if status is None else WorkflowStatus(status), existing
    )
