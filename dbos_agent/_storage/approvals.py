"""The ``approvals`` table: what workflows ask humans, and the decisions, taken once."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .connector import Connection, Connector
from .rows import StepWrite, text_of
from .sql_files import query
from .steps import write_with_checkpoint


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """One request: the tool call a workflow asks a human about, at step ``seq``."""

    workflow_id: str
    seq: int
    tool: str
    arguments: Any
    digest: str
    status: str
    reason: str | None
    requested_at: datetime
    decided_at: datetime | None


@dataclass(frozen=True, slots=True)
class Decided:
    """What decide found: whether it decided, else the request and workflow as they are."""

    decided: bool
    request_status: str | None
    request_digest: str | None
    workflow_status: str | None


class ApprovalStore:
    """Approval requests and their decisions."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def request(
        self,
        *,
        workflow_id: str,
        seq: int,
        step_name: str,
        tool: str,
        arguments: str,
        digest: str,
        owner_key: int | None,
        started_at: datetime,
    ) -> StepWrite:
        """Record the request and checkpoint step ``seq`` (output: the digest) in one
        transaction; when the checkpoint is refused nothing is recorded."""
        where = f"the arguments of the approval request of workflow {workflow_id!r}"
        stored = self._db.json_in(arguments, where)

        def record(conn: Connection) -> str:
            conn.execute(
                query("request_approval"),
                {
                    "workflow_id": workflow_id,
                    "seq": seq,
                    "tool": tool,
                    "arguments": stored,
                    "digest": digest,
                },
            )
            return digest

        return write_with_checkpoint(
            self._db,
            f"ask for approval in workflow {workflow_id!r}",
            record,
            json.dumps,
            workflow_id=workflow_id,
            seq=seq,
            name=step_name,
            owner_key=owner_key,
            started_at=started_at,
            where=where,
        ).write

    def decide(
        self,
        *,
        workflow_id: str,
        seq: int,
        digest: str,
        approved: bool,
        reason: str | None,
        topic: str,
        message: str,
    ) -> Decided:
        """Approve or reject, once, and tell the workflow (see ``decide_approval``)."""
        row = self._db.one(
            "decide_approval",
            f"decide the approval request at step {seq} of workflow {workflow_id!r}",
            workflow_id=workflow_id,
            seq=seq,
            digest=digest,
            status="APPROVED" if approved else "REJECTED",
            reason=reason,
            topic=topic,
            message=message,
        )
        assert row is not None
        return Decided(bool(row["decided"]), row["status"], row["digest"], row["found_workflow"])

    def list(self, workflow_id: str | None = None, limit: int = 100) -> list[ApprovalRequest]:
        """The requests of one workflow, or the PENDING ones of all, newest first."""
        if workflow_id is None:
            rows = self._db.all("list_pending_approvals", "list approval requests", limit=limit)
        else:
            rows = self._db.all(
                "list_workflow_approvals",
                f"list the approval requests of workflow {workflow_id!r}",
                workflow_id=workflow_id,
                limit=limit,
            )
        return [
            ApprovalRequest(
                r["workflow_id"],
                r["seq"],
                r["tool"],
                json.loads(text_of(r["arguments"]) or "null"),
                r["digest"],
                r["status"],
                r["reason"],
                r["requested_at"],
                r["decided_at"],
            )
            for r in rows
        ]
