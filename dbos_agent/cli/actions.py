"""The operator's actions on workflows that take one id or many (``workflows cancel``,
``resume``, ``delete``): one id keeps the one-workflow action's answers and errors; several
ids, or filters, act in batches through the Client's bulk methods, and print what they
found and did."""

from __future__ import annotations

import argparse
import dataclasses

from .._engine.bulk import Action, BulkReport
from .._engine.client import Client
from .._storage.database import SystemDatabase
from .._storage.rows import ResumeResult
from ..errors import InvalidOptionError, WorkflowStatusError
from ..records import WorkflowFilter, WorkflowStatus
from . import render
from .arguments import PROG
from .commands import get_workflow, who_runs_it


def _where(args: argparse.Namespace) -> WorkflowFilter:
    return WorkflowFilter(
        status=args.status,
        name=args.name,
        queue_name=args.queue,
        partition_key=args.partition,
        older_than=args.older_than,
    )


def _one(args: argparse.Namespace) -> str | None:
    """The id of a one-workflow action (one ID, no filter, no dry run), else None."""
    if len(args.workflow_ids) == 1 and _where(args).empty and not args.dry_run:
        return str(args.workflow_ids[0])
    return None


_DONE = {"cancel": "cancelled", "resume": "resumed", "delete": "deleted"}


def _bulk(args: argparse.Namespace, db: SystemDatabase, action: Action) -> BulkReport:
    """Cancel, resume or delete the given ids or what the filters match; print the report."""
    where = _where(args)
    if not args.workflow_ids and where.empty and not args.all:
        raise InvalidOptionError(
            f"refusing to {action} every workflow: give IDs, a filter (--status, --name, "
            "--queue, --partition, --older-than), or --all"
        )
    client = Client.over(db)
    act = {
        "cancel": client.cancel_workflows,
        "resume": client.resume_workflows,
        "delete": client.delete_workflows,
    }[action]
    report = act(
        args.workflow_ids or None,
        where=where,
        all_workflows=args.all,
        dry_run=args.dry_run,
        batch_size=args.batch_size,
    )
    if args.json:
        render.print_json({**dataclasses.asdict(report), "skipped": report.skipped})
        return report
    verb = f"would {action}" if report.dry_run else _DONE[action]
    line = f"{verb} {report.changed:,} of {report.matched:,} matching workflow(s)"
    if report.children:
        line += f", and {report.children:,} unfinished workflow(s) they started"
    if report.skipped:
        line += f"; {report.skipped:,} left as they are (their status does not allow it)"
    if report.requested is not None and report.requested > report.matched:
        line += (
            f"; {report.requested - report.matched:,} of the {report.requested:,} given ids "
            "not found (or not matching the filters)"
        )
    dry = "; dry run, nothing changed" if report.dry_run else ""
    print(f"{line}{dry} ({report.statements:,} statement(s))")
    return report


def cancel(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Cancel a workflow (cancelling a cancelled one changes nothing: scripts may retry),
    or many: the given ids or what the filters match."""
    workflow_id = _one(args)
    if workflow_id is None:
        _bulk(args, db, "cancel")
        return
    previous = Client.over(db).cancel(workflow_id)
    changed = previous is not WorkflowStatus.CANCELLED
    if args.json:
        render.print_json(
            {
                "workflow_id": workflow_id,
                "status": WorkflowStatus.CANCELLED,
                "previous_status": previous,
                "changed": changed,
            }
        )
    elif changed:
        print(
            f"cancelled {workflow_id} (it was {previous}); a run in progress stops at its "
            f"next step boundary"
        )
    else:
        print(f"{workflow_id} was already CANCELLED; nothing changed")


def resume(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Make a cancelled or dead-lettered workflow PENDING again (an ENQUEUED or delayed
    one: start it now; a finished one: nothing to do), or many."""
    workflow_id = _one(args)
    if workflow_id is None:
        if args.executor is not None:
            raise InvalidOptionError("--executor goes with one ID (and no filter)")
        _bulk(args, db, "resume")
        return
    report = Client.over(db).resume(workflow_id, executor_id=args.executor).report
    assert isinstance(report, ResumeResult)
    result = report
    if not result.resumed:  # finished: nothing to do, as DBOS does
        if args.json:
            render.print_json({"workflow_id": workflow_id, "status": result.previous})
        else:
            print(f"{workflow_id} already finished ({result.previous}): nothing to resume")
        return
    if args.json:
        render.print_json(
            {
                "workflow_id": workflow_id,
                "status": result.now or WorkflowStatus.PENDING,
                "previous_status": result.previous,
                "executor_id": result.executor_id,
            }
        )
    else:
        print(
            f"resumed {workflow_id} (it was {result.previous}); it is PENDING on executor "
            f"{result.executor_id!r}: {who_runs_it(result.executor_id)}"
        )


def delete(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Delete finished workflows with their rows. One ID that cannot be deleted is an
    error (unknown, or unfinished), as for the other one-workflow actions."""
    workflow_id = _one(args)
    if workflow_id is None:
        _bulk(args, db, "delete")
        return
    status = get_workflow(db, workflow_id).status
    if Client.over(db).delete_workflows([workflow_id]).changed:
        if args.json:
            render.print_json({"workflow_id": workflow_id, "previous_status": status})
        else:
            print(f"deleted {workflow_id} (it was {status}) with its steps, messages and events")
        return
    status = get_workflow(db, workflow_id).status
    raise WorkflowStatusError(
        workflow_id,
        status,
        f"cannot delete workflow {workflow_id!r}: it is {status} (it may still run, or "
        f"waits for a person); cancel it first (`{PROG} workflows cancel {workflow_id}`)",
    )
