"""Workflow rows: recording a call (idempotent start), its owner, its outcome; reading them."""

from __future__ import annotations

from typing import Any

import psycopg

from ..errors import DuplicateEnqueueError
from ..records import WorkflowFilter, WorkflowInfo, WorkflowStatus
from . import jsonb
from .connector import Connector
from .filters import conditions, filter_params
from .log_writes import LogWrites
from .rows import NewWorkflow, Runner, WorkflowRow, is_duplicate_enqueue, text_of, workflow_info
from .sql_files import query


class WorkflowStore:
    """The ``workflows`` table."""

    def __init__(self, db: Connector, log: LogWrites) -> None:
        self._db = db
        #: Outcomes that arrive together (and with steps) share a commit.
        self._log = log

    def insert(self, new: NewWorkflow) -> tuple[bool, WorkflowRow]:
        """Record a new workflow; ``(False, existing)`` when the id is taken.

        It is PENDING and owned by ``new.owner_key``, or ENQUEUED when a queue is given;
        with ``timeout`` it is cancelled if unfinished that long from now. With ``delay``
        it starts that long from now: SUSPENDED on a timer, owned by nobody (the waker
        starts it), or ENQUEUED and not dequeued before. A ``dedup_id`` held by an
        unfinished workflow of the queue raises DuplicateEnqueueError, recording nothing.
        """
        workflow_id, name, status = new.workflow_id, new.name, new.status
        where = f"the inputs of workflow {workflow_id!r} ({name})"
        params = new.insert_params(self._db.json_in(new.inputs, where))
        owner_key = params["owner_key"]
        what = f"record workflow {workflow_id!r}"
        # a dedup_id refused would fail every write of a batch: such a start goes alone
        alone = new.dedup_id is not None
        inserted = self._inserted(what, where, params) if alone else self._log.start(params)
        while True:  # until inserted, or found taken (a delete in between: insert again)
            if inserted:
                return True, WorkflowRow(
                    workflow_id, name, status, new.inputs, None, None, owner_key
                )
            row = self._db.one("find_workflow_call", what, workflow_id=workflow_id)
            if row is not None:
                return False, WorkflowRow(
                    workflow_id,
                    row["name"],
                    WorkflowStatus(row["status"]),
                    text_of(row["inputs"]) or "{}",
                    text_of(row["output"]),
                    text_of(row["error"]),
                    row["owner_key"],
                    bool(row["owner_live"]),
                )
            inserted = self._inserted(what, where, params)

    def _inserted(self, what: str, where: str, params: dict[str, Any]) -> bool:
        """One try of insert_workflow: whether it inserted (False: the id is taken)."""
        try:
            return self._db.one("insert_workflow", what, where=where, **params) is not None
        except psycopg.errors.UniqueViolation as exc:
            if not is_duplicate_enqueue(exc):
                raise
            raise DuplicateEnqueueError(
                str(params["queue_name"]), str(params["dedup_id"]), str(params["workflow_id"])
            ) from None

    def take_over(
        self, workflow_id: str, old_owner_key: int | None, owner_key: int, executor_id: str
    ) -> bool:
        """Compare-and-set the owner of a PENDING workflow whose session is dead."""
        row = self._db.one(
            "take_over_workflow",
            f"take over workflow {workflow_id!r}",
            workflow_id=workflow_id,
            old_owner_key=old_owner_key,
            owner_key=owner_key,
            executor_id=executor_id,
        )
        return row is not None

    def owner(self, workflow_id: str) -> tuple[WorkflowStatus, int | None] | None:
        """``(status, owning session)`` of a workflow, or None when there is no such one."""
        row = self._db.one(
            "get_workflow_owner",
            f"read the owner of workflow {workflow_id!r}",
            workflow_id=workflow_id,
        )
        return None if row is None else (WorkflowStatus(row["status"]), row["owner_key"])

    def finish(
        self,
        workflow_id: str,
        status: WorkflowStatus,
        output: str | None,
        error: str | None,
        owner_key: int | None,
    ) -> tuple[bool, WorkflowStatus, str | None, str | None]:
        """Record a PENDING workflow's outcome; if it was finished already, return that one.

        Raises CheckpointTooLargeError (writing nothing) for an output over the limit.
        """
        where = f"the output of workflow {workflow_id!r}"
        params = {
            "workflow_id": workflow_id,
            "status": status,
            "output": self._db.json_in_optional(output, where),
            "error": jsonb.to_db_optional(error),  # clipped when recorded: never over the limit
            "owner_key": owner_key,
        }
        if self._log.finish(params):
            return True, status, output, error
        # not ours any more, finished already, or a failed batch: this statement says which
        row = self._db.one(
            "finish_workflow",
            f"record the outcome of workflow {workflow_id!r}",
            where=where,
            **params,
        )
        if row is None:
            raise LookupError(workflow_id)
        return (
            bool(row["updated"]),
            WorkflowStatus(row["status"]),
            text_of(row["output"]),
            text_of(row["error"]),
        )

    def take_diverged(
        self, workflow_id: str, owner_key: int, executor_id: str, runner: Runner
    ) -> bool:
        """Take a DIVERGED workflow the runner's code may fit (compare-and-set)."""
        row = self._db.one(
            "take_diverged_workflow",
            f"take diverged workflow {workflow_id!r}",
            workflow_id=workflow_id,
            owner_key=owner_key,
            executor_id=executor_id,
            app_version=runner.app_version,
            code_version=runner.code_version,
        )
        return row is not None

    def hold_diverged(
        self, workflow_id: str, owner_key: int | None, code_version: str, detail: str
    ) -> bool | None:
        """Hold a PENDING workflow this session owns as DIVERGED (``detail``: JSON saying
        where and how); whether ``code_version`` diverged on it for the first time, or
        None when the session no longer owned it (nothing written)."""
        row = self._db.one(
            "hold_diverged_workflow",
            f"hold diverged workflow {workflow_id!r}",
            workflow_id=workflow_id,
            owner_key=owner_key,
            code_version=code_version,
            detail=detail,
        )
        return None if row is None else bool(row["first_time"])

    def get(self, workflow_id: str) -> WorkflowInfo | None:
        """The stored workflow, or None (its row alone: the engine's read)."""
        row = self._db.one(
            "get_workflow", f"read workflow {workflow_id!r}", workflow_id=workflow_id
        )
        return None if row is None else workflow_info(row)

    def _read(
        self,
        what: str,
        given: dict[str, Any],
        limit: int,
        *,
        load_input: bool = True,
        load_output: bool = True,
    ) -> list[WorkflowInfo]:
        """``list_workflows`` with the filters ``given`` (and only those); inputs and
        output are None where not loaded."""
        sql = query("list_workflows").replace("{filters}", conditions(given))
        params = {**given, "limit": limit, "load_input": load_input, "load_output": load_output}
        rows = self._db.run(what, lambda c: c.execute(sql, params).fetchall())
        return [workflow_info(row) for row in rows]

    def describe(self, workflow_id: str) -> WorkflowInfo | None:
        """The stored workflow for people and tools, or None: with what it waits for
        (``WorkflowInfo.waiting``, and ``retrying`` for a step waiting out a failing
        dependency), read by the statement that lists workflows."""
        found = self._read(f"read workflow {workflow_id!r}", {"workflow_id": workflow_id}, 1)
        return found[0] if found else None

    def first_finished(self, workflow_ids: list[str]) -> str | None:
        """Of ``workflow_ids``, the one that finished first, or None while none has."""
        row = self._db.one(
            "first_finished_workflow",
            f"look for the first finished of {len(workflow_ids)} workflows",
            workflow_ids=workflow_ids,
        )
        return None if row is None else str(row["workflow_id"])

    def list(
        self,
        *,
        limit: int = 100,
        load_input: bool = True,
        load_output: bool = True,
        **filters: Any,
    ) -> list[WorkflowInfo]:
        """Workflows matching every given filter (a field of :class:`WorkflowFilter`, by
        name; None is no filter), newest first, with what each waits for
        (``WorkflowInfo.waiting``), in one statement. Without ``load_input`` or
        ``load_output`` their ``inputs`` or ``output`` is None, never read."""
        return self._read(
            "list workflows",
            filter_params(WorkflowFilter(**filters)),
            limit,
            load_input=load_input,
            load_output=load_output,
        )
