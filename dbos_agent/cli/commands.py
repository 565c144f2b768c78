"""One function per command, each ``(args, db)``: read or change the database, then show
the outcome as text or, with ``--json``, as one JSON document.

Nothing here imports or runs workflow code: cancel, resume, fork and resolve change
status and log in guarded statements (``_engine/operations.py``) and leave the run to a
process that has the function. Listing, reading and the operator's actions go through
:class:`~dbos_agent.Client` (over the command's open database), the one path that the
HTTP API and users' own code take too. How a step reads (a model reply's text, tokens
and cost) comes from the layer that wrote it, through
:func:`dbos_agent.records.describe_step`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

from .. import _documents as documents
from .. import (
    agent,  # noqa: F401  (registers how model steps are described)
)
from .._durations import format_duration
from .._engine.client import Client
from .._engine.retention import DEFAULT_STATUSES, check_statuses
from .._limits import check_identifier
from .._serialization import codec_for
from .._storage.database import SystemDatabase
from .._storage.rows import ForkResult, RewindResult
from .._storage.sql_files import migrations
from ..errors import WorkflowNotFoundError
from ..records import WorkflowInfo, WorkflowStatus, describe_step
from ..worker import import_app
from . import render
from .arguments import PROG

#: A message sent to a workflow in one of these is stored, but nothing will receive it.
_ENDED = (WorkflowStatus.SUCCESS, WorkflowStatus.ERROR)


def get_workflow(db: SystemDatabase, workflow_id: str) -> WorkflowInfo:
    return Client.over(db).get_workflow(workflow_id)


def who_runs_it(executor_id: str) -> str:
    return (
        f"it continues from its log in the first process with its function that claims it "
        f"(`{PROG} worker`, or a launch() with executor_id={executor_id!r})"
    )


def _warn(message: str) -> None:
    """One line on stderr for what worked but may not do what the caller wants."""
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def migrate(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Apply the missing migrations; name each one applied, and the database."""
    before = db.schema_version()
    after = db.migrate()
    if args.json:
        render.print_json(
            {"database_url": db.redacted_url, "schema_version": after, "previous_version": before}
        )
        return
    for version, name, _ in migrations():
        if before < version <= after:
            print(f"applied migration {name}")
    if before == after:
        print(f"dbos_agent schema is up to date (version {after}) at {db.redacted_url}")
    else:
        print(f"dbos_agent schema migrated from version {before} to {after} at {db.redacted_url}")


def list_workflows(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Workflows matching the filters, newest first."""
    found = Client.over(db).list_workflows(
        status=args.status,
        name=args.name,
        queue=args.queue,
        partition_key=args.partition,
        executor_id=args.executor,
        created_after=args.since,
        created_before=args.until,
        limit=args.limit,
        # the table shows neither; the JSON documents carry both
        load_input=args.json,
        load_output=args.json,
    )
    if args.json:
        render.print_json([documents.workflow_json(info) for info in found])
        return
    if not found:
        print("no workflows match")
        return
    rows = [
        [
            info.workflow_id,
            info.name,
            str(info.status),
            info.executor_id,
            render.ts(info.created_at),
            render.duration(documents.wall_seconds(info)),
            str(info.recovery_attempts),
            info.app_version or "-",
        ]
        for info in found
    ]
    headers = ["WORKFLOW ID", "NAME", "STATUS", "EXECUTOR", "CREATED (UTC)", "DURATION"]
    headers += ["RECOVERIES", "APP VERSION"]
    if any(info.partition_key for info in found):  # of a partitioned queue
        headers.append("PARTITION")
        for row, info in zip(rows, found, strict=True):
            row.append(info.partition_key or "-")
    if any(info.waiting for info in found):  # what unfinished ones wait for
        headers.append("WAITING FOR")
        for row, info in zip(rows, found, strict=True):
            row.append(render.waits(info))
    render.print_table(headers, rows, status_column=2)


def show(args: argparse.Namespace, db: SystemDatabase) -> None:
    """One workflow: inputs, status, outcome, timings, its origin, steps and tokens."""
    client = Client.over(db)
    info = client.get_workflow(args.workflow_id)
    steps = client.list_steps(info.workflow_id)
    edits = client.edits(info.workflow_id)
    digests = [describe_step(step) for step in steps]
    totals = documents.token_totals(digests)
    limits = client.get_event(info.workflow_id, documents.BUDGET_EVENT)
    budget = documents.budget_json(None if limits is None else json.dumps(limits), totals)
    if args.json:
        document = documents.workflow_json(info)
        document["budget"] = budget
        document["edits"] = edits
        edited = documents.edited_steps(edits)
        document["steps"] = [
            {**documents.step_json(s, d), "replayed": info.replayed(s), "edited": s.seq in edited}
            for s, d in zip(steps, digests, strict=True)
        ]
        document["usage"] = totals
        render.print_json(document)
        return
    version = f" (app version {info.app_version})" if info.app_version else ""
    fields: list[render.Field] = [
        ("Workflow", info.workflow_id),
        ("Name", info.name),
        ("Status", render.status_text(info.status)),
        *render.waiting_fields(info),
        *render.diverged_fields(info),
        ("Executor", info.executor_id + version),
        ("Created", render.ts(info.created_at) + " UTC"),
        ("Updated", render.ts(info.updated_at) + " UTC"),
        ("Finished", render.ts(info.finished_at) + (" UTC" if info.finished_at else "")),
        ("Duration", render.duration(documents.wall_seconds(info))),
        ("Recoveries", f"{info.recovery_attempts} of at most {info.max_recovery_attempts}"),
    ]
    fields += render.lineage_fields(info)
    fields += [("Edited", render.edit_text(edit)) for edit in edits]
    fields.append(("Inputs", render.clip(render.compact(info.inputs), render.DETAIL_CHARS)))
    if info.status is WorkflowStatus.SUCCESS:
        fields.append(("Output", render.clip(render.compact(info.output), render.DETAIL_CHARS)))
    if info.error:
        fields.append(("Error", render.clip(render.error_text(info.error), render.DETAIL_CHARS)))
    if totals is not None:
        fields.append(("Tokens", render.tokens_line(totals)))
    if budget is not None:
        fields.append(("Budget", render.budget_line(budget)))
    render.print_fields(fields)
    print()
    if steps:
        print(f"Steps ({len(steps)})")
        render.print_steps(steps, digests, show_all=args.all)
    else:
        print("No steps recorded.")


def steps(args: argparse.Namespace, db: SystemDatabase) -> None:
    """The recorded steps of a workflow: the library's own folded unless ``--all`` (the
    JSON document has every step, each saying whether it is ``internal``)."""
    found = Client.over(db).list_steps(args.workflow_id)
    digests = [describe_step(step) for step in found]
    if args.json:
        render.print_json([documents.step_json(s, d) for s, d in zip(found, digests, strict=True)])
    elif found:
        render.print_steps(found, digests, show_all=args.all)
    else:
        print("no steps recorded")


def fork(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Start a new workflow that reuses the recorded steps below ``--from-step``, its
    inputs and recorded outputs edited as ``--inputs`` and ``--replace`` say (checked
    against the code of ``--app`` when given)."""
    if args.app:
        import_app(args.app)
    handle = Client.over(db).fork(
        args.workflow_id,
        args.from_step,
        new_workflow_id=args.new_id,
        executor_id=args.executor,
        inputs=None if args.inputs is None else json.loads(args.inputs),
        replace=dict(args.replace or ()),
        by=args.by,
    )
    new_id, result = handle.workflow_id, handle.report
    assert isinstance(result, ForkResult)
    if args.json:
        render.print_json(
            {
                "workflow_id": new_id,
                "status": WorkflowStatus.PENDING,
                "forked_from": args.workflow_id,
                "forked_from_step": result.from_step,
                "requested_from_step": args.from_step,
                "copied_steps": result.copied_steps,
                "executor_id": result.executor_id,
            }
        )
    else:
        moved = (
            f" (moved back from step {args.from_step}: the approval asked there is asked again)"
            if result.from_step != args.from_step
            else ""
        )
        print(
            f"forked {args.workflow_id} from step {result.from_step}{moved} as {new_id} "
            f"({result.copied_steps} recorded step(s) reused); it is PENDING on executor "
            f"{result.executor_id!r}: {who_runs_it(result.executor_id)}"
        )


def rewind(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Run a stopped workflow again in place from ``--to-step``."""
    handle = Client.over(db).rewind(
        args.workflow_id, args.to_step, executor_id=args.executor, by=args.by
    )
    result = handle.report
    assert isinstance(result, RewindResult)
    if args.json:
        render.print_json({"workflow_id": args.workflow_id, **dataclasses.asdict(result)})
        return
    print(
        f"rewound {args.workflow_id} ({result.previous}) to step {args.to_step}: "
        f"{result.deleted_steps} step(s) deleted, {result.unconsumed_messages} message(s) "
        f"put back, {result.stream_items} stream item(s) and {result.events} event(s) "
        f"undone; it is {result.now} on executor {result.executor_id!r}: "
        f"{who_runs_it(result.executor_id)}"
    )


def retry(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Try now the steps of a workflow that wait out a failing dependency."""
    waiting = Client.over(db).retry(args.workflow_id)
    if args.json:
        render.print_json({"workflow_id": args.workflow_id, "retrying": waiting})
    else:
        steps = "1 step" if waiting == 1 else f"{waiting} steps"
        print(
            f"{args.workflow_id}: {steps} waiting for a retry will try now, in the process "
            "that waits for it or the first that can run it"
        )


def resolve(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Resolve an in-doubt step: record the result it had, or let it run again."""
    output: str | None = None if args.rerun else args.result
    client = Client.over(db)
    if output is None:
        client.resolve_in_doubt(args.workflow_id, args.seq, rerun=True)
    else:
        client.resolve_in_doubt(args.workflow_id, args.seq, result=json.loads(output))
    info = get_workflow(db, args.workflow_id)
    if args.json:
        render.print_json(
            {
                "workflow_id": args.workflow_id,
                "seq": args.seq,
                "settled": "rerun" if args.rerun else "result",
                "result": None if output is None else json.loads(output),
                "status": info.status,
            }
        )
    else:
        how = "it will run again" if args.rerun else "its result is recorded"
        print(
            f"resolved step {args.seq} of {args.workflow_id} ({how}); the workflow is "
            f"{info.status}: {who_runs_it(info.executor_id)}"
        )


def send(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Send a message durably. To a workflow that already ended it is still stored (the
    sender may not know), with a warning that nothing will receive it."""
    value: Any = args.message
    if not args.text:
        try:
            value = json.loads(args.message)
        except ValueError:
            value = args.message
    status = get_workflow(db, args.workflow_id).status
    inserted = Client.over(db).send(args.workflow_id, value, args.topic, args.idempotency_key)
    payload = codec_for(Any).dumps(value, f"message to workflow {args.workflow_id!r}")
    warning = None
    if inserted and status in _ENDED:
        warning = (
            f"workflow {args.workflow_id!r} already finished with status {status}: the message "
            f"is stored but nothing will ever receive it"
        )
        _warn(warning)
    if args.json:
        document = {
            "workflow_id": args.workflow_id,
            "topic": args.topic,
            "message": value,
            "sent": inserted,
        }
        render.print_json(document if warning is None else {**document, "warning": warning})
    elif inserted:
        topic = f" on topic {args.topic!r}" if args.topic else ""
        print(f"sent {render.clip(payload, render.SUMMARY_CHARS)} to {args.workflow_id}{topic}")
    else:
        print(
            f"a message with idempotency key {args.idempotency_key!r} was already sent to "
            f"{args.workflow_id}; nothing sent"
        )


def gc(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Delete finished workflows older than ``--older-than``, oldest first, in batches."""
    statuses = check_statuses(args.statuses or DEFAULT_STATUSES)
    with render.gc_progress(shown=not args.json) as progress:
        report = Client.over(db).garbage_collect(
            args.older_than,
            statuses=statuses,
            batch_size=args.batch_size,
            dry_run=args.dry_run,
            progress=progress,
        )
    if args.json:
        render.print_json(
            {
                **dataclasses.asdict(report),
                "older_than_seconds": args.older_than.total_seconds(),
                "statuses": statuses,
                "batch_size": args.batch_size,
            }
        )
        return
    what = (
        f"{report.workflows:,} workflow(s) finished more than {format_duration(args.older_than)} "
        f"ago ({', '.join(statuses)}), with {report.steps:,} step(s), {report.messages:,} "
        f"message(s) and {report.events:,} event(s) at {db.redacted_url}"
    )
    took = render.duration(report.seconds)
    if report.dry_run:
        print(
            f"would delete {what}, in {report.batches:,} batch(es) of at most "
            f"{args.batch_size:,}; dry run, nothing deleted ({took})"
        )
    else:
        print(f"deleted {what}, in {report.batches:,} batch(es) ({took})")


#: How often ``stream --follow`` looks for a workflow not started yet, at most.
_APPEAR_POLL_S = 0.5


def _appeared(db: SystemDatabase, workflow_id: str, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for ``workflow_id`` to be started (a reader started
    a moment before its writer), saying so once on stderr (stdout is the stream's);
    WorkflowNotFoundError if it is not by then."""
    deadline = time.monotonic() + timeout
    pause = 0.02
    check_identifier(workflow_id, "workflow id")
    if db.workflows.owner(workflow_id) is not None:
        return
    print(
        f"{PROG}: waiting for workflow {workflow_id!r} to start (up to {timeout:g} s)",
        file=sys.stderr,
        flush=True,
    )
    while db.workflows.owner(workflow_id) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise WorkflowNotFoundError(workflow_id)
        time.sleep(min(pause, left))
        pause = min(pause * 2, _APPEAR_POLL_S)


def stream(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Print a stream's items (waiting for more with --follow, until it ends; and, with
    --follow, up to --timeout seconds for a workflow not started yet)."""
    if args.follow:
        _appeared(db, args.workflow_id, args.timeout)
    else:
        get_workflow(db, args.workflow_id)
    items = Client.over(db).read_stream(
        args.workflow_id, args.key, args.offset, timeout=None if args.follow else 0
    )
    at_line_start = True
    try:
        for item in items:
            if args.json:
                render.print_json_line(
                    {
                        "offset": item.offset,
                        "value": item.value,
                        "reset": item.reset,
                        "step": item.step,
                        "attempt": item.attempt,
                    }
                )
                continue
            if item.reset:
                line = f"[step {item.step}: the output above from this step is void; it ran again]"
                print(("" if at_line_start else "\n") + line, flush=True)
                at_line_start = True
            elif isinstance(item.value, str):
                print(item.value, end="", flush=True)
                at_line_start = item.value.endswith("\n")
            else:
                print(("" if at_line_start else "\n") + json.dumps(item.value), flush=True)
                at_line_start = True
    except TimeoutError:  # without --follow: everything there is was printed
        pass
    if not args.json and not at_line_start:
        print()


def approvals(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Approval requests: one workflow's, or every pending one."""
    if args.workflow_id is not None:
        get_workflow(db, args.workflow_id)
    found = Client.over(db).approvals(args.workflow_id)
    if args.json:
        render.print_json([dataclasses.asdict(a) for a in found])
        return
    if not found:
        print("no approval requests" + ("" if args.workflow_id else " pending"))
        return
    rows = [
        [
            a.workflow_id,
            str(a.seq),
            a.tool,
            render.clip(render.compact(a.arguments), render.SUMMARY_CHARS),
            a.status,
            a.digest,
        ]
        for a in found
    ]
    render.print_table(["WORKFLOW ID", "STEP", "TOOL", "ARGUMENTS", "STATUS", "DIGEST"], rows)


def _decide(args: argparse.Namespace, db: SystemDatabase, approved: bool) -> None:
    client = Client.over(db)
    decision = client.approve if approved else client.reject
    decision(args.workflow_id, args.seq, args.digest, args.reason)
    verb = "approved" if approved else "rejected"
    if args.json:
        render.print_json({"workflow_id": args.workflow_id, "seq": args.seq, verb: True})
    else:
        print(f"{verb} the call at step {args.seq} of {args.workflow_id}; the workflow goes on")


def approve(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Approve a request (bound to its digest)."""
    _decide(args, db, True)


def reject(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Reject a request (bound to its digest)."""
    _decide(args, db, False)
