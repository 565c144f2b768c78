"""Operator actions: cancel, resume, fork and rewind, each one guarded statement."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import psycopg

from ..errors import DuplicateEnqueueError
from ..records import WorkflowFilter, WorkflowStatus
from .connector import Connector
from .filters import filter_params, filter_sql
from .rows import (
    CancelResult,
    ForkResult,
    ResumeResult,
    RewindResult,
    is_duplicate_enqueue,
    text_of,
)
from .sql_files import query

#: A bulk statement: an action, or the dry run that counts what ``action`` would change.
BulkAction = Literal["cancel", "resume", "delete", "count"]

_BULK_QUERIES: dict[str, str] = {
    "cancel": "cancel_workflows",
    "resume": "resume_workflows",
    "delete": "delete_workflows",
    "count": "count_workflows_to_act_on",
}


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What one bulk statement found and did: the ids that matched, how many of those it
    changed (or, counting, would change), and the workflows they started that a cancel
    cancelled with them."""

    matched: int
    changed: int
    children: int = 0


class OperationStore:
    """What operators do to workflows (see _engine/operations.py for the rules)."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def cancel(self, workflow_id: str) -> CancelResult | None:
        """Cancel an unfinished (or stuck) workflow and notify its runner; None if unknown.
        The bulk statement with one id: a cancel does the same to a workflow either way."""
        sql = query("cancel_workflows").replace("{filters}", "true")
        row = self._db.run(
            f"cancel workflow {workflow_id!r}",
            lambda c: c.execute(sql, {"workflow_ids": [workflow_id]}).fetchone(),
        )
        if row is None or not row["matched"]:
            return None
        return CancelResult(bool(row["changed"]), WorkflowStatus(row["status"]))

    def cancel_overdue(self, limit: int = 100) -> list[str]:
        """Cancel up to ``limit`` workflows past their deadline (with the workflows they
        started) and notify their runners; returns every id cancelled."""
        rows = self._db.all(
            "cancel_overdue_workflows", "cancel workflows past their deadline", limit=limit
        )
        return [row["workflow_id"] for row in rows]

    def resume(
        self, workflow_id: str, *, executor_id: str | None, owner_key: int | None
    ) -> ResumeResult | None:
        """Make a cancelled, dead-lettered or resolved in-doubt workflow PENDING; None if unknown.

        ``owner_key`` is the session that will run it now (None: whoever claims it);
        ``executor_id`` None keeps the workflow's executor.
        """
        params = {"workflow_id": workflow_id, "executor_id": executor_id, "owner_key": owner_key}
        row = self._reopen("resume_workflow", f"resume workflow {workflow_id!r}", params)
        if row is None:
            return None
        return ResumeResult(
            bool(row["resumed"]),
            WorkflowStatus(row["status"]),
            None if row["status_now"] is None else WorkflowStatus(row["status_now"]),
            row["open_intent"],
            row["name"],
            text_of(row["inputs"]) or "{}",
            row["executor_id"],
        )

    def _reopen(self, name: str, what: str, params: dict[str, Any]) -> Any:
        """Run a statement that makes a stopped workflow PENDING again (resume, rewind):
        its row, or DuplicateEnqueueError when another unfinished workflow of its queue
        holds its deduplication id meanwhile."""
        try:
            return self._db.run(
                what, lambda c: c.execute(query(name), params).fetchone(), resend=False
            )
        except psycopg.errors.UniqueViolation as exc:
            if not is_duplicate_enqueue(exc):
                raise
            raise self._duplicate(params["workflow_id"]) from None

    def rewind(
        self,
        workflow_id: str,
        to_step: int,
        *,
        by: str,
        executor_id: str | None,
        owner_key: int | None,
    ) -> RewindResult | None:
        """Delete a stopped workflow's steps from ``to_step`` on, undo what they did to its
        messages, streams, events and approvals, and make it PENDING (see rewind_workflow
        in queries.sql); one statement. None if unknown."""
        params = {
            "workflow_id": workflow_id,
            "to_step": to_step,
            "by": by,
            "executor_id": executor_id,
            "owner_key": owner_key,
        }
        row = self._reopen("rewind_workflow", f"rewind workflow {workflow_id!r}", params)
        if row is None:
            return None
        return RewindResult(
            bool(row["rewound"]),
            WorkflowStatus(row["status"]),
            None if row["status_now"] is None else WorkflowStatus(row["status_now"]),
            row["last_seq"],
            row["open_intent"],
            row["name"],
            text_of(row["inputs"]) or "{}",
            row["executor_id"],
            row["deleted_steps"],
            row["unconsumed_messages"],
            row["stream_items"],
            row["events"],
            row["approvals"],
        )

    def edits(self, workflow_id: str) -> list[dict[str, Any]]:
        """What operators changed in a workflow's log (rewinds, an edited fork's edits),
        oldest first; empty when nothing was, or the workflow is unknown."""
        row = self._db.one(
            "get_workflow_edits", f"read workflow {workflow_id!r}", workflow_id=workflow_id
        )
        text = None if row is None else text_of(row["edits"])
        return [] if not text else list(json.loads(text))

    def ids(self, selection: WorkflowFilter) -> list[str]:
        """The ids of every workflow matching ``selection``, in id order: what a bulk
        action given a filter acts on, batch by batch."""
        sql = query("list_workflow_ids").replace("{filters}", filter_sql(selection))
        params = filter_params(selection)
        rows = self._db.run("list workflow ids", lambda c: c.execute(sql, params).fetchall())
        return [row["workflow_id"] for row in rows]

    def act_on_batch(
        self,
        action: BulkAction,
        workflow_ids: list[str],
        selection: WorkflowFilter,
        counted: BulkAction | None = None,
    ) -> BatchResult:
        """Cancel, resume or delete the workflows of ``workflow_ids`` that also match
        ``selection``, in one statement (see cancel_workflows, resume_workflows and
        delete_workflows in queries.sql); ``count`` counts what ``counted`` would change.

        A resume of a batch in which two workflows of a queue hold the same deduplication
        id (both would be unfinished again) is refused by the dedup index as a whole: that
        batch is resumed one workflow at a time, and the second is left, as its own
        resume would be refused."""
        try:
            return self._statement(action, workflow_ids, selection, counted)
        except psycopg.errors.UniqueViolation as exc:
            if action != "resume" or not is_duplicate_enqueue(exc):
                raise
        matched = changed = 0
        for workflow_id in workflow_ids:
            try:
                one = self._statement(action, [workflow_id], selection, None)
            except psycopg.errors.UniqueViolation as exc:
                if not is_duplicate_enqueue(exc):
                    raise
                one = BatchResult(1, 0)
            matched, changed = matched + one.matched, changed + one.changed
        return BatchResult(matched, changed)

    def _statement(
        self,
        action: BulkAction,
        workflow_ids: list[str],
        selection: WorkflowFilter,
        counted: BulkAction | None,
    ) -> BatchResult:
        sql = query(_BULK_QUERIES[action]).replace("{filters}", filter_sql(selection))
        params = {**filter_params(selection), "workflow_ids": workflow_ids, "action": counted}
        row = self._db.run(
            f"{action} {len(workflow_ids)} workflows",
            lambda c: c.execute(sql, params).fetchone(),
            resend=action != "resume",
        )
        assert row is not None
        return BatchResult(int(row["matched"]), int(row["changed"]), int(row.get("children", 0)))

    def _duplicate(self, workflow_id: str) -> DuplicateEnqueueError:
        """The error of a resume refused because another unfinished workflow of its queue
        holds its deduplication id meanwhile."""
        row = self._db.one(
            "get_workflow_dedup",
            f"read the deduplication id of workflow {workflow_id!r}",
            workflow_id=workflow_id,
        )
        queue_name, dedup_id = (None, None) if row is None else (row["queue_name"], row["dedup_id"])
        return DuplicateEnqueueError(str(queue_name), str(dedup_id), workflow_id)

    def fork(
        self,
        workflow_id: str,
        *,
        new_workflow_id: str,
        from_step: int,
        executor_id: str | None,
        owner_key: int | None,
        inputs: str | None = None,
        replace: str | None = None,
        edits: str | None = None,
    ) -> ForkResult | None:
        """Copy a workflow and its recorded steps below the fork point under a new id,
        PENDING, with what it published there and its approval requests (see
        fork_workflow in queries.sql: the fork point may be below ``from_step``); an
        edited fork takes ``inputs`` (JSON text), the outputs of ``replace`` (JSON text
        ``{"seq": {"name", "output"}}``) and records ``edits`` (a JSON array).

        One statement: nothing is written unless everything is. None if the original is unknown.
        """
        params = {
            "workflow_id": workflow_id,
            "new_workflow_id": new_workflow_id,
            "from_step": from_step,
            "executor_id": executor_id,
            "owner_key": owner_key,
            "inputs": inputs,
            "replace": replace,
            "edits": edits,
        }
        row = self._db.run(
            f"fork workflow {workflow_id!r}",
            lambda c: c.execute(query("fork_workflow"), params).fetchone(),
            resend=False,
        )
        if row is None:
            return None
        return ForkResult(
            bool(row["forked"]),
            row["copied"],
            row["name"],
            text_of(row["inputs"]) or "{}",
            row["executor_id"],
            row["last_seq"],
            row["open_intent"],
            row["from_step"],
            row["stream_items"],
            row["events"],
            row["approvals"],
            row["bad_edit"],
        )

    def retry_now(self, workflow_id: str) -> tuple[WorkflowStatus, int] | None:
        """Make the workflow's steps that wait for a retry due now (waking it if it is
        SUSPENDED for that, telling the process that waits for it otherwise); its status
        and how many steps were waiting, or None if unknown."""
        row = self._db.one(
            "retry_workflow_now",
            f"retry workflow {workflow_id!r} now",
            workflow_id=workflow_id,
        )
        if row is None:
            return None
        return WorkflowStatus(row["status"]), int(row["retrying"])

    def fork_origin(self, workflow_id: str) -> tuple[str, int] | None:
        """``(original id, from_step)`` of a forked workflow, else None."""
        row = self._db.one(
            "get_fork_origin", f"read workflow {workflow_id!r}", workflow_id=workflow_id
        )
        if row is None or row["forked_from"] is None:
            return None
        return row["forked_from"], row["forked_from_step"]
