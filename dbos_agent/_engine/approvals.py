"""Approvals bound to the exact tool call, decided once.

In a workflow, ``da.request_approval(tool, arguments)`` is two steps: the request
(recorded, with the digest of the tool's name and arguments, at the request step's
position ``seq``) and a durable wait for the decision (a ``recv`` on the request's own
topic: it suspends like any long wait). A decision (``operations.approve`` / ``reject``, the
``Client``'s, ``dbos-agent approve``, the HTTP API) must name the workflow, ``seq`` and
the digest: one statement checks that the request is PENDING, the digest is the one asked
about and the workflow still waits, records the decision and sends it to the workflow.
So an approval for other arguments, a second decision, or one for a workflow that no
longer waits is refused with :class:`ApprovalError`, and a decision is consumed once: on
replay the recorded decision is returned, never asked for again. A fork is not a replay:
it asks again for an approval at or just below its fork point (fork_workflow in
queries.sql), so that a decision is acted on once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pydantic_core

from .._limits import check_identifier
from .._serialization import codec_for
from .._storage.approvals import ApprovalRequest
from .._storage.database import SystemDatabase
from ..errors import ApprovalError, SerializationError, WorkflowNotFoundError
from ..records import APPROVAL_TOPIC_PREFIX
from .messaging import recv_plan
from .runtime.checkpoints import adopt_recorded, builtin_step, recorded
from .runtime.current import current_engine
from .runtime.plans import Io, Plan, run_plan, run_plan_async
from .waits import workflow_only

APPROVAL_STEP = "dbos_agent.request_approval"
_REQUEST = builtin_step(APPROVAL_STEP, codec_for(str))
_DECISION = codec_for(dict[str, Any])

__all__ = [
    "Approval",
    "ApprovalRequest",
    "ApprovalTicket",
    "approval_digest",
    "approve",
    "ask_approval",
    "ask_approval_async",
    "decide",
    "list_approvals",
    "reject",
    "request_approval",
    "request_approval_async",
    "wait_for_approval",
    "wait_for_approval_async",
]


@dataclass(frozen=True, slots=True)
class Approval:
    """A human's decision on a request: ``approved``, and why (``reason``)."""

    approved: bool
    reason: str | None
    seq: int
    digest: str


def approval_digest(tool: str, arguments: Any) -> str:
    """The digest binding an approval to a tool call: SHA-256 of the tool's name and its
    arguments as canonical JSON (keys sorted)."""
    try:
        canonical = json.dumps(
            {"tool": tool, "arguments": arguments}, sort_keys=True, separators=(",", ":")
        )
    except (TypeError, ValueError):
        canonical = pydantic_core.to_json({"tool": tool, "arguments": arguments}).decode()
    return hashlib.sha256(canonical.encode()).hexdigest()


def _topic(seq: int) -> str:
    return f"{APPROVAL_TOPIC_PREFIX}{seq}"


@dataclass(frozen=True, slots=True)
class ApprovalTicket:
    """A recorded request, to wait for: the step ``seq`` and the ``digest`` a decision
    must give (show them to whoever decides)."""

    workflow_id: str
    seq: int
    digest: str


def _ask_plan(tool: str, arguments: Any) -> Plan[ApprovalTicket]:
    ctx = workflow_only("ask_approval")
    check_identifier(tool, "tool name")
    try:
        arguments_json = pydantic_core.to_json(arguments).decode()
    except Exception as exc:
        raise SerializationError(
            f"the arguments of an approval request for {tool!r}: {exc}"
        ) from None
    digest = approval_digest(tool, json.loads(arguments_json))
    seq, row = ctx.begin_step(APPROVAL_STEP)
    if row is not None:  # asked before (a replay)
        return ApprovalTicket(ctx.workflow_id, seq, recorded(ctx, _REQUEST, seq, row).unwrap())
    db = ctx.engine.db
    write = yield Io(
        partial(
            db.approvals.request,
            workflow_id=ctx.workflow_id,
            seq=seq,
            step_name=APPROVAL_STEP,
            tool=tool,
            arguments=arguments_json,
            digest=digest,
            owner_key=ctx.engine.session_key,
            started_at=datetime.now(UTC),
        )
    )
    asked = digest if write.written else adopt_recorded(ctx, _REQUEST, seq, write).unwrap()
    return ApprovalTicket(ctx.workflow_id, seq, str(asked))


def _wait_plan(ticket: ApprovalTicket) -> Plan[Approval]:
    decision = yield from recv_plan(_topic(ticket.seq), None, _DECISION)
    return Approval(bool(decision["approved"]), decision.get("reason"), ticket.seq, ticket.digest)


def _request_plan(tool: str, arguments: Any) -> Plan[Approval]:
    ticket = yield from _ask_plan(tool, arguments)
    return (yield from _wait_plan(ticket))


def ask_approval(tool: str, arguments: Any) -> ApprovalTicket:
    """Record a request for approval of calling ``tool`` with ``arguments`` (a step), and
    return its ticket without waiting; :func:`wait_for_approval` waits for the decision."""
    return run_plan(_ask_plan(tool, arguments))


async def ask_approval_async(tool: str, arguments: Any) -> ApprovalTicket:
    """:func:`ask_approval` for async workflows (the same plan: the same recorded step)."""
    return await run_plan_async(_ask_plan(tool, arguments))


def wait_for_approval(ticket: ApprovalTicket) -> Approval:
    """Wait (suspended, in a background run) for the decision on ``ticket`` (a step)."""
    return run_plan(_wait_plan(ticket))


async def wait_for_approval_async(ticket: ApprovalTicket) -> Approval:
    """:func:`wait_for_approval` for async workflows: the wait holds no thread."""
    return await run_plan_async(_wait_plan(ticket))


def request_approval(tool: str, arguments: Any) -> Approval:
    """Ask a human to approve calling ``tool`` with ``arguments`` and wait for the decision
    (:func:`ask_approval`, then :func:`wait_for_approval`). Replayed after a crash, the
    recorded decision is returned: never asked for, nor decided, twice."""
    return run_plan(_request_plan(tool, arguments))


async def request_approval_async(tool: str, arguments: Any) -> Approval:
    """:func:`request_approval` for async workflows."""
    return await run_plan_async(_request_plan(tool, arguments))


def decide(
    db: SystemDatabase,
    workflow_id: str,
    seq: int,
    digest: str,
    *,
    approved: bool,
    reason: str | None = None,
) -> None:
    """Approve or reject the request at step ``seq`` of ``workflow_id``, bound to
    ``digest``; raises :class:`ApprovalError` (or WorkflowNotFoundError) saying why not."""
    check_identifier(workflow_id, "workflow id")
    message = json.dumps({"approved": approved, "reason": reason, "digest": digest})
    found = db.approvals.decide(
        workflow_id=workflow_id,
        seq=seq,
        digest=digest,
        approved=approved,
        reason=reason,
        topic=_topic(seq),
        message=message,
    )
    if found.decided:
        return
    if found.workflow_status is None:
        raise WorkflowNotFoundError(workflow_id)
    where = f"workflow {workflow_id!r} step {seq}"
    if found.request_status is None:
        raise ApprovalError(f"{where}: there is no approval request there")
    if found.request_status != "PENDING":
        raise ApprovalError(f"{where}: the request was already {found.request_status.lower()}")
    if found.request_digest != digest:
        raise ApprovalError(
            f"{where}: the decision is for other arguments than the ones asked about "
            f"(digest {digest[:12]}... is not the request's); list the request again"
        )
    raise ApprovalError(
        f"{where}: the workflow is {found.workflow_status}, no longer waiting for a decision"
    )


def approve(workflow_id: str, seq: int, digest: str, reason: str | None = None) -> None:
    """Approve the tool call that step ``seq`` of ``workflow_id`` asks about (see
    :func:`decide`)."""
    decide(current_engine().db, workflow_id, seq, digest, approved=True, reason=reason)


def reject(workflow_id: str, seq: int, digest: str, reason: str | None = None) -> None:
    """Reject it: the workflow gets ``Approval(approved=False, reason=...)``."""
    decide(current_engine().db, workflow_id, seq, digest, approved=False, reason=reason)


def list_approvals(workflow_id: str | None = None) -> list[ApprovalRequest]:
    """The approval requests of a workflow (all), or the PENDING ones of every workflow."""
    return current_engine().db.approvals.list(workflow_id)
