"""The workflow commands of ``dbos-agent``: ``workflows``, ``steps``, ``retry``, ``send``,
``approvals`` (with ``approve``, ``reject``) and ``stream``, with their options and help."""

from __future__ import annotations

import argparse
from typing import Any

from ..records import WorkflowStatus
from . import actions, commands
from . import arguments as types
from .building import Group, add_actions, add_command


def add_workflows(tree: Group[Any], common: argparse.ArgumentParser) -> None:
    group = "list, inspect, cancel, resume, fork, rewind and delete workflows"
    wf = add_actions(add_command(tree, common, "workflows", group, None))
    listing = add_command(
        wf, common, "list", "list workflows, newest first", commands.list_workflows
    )
    listing.add_argument("--status", type=types.status, help=f"one of {', '.join(WorkflowStatus)}")
    listing.add_argument("--name", help="workflow (function) name")
    listing.add_argument("--executor", metavar="ID", help="executor id")
    listing.add_argument("--queue", metavar="NAME", help="queue name")
    listing.add_argument(
        "--partition", metavar="KEY", help="partition key (of a partitioned queue)"
    )
    listing.add_argument(
        "--since",
        type=types.when,
        metavar="WHEN",
        help="created at or after: ISO time or 30m, 2h, 7d",
    )
    listing.add_argument("--until", type=types.when, metavar="WHEN", help="created before WHEN")
    listing.add_argument(
        "--limit", type=types.positive, default=50, metavar="N", help="at most N (default 50)"
    )

    show = add_command(
        wf,
        common,
        "show",
        "one workflow: inputs, status, what it waits for, outcome, timings, steps, tokens",
        commands.show,
    )
    show.add_argument("workflow_id", metavar="ID", help="workflow id")
    steps = add_command(
        wf,
        common,
        "steps",
        "the recorded steps of a workflow",
        commands.steps,
        "The recorded steps of workflow ID, in log order: what each did, its attempts,\n"
        "timings and tokens. The steps the library records for itself (dbos_agent.*: a\n"
        "stream's writes, a patch's marker, a message received...) are folded into one line\n"
        "once they have their outcome; --all shows them. --json has every step, each with\n"
        '"internal" (true for those).',
    )
    steps.add_argument("workflow_id", metavar="ID", help="workflow id")
    for command in (show, steps):
        command.add_argument(
            "--all",
            action="store_true",
            help="show the library's own steps too (dbos_agent.*), folded by default",
        )

    cancel = add_command(
        wf,
        common,
        "cancel",
        "cancel workflows (a running one stops at its next step boundary)",
        actions.cancel,
        "Cancel a PENDING, SUSPENDED, ENQUEUED, DIVERGED, IN_DOUBT or dead-lettered workflow:\n"
        "it becomes CANCELLED, with the unfinished workflows it started. A run in progress\n"
        "stops at its next step boundary. Cancelling a CANCELLED workflow does nothing; a\n"
        "finished one (SUCCESS, ERROR) is an error. `resume` undoes a cancel.\n"
        f"{_BULK}",
    )
    _bulk_options(cancel)

    resume = add_command(
        wf,
        common,
        "resume",
        "continue cancelled or dead-lettered workflows from their logs",
        actions.resume,
        "Make a CANCELLED, MAX_RECOVERY_ATTEMPTS_EXCEEDED or DIVERGED workflow (or an IN_DOUBT\n"
        "one whose steps are all resolved) PENDING again; a dead letter gets its recovery\n"
        "attempts back, a diverged one forgets which code versions diverged on it (every\n"
        "process may try it again; it is held again if the code still does not fit). It\n"
        "continues from its log, without re-running recorded steps, in the first live process\n"
        "that has its function (every launched process takes such workflows over at once).\n"
        "An in-doubt step is resolved with `dbos-agent steps resolve` instead.\n"
        f"{_BULK}",
    )
    _bulk_options(resume)
    resume.add_argument(
        "--executor",
        metavar="ID",
        help="hand it to this executor id (one ID only; default: its own)",
    )

    delete = add_command(
        wf,
        common,
        "delete",
        "delete finished workflows with their steps, messages, events and streams",
        actions.delete,
        "Delete finished workflows (SUCCESS, ERROR, CANCELLED, dead-lettered) with their\n"
        "steps, messages, events, streams and approval requests. An unfinished one (PENDING,\n"
        "ENQUEUED, SUSPENDED, DIVERGED) or an IN_DOUBT one is not deleted: cancel it first. The\n"
        "workflows a deleted one started are kept. `gc` deletes by age in the background.\n"
        f"{_BULK}",
    )
    _bulk_options(delete)

    fork = add_command(
        wf,
        common,
        "fork",
        "start a new workflow that reuses the steps before N and runs live from N",
        commands.fork,
        "Start a new workflow with the same function and inputs whose log is a copy of the\n"
        "original's recorded steps 0..N-1: it replays those and runs live from step N (rerun\n"
        "an agent from turn N with a fixed tool). The original is not changed. A DIVERGED\n"
        "workflow can be forked from the step where it diverged or an earlier one: the fork\n"
        "runs on with the code now deployed.",
    )
    fork.add_argument("workflow_id", metavar="ID", help="the workflow to fork")
    fork.add_argument(
        "--from-step", type=types.natural, required=True, metavar="N", help="first step to run live"
    )
    fork.add_argument("--id", dest="new_id", type=types.nonempty, help="id of the new workflow")
    fork.add_argument(
        "--executor", metavar="ID", help="executor id of the new workflow (default: the original's)"
    )
    fork.add_argument(
        "--inputs",
        type=types.json_object,
        metavar="JSON",
        help='edited inputs: {"param": value, ...} replaces those arguments',
    )
    fork.add_argument(
        "--replace",
        type=types.replacement,
        action="append",
        metavar="N=JSON",
        help="give replayed step N (or N:NAME, checked) this recorded output; repeatable",
    )
    fork.add_argument(
        "--app",
        metavar="MODULE",
        help="import this module (module[:object]) to check the edits against its "
        "signature and return annotations (without it only the log is checked)",
    )
    fork.add_argument("--by", help="who the edits are recorded as (default: the OS user)")

    rewind = add_command(
        wf,
        common,
        "rewind",
        "run a stopped workflow again in place from step N",
        commands.rewind,
        "Delete the workflow's steps N and later and run it again from step N under its own\n"
        "id, in the first live process that has its function. In the same transaction the\n"
        "messages those steps received are put back (a later recv takes them again), the\n"
        "stream items they wrote are deleted (a close among them too), each event they set\n"
        "goes back to the value its last kept set_event gave it (or is deleted), and their\n"
        "approval requests are asked again. Finished, cancelled, dead-lettered, DIVERGED,\n"
        "IN_DOUBT and SUSPENDED workflows can be rewound; a PENDING one may be running:\n"
        "cancel it first. Recorded in the workflow's edits (workflows show).",
    )
    rewind.add_argument("workflow_id", metavar="ID", help="the workflow to rewind")
    rewind.add_argument(
        "--to-step", type=types.natural, required=True, metavar="N", help="first step to run again"
    )
    rewind.add_argument(
        "--executor", metavar="ID", help="hand it to this executor id (default: its own)"
    )
    rewind.add_argument("--by", help="who the rewind is recorded as (default: the OS user)")


_BULK = (
    "\nMany at once: several IDs, or, without IDs, every workflow matching the filters\n"
    "(--status, --name, --queue, --partition, --older-than, all together); with\n"
    "neither, --all must say so. Each batch of --batch-size ids is one statement that\n"
    "checks each workflow's status as the one-workflow action does: the ones it does\n"
    "not allow are left and counted, not an error. --dry-run counts what would change,\n"
    "changing nothing."
)


def _bulk_options(command: argparse.ArgumentParser) -> None:
    """The ids or filters of a bulk action (``workflows cancel|resume|delete``)."""
    command.add_argument("workflow_ids", metavar="ID", nargs="*", help="workflow ids")
    command.add_argument(
        "--status", type=types.status, help=f"only these: one of {', '.join(WorkflowStatus)}"
    )
    command.add_argument("--name", help="only workflows of this (function) name")
    command.add_argument("--queue", metavar="NAME", help="only workflows of this queue")
    command.add_argument(
        "--partition", metavar="KEY", help="only workflows of this partition (tenant)"
    )
    command.add_argument(
        "--older-than",
        type=types.age,
        metavar="AGE",
        help="only workflows created more than AGE ago (45s, 90m, 12h, 30d, 2w)",
    )
    command.add_argument(
        "--all", action="store_true", help="every workflow, when no ID nor filter is given"
    )
    command.add_argument(
        "--dry-run", action="store_true", help="count what would change; change nothing"
    )
    command.add_argument(
        "--batch-size",
        type=types.positive,
        default=1000,
        metavar="N",
        help="ids per statement (default 1000)",
    )


def add_steps(tree: Group[Any], common: argparse.ArgumentParser) -> None:
    listing = "a workflow's steps are listed by `dbos-agent workflows steps ID`"
    st = add_actions(
        add_command(
            tree,
            common,
            "steps",
            "resolve in-doubt steps",
            None,
            f"Resolve in-doubt steps ({listing}).",
            hint=listing,
        )
    )
    resolve = add_command(
        st,
        common,
        "resolve",
        "resolve an in-doubt step of an IN_DOUBT workflow, which then continues",
        commands.resolve,
        "A non-idempotent step started before a crash and recorded no result: it may or may\n"
        "not have taken effect. Check the outside world, then either record the result it had\n"
        "(--result JSON: it happened) or let it run again (--rerun: it did not). The workflow\n"
        "becomes PENDING and continues in the first process with its function that claims it.",
    )
    resolve.add_argument("workflow_id", metavar="ID", help="workflow id")
    resolve.add_argument("seq", type=types.natural, metavar="SEQ", help="position of the step")
    outcome = resolve.add_mutually_exclusive_group(required=True)
    outcome.add_argument(
        "--result", type=types.json_value, metavar="JSON", help="the result it had (JSON)"
    )
    outcome.add_argument("--rerun", action="store_true", help="it did not happen: run it again")


def add_retry(tree: Group[Any], common: argparse.ArgumentParser) -> None:
    retry = add_command(
        tree,
        common,
        "retry",
        "try now the steps of a workflow that wait out a failing dependency",
        commands.retry,
        "A step whose dependency fails (the model API overloaded, an MCP server down) waits\n"
        "for its next attempt without recording an error (RETRYING; `workflows show` says\n"
        "what it waits for, since when and its next attempt). This makes that attempt due\n"
        "now: a SUSPENDED workflow wakes in the first live process that can run it, one that\n"
        "waits in a process tries at once. An unknown or finished workflow, or one with no\n"
        "step waiting for a retry, is an error.",
    )
    retry.add_argument("workflow_id", metavar="ID", help="workflow id")


def add_send(tree: Group[Any], common: argparse.ArgumentParser) -> None:
    send = add_command(
        tree,
        common,
        "send",
        "send a message to a workflow (it receives it with recv)",
        commands.send,
        "Send MESSAGE to the workflow ID, durably: it waits in the database until the\n"
        "workflow receives it with da.recv(topic). MESSAGE is a JSON value; text that is not\n"
        "JSON is sent as a string (--text always sends a string). Sending to a workflow that\n"
        "already finished (SUCCESS, ERROR) stores the message with a warning: nothing will\n"
        "receive it.",
    )
    send.add_argument("workflow_id", metavar="ID", help="destination workflow id")
    send.add_argument("message", metavar="MESSAGE", help="a JSON value, or text")
    send.add_argument("--topic", help="topic (default: the default topic)")
    send.add_argument(
        "--idempotency-key", metavar="KEY", help="send at most once with this key (for retries)"
    )
    send.add_argument("--text", action="store_true", help="send MESSAGE as a string, as is")


def add_approvals(tree: Group[Any], common: argparse.ArgumentParser) -> None:
    listing = add_command(
        tree,
        common,
        "approvals",
        "list approval requests: a workflow's, or every pending one",
        commands.approvals,
        "List what workflows ask humans to approve (da.request_approval, tools with\n"
        "requires_approval): the step, the tool, its arguments and the digest a decision\n"
        "must give. Without ID: every PENDING request.",
    )
    listing.add_argument("workflow_id", metavar="ID", nargs="?", help="one workflow's requests")
    for name, verb in (("approve", "approve"), ("reject", "reject")):
        decision = add_command(
            tree,
            common,
            name,
            f"{verb} the tool call a workflow asks about (bound to its digest)",
            commands.approve if name == "approve" else commands.reject,
            f"{verb.capitalize()} the request at step SEQ of workflow ID. --digest must be the\n"
            "request's (see `approvals ID`): a decision for other arguments, a second one, or\n"
            "one for a workflow that no longer waits is refused.",
        )
        decision.add_argument("workflow_id", metavar="ID", help="workflow id")
        decision.add_argument("seq", type=types.natural, metavar="SEQ", help="its step")
        decision.add_argument("--digest", required=True, help="the request's digest")
        decision.add_argument("--reason", help="why (the workflow gets it)")


def add_stream(tree: Group[Any], common: argparse.ArgumentParser) -> None:
    stream = add_command(
        tree,
        common,
        "stream",
        "print a workflow's durable stream (da.write_stream)",
        commands.stream,
        "Print the items of stream KEY of workflow ID from --from (default 0): text as it\n"
        "comes, other values as JSON lines, and a marked line where a step's earlier output\n"
        "was voided (a retried or re-run step). Without --follow it prints what is there and\n"
        "exits; with --follow it waits for more until the stream is closed or the workflow\n"
        "has finished, and first, up to --timeout seconds, for a workflow not started yet.\n"
        "--json prints one JSON object per item (JSON Lines).",
    )
    stream.add_argument("workflow_id", metavar="ID", help="workflow id")
    stream.add_argument("key", metavar="KEY", help="stream key")
    stream.add_argument("--follow", "-f", action="store_true", help="wait for more items")
    stream.add_argument(
        "--timeout",
        type=types.positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="with --follow: how long to wait for a workflow not started yet (default 60)",
    )
    stream.add_argument(
        "--from",
        dest="offset",
        type=types.natural,
        default=0,
        metavar="OFFSET",
        help="first offset to print (default 0)",
    )
