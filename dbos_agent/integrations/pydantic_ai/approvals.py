"""Pydantic AI's deferred-tool approvals decided as dbos_agent approvals.

A tool registered with ``requires_approval=True``, or one that raises ``ApprovalRequired``,
defers its call: without a handler the run ends with ``DeferredToolRequests`` as its
output, and whoever approves starts another run with the answers. Inside a durable
workflow :class:`~.capability.Durability` answers them in the run instead, with
dbos_agent's approvals: each call is asked about with ``ask_approval_async`` (a recorded
request bound to the digest of the tool's name and the arguments the model sent), then
the run waits for every decision with ``wait_for_approval_async`` (a durable wait: it
survives kill -9, and a long one suspends the workflow). A human decides from
``dbos-agent approve ID SEQ --digest D``, the HTTP API or the dashboard; a decision for
other arguments is refused, and one decision is taken once: a replay returns the
recorded decisions without asking again, and an approved tool's call is a step like any
other, so it runs once.
"""

from __future__ import annotations

from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolDenied

from ..._engine.approvals import Approval, ask_approval_async, wait_for_approval_async

__all__ = ["decide_approvals", "denial_message"]


def denial_message(approval: Approval) -> str:
    """What the model is told about a rejected call (the reason, when the human gave one)."""
    return "A human rejected this call" + (f": {approval.reason}" if approval.reason else ".")


async def decide_approvals(requests: DeferredToolRequests) -> DeferredToolResults | None:
    """Ask for every call in ``requests.approvals`` (in order), then wait for each decision.

    All the requests are recorded before the first wait, so whoever decides sees every
    call the model made at once. Returns ``None`` when nothing asks for approval; calls for
    external execution (``requests.calls``) are left to whoever handles them.
    """
    if not requests.approvals:
        return None
    tickets = [
        await ask_approval_async(part.tool_name, part.args_as_dict()) for part in requests.approvals
    ]
    decisions = [await wait_for_approval_async(ticket) for ticket in tickets]
    return DeferredToolResults(
        approvals={
            part.tool_call_id: True if decision.approved else ToolDenied(denial_message(decision))
            for part, decision in zip(requests.approvals, decisions, strict=True)
        }
    )
