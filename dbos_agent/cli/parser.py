"""The command tree of ``dbos-agent``: every command, its options, and its help."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from .. import __version__, worker
from ..engine.retention import DEFAULT_BATCH_SIZE, DEFAULT_STATUSES, parse_duration
from ..limits import DEFAULT_MAX_CHECKPOINT_BYTES
from ..records import WorkflowStatus
from ..storage.database import SystemDatabase
from ..storage.dsn import URL_ENV
from ..web import serve
from . import arguments as types
from . import commands, deploys
from .arguments import PROG

#: What a command runs, on the database ``main`` opened for it (set as ``run``); it may
#: return the exit status (``check-deploy``: 1 when some workflow does not fit).
Run = Callable[[argparse.Namespace, SystemDatabase], int | None]


class UsageError(Exception):
    """A command line that does not fit the tree: :func:`parse` reports it (exit 2)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors :func:`parse` reports, as text or as JSON."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self, message)


def parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed; on a usage error, exit 2 after the Unix tool's usage and error
    line (``dbos-agent: error: ...``) or, with ``--json`` anywhere before ``--``, one JSON
    document ``{"error": ..., "type": "UsageError"}`` on stderr that a script can read."""
    try:
        return build_parser().parse_args(argv)
    except UsageError as exc:
        options = argv[: argv.index("--")] if "--" in argv else argv
        if "--json" in options:
            json.dump({"error": str(exc), "type": "UsageError"}, sys.stderr)
            sys.stderr.write("\n")
        else:
            exc.parser.print_usage(sys.stderr)
            sys.stderr.write(f"{PROG}: error: {exc}\n")
        raise SystemExit(2) from None


_DESCRIPTION = """\
Operate dbos_agent durable workflows from the database: list and inspect them, cancel,
resume or fork them, retry now what waits out a failing dependency, resolve in-doubt
steps, send them messages, delete old finished ones, list, pause, resume and backfill
cron schedules.
None of this needs your workflow code: resumed and forked workflows are run by a process
that has it (`dbos-agent worker --app ...`, or your app's next launch()).

database: --database-url, else $DBOS_AGENT_DATABASE_URL, else the embedded Postgres in
./.dbos_agent/ (only `migrate` and `worker` create it). A command line is visible to
every local user (ps): keep a password out of --database-url (use the variable, or
libpq's $PGPASSWORD or password file: $PGPASSFILE, else ~/.pgpass); no output or error
ever shows it. Output: tables, or one JSON
document with --json (`stream --json`: JSON Lines, one object per item; on an error:
{"error": ..., "type": ...}; a usage error with --json: that document on stderr).
exit status: 0 ok; 1 operational error (unknown id, wrong status, database unreachable);
2 usage error."""


def _database() -> argparse.ArgumentParser:
    """``--database-url``, defined once for the whole tree: accepted before or after any
    command (``worker`` and ``serve`` included). Its default is "absent", so that a
    subcommand's parse never overwrites a value given before the command."""
    database = _Parser(add_help=False)
    database.add_argument(
        "--database-url",
        metavar="URL",
        default=argparse.SUPPRESS,
        help=f"system database (default: ${URL_ENV}, else the embedded Postgres); visible "
        f"to other local users (ps): keep its password in ${URL_ENV}, $PGPASSWORD or "
        f"$PGPASSFILE",
    )
    return database


def _common() -> argparse.ArgumentParser:
    """Options accepted before or after the command (``dbos-agent workflows list --json``),
    absent unless given, as ``--database-url``'s."""
    common = _Parser(add_help=False, parents=[_database()])
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print one JSON document instead of tables (stream: JSON Lines, one per item)",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree (exposed for tests and documentation)."""
    common = _common()
    parser = _Parser(
        prog=PROG,
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    tree = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    tree.required = True
    _command(
        tree,
        common,
        "migrate",
        "apply the dbos_agent schema (numbered migrations) to the database",
        commands.migrate,
    )
    _add_workflows(tree, common)
    _add_steps(tree, common)
    _add_retry(tree, common)
    _add_send(tree, common)
    _add_stream(tree, common)
    _add_approvals(tree, common)
    _add_versions(tree, common)
    _add_gc(tree, common)
    _add_deploys(tree, common)
    _add_schedules(tree, common)
    _add_worker(tree)
    _add_serve(tree)
    return parser


_Group = argparse._SubParsersAction  # the object add_subparsers() returns


def _command(
    group: _Group[Any],
    common: argparse.ArgumentParser,
    name: str,
    help_text: str,
    run: Run | None,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """A (sub)command that accepts the common options; ``run`` is what it does."""
    command: argparse.ArgumentParser = group.add_parser(
        name,
        help=help_text,
        description=description or help_text,
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.set_defaults(run=run)
    return command


def _actions(command: argparse.ArgumentParser) -> _Group[Any]:
    actions = command.add_subparsers(dest="action", metavar="ACTION", title="actions")
    actions.required = True
    return actions


def _add_workflows(tree: _Group[Any], common: argparse.ArgumentParser) -> None:
    group = "list, inspect, cancel, resume and fork workflows"
    wf = _actions(_command(tree, common, "workflows", group, None))
    listing = _command(wf, common, "list", "list workflows, newest first", commands.list_workflows)
    listing.add_argument("--status", type=types.status, help=f"one of {', '.join(WorkflowStatus)}")
    listing.add_argument("--name", help="workflow (function) name")
    listing.add_argument("--executor", metavar="ID", help="executor id")
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

    show = _command(
        wf,
        common,
        "show",
        "one workflow: inputs, status, outcome, timings, steps, tokens",
        commands.show,
    )
    show.add_argument("workflow_id", metavar="ID", help="workflow id")
    steps = _command(wf, common, "steps", "the recorded steps of a workflow", commands.steps)
    steps.add_argument("workflow_id", metavar="ID", help="workflow id")

    cancel = _command(
        wf,
        common,
        "cancel",
        "cancel a workflow (a running one stops at its next step boundary)",
        commands.cancel,
        "Cancel a PENDING, SUSPENDED, ENQUEUED, DIVERGED, IN_DOUBT or dead-lettered workflow:\n"
        "it becomes CANCELLED. A run in progress stops at its next step boundary. Cancelling\n"
        "a CANCELLED workflow does nothing; a finished one (SUCCESS, ERROR) is an error.\n"
        "`resume` undoes a cancel.",
    )
    cancel.add_argument("workflow_id", metavar="ID", help="workflow id")

    resume = _command(
        wf,
        common,
        "resume",
        "continue a cancelled or dead-lettered workflow from its log",
        commands.resume,
        "Make a CANCELLED, MAX_RECOVERY_ATTEMPTS_EXCEEDED or DIVERGED workflow (or an IN_DOUBT\n"
        "one whose steps are all resolved) PENDING again; a dead letter gets its recovery\n"
        "attempts back, a diverged one forgets which code versions diverged on it (every\n"
        "process may try it again; it is held again if the code still does not fit). It\n"
        "continues from its log, without re-running recorded steps, in the first live process\n"
        "that has its function (every launched process takes such workflows over at once).\n"
        "An in-doubt step is resolved with `dbos-agent steps resolve` instead.",
    )
    resume.add_argument("workflow_id", metavar="ID", help="workflow id")
    resume.add_argument(
        "--executor", metavar="ID", help="hand it to this executor id (default: its own)"
    )

    fork = _command(
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


def _add_steps(tree: _Group[Any], common: argparse.ArgumentParser) -> None:
    st = _actions(_command(tree, common, "steps", "resolve in-doubt steps", None))
    resolve = _command(
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


def _add_retry(tree: _Group[Any], common: argparse.ArgumentParser) -> None:
    retry = _command(
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


def _add_send(tree: _Group[Any], common: argparse.ArgumentParser) -> None:
    send = _command(
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


def _add_approvals(tree: _Group[Any], common: argparse.ArgumentParser) -> None:
    listing = _command(
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
        decision = _command(
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


def _add_stream(tree: _Group[Any], common: argparse.ArgumentParser) -> None:
    stream = _command(
        tree,
        common,
        "stream",
        "print a workflow's durable stream (da.write_stream)",
        commands.stream,
        "Print the items of stream KEY of workflow ID from --from (default 0): text as it\n"
        "comes, other values as JSON lines, and a marked line where a step's earlier output\n"
        "was voided (a retried or re-run step). Without --follow it prints what is there and\n"
        "exits; with --follow it waits for more until the stream is closed or the workflow\n"
        "has finished. --json prints one JSON object per item (JSON Lines).",
    )
    stream.add_argument("workflow_id", metavar="ID", help="workflow id")
    stream.add_argument("key", metavar="KEY", help="stream key")
    stream.add_argument("--follow", "-f", action="store_true", help="wait for more items")
    stream.add_argument(
        "--from",
        dest="offset",
        type=types.natural,
        default=0,
        metavar="OFFSET",
        help="first offset to print (default 0)",
    )


def _add_versions(tree: _Group[Any], common: argparse.ArgumentParser) -> None:
    versions = _command(
        tree,
        common,
        "versions",
        "application versions: their unfinished workflows and the live sessions serving each",
        deploys.versions,
        "One row per application version (launch(app_version=...), `worker --app-version`;\n"
        "(none) for workflows and sessions without one) that has unfinished workflows or live\n"
        "executor sessions: its PENDING, ENQUEUED, SUSPENDED and DIVERGED workflows, how many\n"
        "of them processes of other versions may run too (accepted for those versions), and\n"
        "its live sessions with the code versions they run (a digest of each process's\n"
        "durable code, as check-deploy prints it; more than one under an application version\n"
        "is a rollout under way, or two builds sharing it). Live: not dead by the take-over\n"
        "rules, and not a process of this host that is gone. A session without a version\n"
        "runs the workflows of every version.\n"
        "--wide (or --json) names each session: executor id, host, pid and code version.",
    )
    versions.add_argument(
        "--wide",
        action="store_true",
        help="name each live session (executor@host:pid code-version)",
    )


def _add_gc(tree: _Group[Any], common: argparse.ArgumentParser) -> None:
    gc = _command(
        tree,
        common,
        "gc",
        "delete finished workflows older than an age, with their steps, messages and events",
        commands.gc,
        "Delete the workflows that finished more than AGE ago (SUCCESS, ERROR, CANCELLED and\n"
        "MAX_RECOVERY_ATTEMPTS_EXCEEDED unless --status says otherwise; never PENDING,\n"
        "ENQUEUED or IN_DOUBT) with their steps, the messages sent to them and their events.\n"
        "Oldest first, in batches of --batch-size workflows, each its own short transaction:\n"
        "safe while workers run. --dry-run only counts. `launch(retention=...)` and\n"
        f"`{PROG} worker --retention AGE` do the same in the background.",
    )
    gc.add_argument(
        "--older-than",
        type=parse_duration,
        required=True,
        metavar="AGE",
        help="finished more than AGE ago: 45s, 90m, 12h, 30d, 2w, or seconds",
    )
    gc.add_argument(
        "--status",
        dest="statuses",
        type=types.gc_status,
        action="extend",
        nargs="+",
        metavar="STATUS",
        help=f"delete only these (default: {' '.join(DEFAULT_STATUSES)})",
    )
    gc.add_argument(
        "--batch-size",
        type=types.positive,
        default=DEFAULT_BATCH_SIZE,
        metavar="N",
        help=f"workflows per transaction (default {DEFAULT_BATCH_SIZE})",
    )
    gc.add_argument(
        "--dry-run", action="store_true", help="count what would be deleted; delete nothing"
    )


def _add_deploys(tree: _Group[Any], common: argparse.ArgumentParser) -> None:
    check = _command(
        tree,
        common,
        "check-deploy",
        "replay the workflows in flight against new code: would any diverge?",
        deploys.check_deploy,
        "Import the app's new code (--app) and replay every unfinished workflow of the names\n"
        "it registers (PENDING, SUSPENDED, DIVERGED, ENQUEUED with a log) against it, running\n"
        "nothing live: no step, send, stream write or model call happens, and nothing is\n"
        "written (its connections are read-only). It prints, per workflow name and\n"
        "application version, how many fit and, for each that would not, the workflow, the\n"
        "position, the recorded and the called step. --histories FILE checks an export\n"
        f"(`{PROG} export`) instead of the database. --adopt --app-version V records that\n"
        "processes of version V may run the workflows of other versions that fit (one\n"
        "guarded statement each), so that the old processes can be retired.\n"
        "The app is imported in a child process, within --timeout, with launch() refused and\n"
        "every connection read-only: an import that raises, exits (sys.exit, os._exit),\n"
        "hangs, crashes, leaves a non-daemon thread running or launches a runtime fails the\n"
        "check, as does code that ends the process while it is replayed.\n"
        "exit status: 0 every workflow fits; 1 one does not, or an operational error (no\n"
        "database, a bad --histories file); 2 the new code could not be checked (above; one\n"
        "line says why, and with --json a JSON error document), or a usage error.",
    )
    check.add_argument(
        "--app", required=True, metavar="MODULE[:OBJECT]", help="the new code (imported)"
    )
    check.add_argument(
        "--app-version", metavar="V", help="the application version the new code runs as"
    )
    check.add_argument(
        "--adopt",
        action="store_true",
        help="let processes of --app-version run the workflows of other versions that fit",
    )
    check.add_argument(
        "--histories", metavar="FILE", help="check the workflows of an export (- for stdin)"
    )
    check.add_argument(
        "--timeout",
        type=types.positive_seconds,
        default=10.0,
        metavar="S",
        help="seconds the app's import, and each replay, may take (default 10)",
    )

    export = _command(
        tree,
        common,
        "export",
        "write workflows with their logs as JSON Lines (for import or check-deploy)",
        deploys.export,
        "Write each workflow ID (or, with --unfinished, every unfinished one) to stdout as\n"
        "one JSON document per line: its row, steps, messages, events, streams and\n"
        f"approvals, values as stored. `{PROG} import` loads them into another database;\n"
        f"`{PROG} check-deploy --histories FILE` checks new code against them.",
    )
    export.add_argument("workflow_ids", metavar="ID", nargs="*", help="workflow ids")
    export.add_argument(
        "--unfinished", action="store_true", help="every unfinished workflow instead of IDs"
    )
    export.add_argument("--name", help="with --unfinished: only workflows of this name")

    imported = _command(
        tree,
        common,
        "import",
        "load workflows written by export into this database",
        deploys.import_,
        "Load the workflows of FILE (- for stdin), written by `export`: each with its log,\n"
        "messages, events, streams and approvals, whole or not at all; an id that exists\n"
        "here is skipped. Imported workflows are owned by nobody: an unfinished one is run\n"
        "by the first process with its code that takes it over, as a resumed one is.\n"
        "Every line is checked first by the engine's rules (ids, the checkpoint size limit,\n"
        "JSON depth, UTF-8, step numbers, each status and the fields it requires, one line\n"
        "per workflow); a line that breaks one is named (file, line, field) and nothing of\n"
        "the file is written: the file is imported whole, in one transaction, or not at all.",
    )
    imported.add_argument("file", metavar="FILE", help="an export (- for stdin)")
    imported.add_argument(
        "--max-checkpoint-bytes",
        type=types.positive,
        default=DEFAULT_MAX_CHECKPOINT_BYTES,
        metavar="N",
        help="the largest JSON value a line may hold, as launch(max_checkpoint_bytes=N) "
        f"(default {DEFAULT_MAX_CHECKPOINT_BYTES:,})",
    )


def _add_schedules(tree: _Group[Any], common: argparse.ArgumentParser) -> None:
    listing = "list cron schedules: cron, time zone, pause, last and next slots, last run"
    command = _command(
        tree,
        common,
        "schedules",
        "list cron schedules (@scheduled); pause, resume or backfill one",
        commands.schedules,
        "Without an action: every schedule recorded in the database (a process that defines\n"
        "one records it when it launches), with its latest slot's workflow and status and its\n"
        "next slot. Slots are shown in UTC; the workflow of a slot has the id NAME@SLOT.",
    )
    actions = command.add_subparsers(dest="action", metavar="ACTION", title="actions")
    _command(actions, common, "list", listing, commands.schedules)
    pause = _command(
        actions,
        common,
        "pause",
        "pause a schedule in every process: its slots pass without runs",
        commands.pause_schedule,
    )
    pause.add_argument("name", metavar="NAME", help="schedule name")
    resume = _command(
        actions,
        common,
        "resume",
        "resume a paused schedule from its next slot",
        commands.resume_schedule,
        "Resume a paused schedule: it runs again from its next slot. The slots that came due\n"
        "while it was paused are not caught up; `backfill` runs them.",
    )
    resume.add_argument("name", metavar="NAME", help="schedule name")
    backfill = _command(
        actions,
        common,
        "backfill",
        "run every slot in a range that has not run, once each",
        commands.backfill,
        "Record, for every slot of the schedule from --from to --to (up to now) that has no\n"
        "workflow yet, its workflow (id NAME@SLOT): PENDING and owned by no process, so the\n"
        "first live process with the workflow's code takes it over and runs it (every\n"
        "launched process does, at once). A slot that ran (or was backfilled) is never run\n"
        "again; the overlap policy\n"
        "and a pause do not apply. A range of more than 10,000 slots is refused.",
    )
    backfill.add_argument("name", metavar="NAME", help="schedule name")
    for flag, dest, what in (("--from", "start", "first"), ("--to", "end", "last")):
        backfill.add_argument(
            flag,
            dest=dest,
            type=types.when,
            required=True,
            metavar="WHEN",
            help=f"{what} slot time (inclusive): ISO time (UTC unless it says) or 30m, 2h, 7d ago",
        )


def _add_worker(tree: _Group[Any]) -> None:
    """``worker``: the daemon's own options (:func:`dbos_agent.worker.add_arguments`).

    It runs an executor on connections of its own, so it has no ``run`` on the CLI's
    database: ``main`` hands it to :func:`dbos_agent.worker.run`. Its ``--database-url``
    may also come before the command (``dbos-agent --database-url URL worker ...``): the
    worker leaves it absent unless given."""
    command: argparse.ArgumentParser = tree.add_parser(
        "worker",
        help="run the recovery daemon for your app: recover, take over orphans, run queues, "
        "fire schedules",
        description=worker.DESCRIPTION,
        parents=[_database()],
    )
    worker.add_arguments(command, database_url=False)


def _add_serve(tree: _Group[Any]) -> None:
    """``serve``: the web API and dashboard (:mod:`dbos_agent.web.serve`), on a process of
    their own like ``worker``."""
    command: argparse.ArgumentParser = tree.add_parser(
        "serve",
        help="serve the JSON API and the web dashboard",
        description=serve.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_database()],
    )
    serve.add_arguments(command)
