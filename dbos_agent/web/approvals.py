"""The approval routes: what waits for a human, and the decision, bound to the digest of
the call asked about."""

from __future__ import annotations

from fastapi import APIRouter, Response
from pydantic import BaseModel, Field

from .common import CHECKED, ONE, ClientOf, approval_document, json_response

router = APIRouter(tags=["approvals"], dependencies=CHECKED)


class DecisionBody(BaseModel):
    approve: bool = Field(description="true approves the call, false rejects it")
    digest: str = Field(description="the digest of the request being decided")
    reason: str | None = None


@router.get("/api/approvals")
def pending_approvals(client: ClientOf) -> Response:
    """Every PENDING approval request, newest first."""
    return json_response([approval_document(a) for a in client.approvals()])


@router.get(ONE + "/approvals")
def approvals(workflow_id: str, client: ClientOf) -> Response:
    """A workflow's approval requests (the tool, its arguments, their digest, status)."""
    client.get_workflow(workflow_id)
    return json_response([approval_document(a) for a in client.approvals(workflow_id)])


@router.post(ONE + "/approvals/{seq}")
def decide_approval(workflow_id: str, seq: int, body: DecisionBody, client: ClientOf) -> Response:
    """Approve or reject the call asked about at step ``seq``, bound to its digest:
    409 for other arguments, a second decision, or a workflow that no longer waits."""
    decision = client.approve if body.approve else client.reject
    decision(workflow_id, seq, body.digest, body.reason)
    return json_response({"workflow_id": workflow_id, "seq": seq, "approved": body.approve})
