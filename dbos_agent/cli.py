"""``dbos-agent``: operate durable workflows from a terminal or a script.

It works from the database alone: it never imports or runs the user's
workflow functions and never recovers anything. Cancel, resume, fork and
settle change status and log in guarded statements (see
``engine/operations.py``); the run itself is left to whichever process has
the function (``dbos-agent worker``, or the app's next ``launch()``).

Human-readable tables by default, one JSON document on stdout with
``--json``. Errors go to stderr as ``dbos-agent: error: ...``; exit status 0
on success, 1 for operational errors (unknown id, wrong status, database
unreachable), 2 for usage errors. No password ever appears in the output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn

import psycopg

from . import __version__
from .engine.retention import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_STATUSES,
    GcReport,
    check_statuses,
    format_duration,
    garbage_collect_db,
    parse_duration,
)
from .errors import DbosAgentError, WorkflowNotFoundError
from .records import StepInfo, StepStatus, WorkflowInfo, WorkflowStatus
from .serialization import codec_for
from .storage.database import SystemDatabase
from .storage.dsn import scrub
from .storage.sql_files import migrations

PROG = "dbos-agent"
URL_ENV = "DBOS_AGENT_DATABASE_URL"
_SUMMARY_CHARS = 60
_DETAIL_CHARS = 400
#: A long `gc` prints how far it got this often (on stderr).
_PROGRESS_EVERY_S = 2.0


class CliError(Exception):
    """An expected, operational failure: message to stderr, exit status 1."""


class _Parser(argparse.ArgumentParser):
    """argparse with the Unix tool's error line: ``dbos-agent: error: ...``, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{PROG}: error: {message}\n")


# -- argument types (a bad value is a usage error, exit 2) ------------------------------


def _when(text: str) -> datetime:
    """An ISO time (UTC unless it says otherwise) or a duration ago: 30m, 2h, 7d."""
    try:
        return datetime.now(UTC) - parse_duration(text, unit_required=True)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO time (2026-12-02, 2026-12-02T17:30Z) "
            f"nor a duration ago (90s, 30m, 2h, 7d, 1w)"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _status(text: str) -> WorkflowStatus:
    try:
        return WorkflowStatus(text.strip().upper())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a status; choose from {', '.join(WorkflowStatus)}"
        ) from None


def _gc_status(text: str) -> WorkflowStatus:
    """A status `gc` may delete (never one that may still run or wait for a person)."""
    try:
        return check_statuses([_status(text)])[0]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _natural(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return value


def _positive(text: str) -> int:
    value = _natural(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _json_value(text: str) -> str:
    """Validate JSON text and return it normalised (parsed once here, stored as jsonb)."""
    try:
        return json.dumps(json.loads(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None


def _nonempty(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


# -- the parser -------------------------------------------------------------------------

_DESCRIPTION = """\
Operate dbos_agent durable workflows from the database: list and inspect them, cancel,
resume or fork them, settle in-doubt steps, send them messages, delete old finished ones.
None of this needs your workflow code: resumed and forked workflows are run by a process
that has it (`dbos-agent worker --app ...`, or your app's next launch()).

database: --database-url, else $DBOS_AGENT_DATABASE_URL, else the embedded Postgres in
./.dbos_agent/. Output: tables, or one JSON document with --json.
exit status: 0 ok; 1 operational error (unknown id, wrong status, database unreachable);
2 usage error."""


def _common() -> argparse.ArgumentParser:
    """Options accepted before or after the command (``dbos-agent workflows list --json``)."""
    common = _Parser(add_help=False)
    common.add_argument(
        "--database-url",
        metavar="URL",
        default=argparse.SUPPRESS,
        help=f"system database (default: ${URL_ENV}, else the embedded Postgres)",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print one JSON document instead of tables",
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
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    commands.required = True

    def sub(
        group: argparse._SubParsersAction[Any],
        name: str,
        help_text: str,
        run: Callable[[argparse.Namespace, SystemDatabase], object] | None,
        description: str | None = None,
    ) -> argparse.ArgumentParser:
        command: argparse.ArgumentParser = group.add_parser(
            name,
            help=help_text,
            description=description or help_text,
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.set_defaults(run=run)
        return command

    sub(
        commands,
        "migrate",
        "apply the dbos_agent schema (numbered migrations) to the database",
        _cmd_migrate,
    )

    workflows = sub(commands, "workflows", "list, inspect, cancel, resume and fork workflows", None)
    wf = workflows.add_subparsers(dest="action", metavar="ACTION", title="actions")
    wf.required = True
    listing = sub(wf, "list", "list workflows, newest first", _cmd_list)
    listing.add_argument("--status", type=_status, help=f"one of {', '.join(WorkflowStatus)}")
    listing.add_argument("--name", help="workflow (function) name")
    listing.add_argument("--executor", metavar="ID", help="executor id")
    listing.add_argument(
        "--since", type=_when, metavar="WHEN", help="created at or after: ISO time or 30m, 2h, 7d"
    )
    listing.add_argument("--until", type=_when, metavar="WHEN", help="created before WHEN")
    listing.add_argument(
        "--limit", type=_positive, default=50, metavar="N", help="at most N (default 50)"
    )

    show = sub(
        wf,
        "show",
        "one workflow: inputs, status, outcome, timings, steps, tokens",
        _cmd_show,
    )
    show.add_argument("workflow_id", metavar="ID", help="workflow id")
    steps = sub(wf, "steps", "the recorded steps of a workflow", _cmd_steps)
    steps.add_argument("workflow_id", metavar="ID", help="workflow id")

    cancel = sub(
        wf,
        "cancel",
        "cancel a workflow (a running one stops at its next step boundary)",
        _cmd_cancel,
        "Cancel a PENDING, ENQUEUED, IN_DOUBT or dead-lettered workflow: it becomes CANCELLED.\n"
        "A run in progress stops at its next step boundary. Cancelling a CANCELLED workflow\n"
        "does nothing; a finished one (SUCCESS, ERROR) is an error. `resume` undoes a cancel.",
    )
    cancel.add_argument("workflow_id", metavar="ID", help="workflow id")

    resume = sub(
        wf,
        "resume",
        "continue a cancelled or dead-lettered workflow from its log",
        _cmd_resume,
        "Make a CANCELLED or MAX_RECOVERY_ATTEMPTS_EXCEEDED workflow (or an IN_DOUBT one whose\n"
        "steps are all settled) PENDING again; a dead letter gets its recovery attempts back.\n"
        "It continues from its log, without re-running recorded steps, in the first process\n"
        "that has its function and claims it: `dbos-agent worker`, or a launch() of its\n"
        "executor. An in-doubt step is settled with `dbos-agent steps resolve` instead.",
    )
    resume.add_argument("workflow_id", metavar="ID", help="workflow id")
    resume.add_argument(
        "--executor", metavar="ID", help="hand it to this executor id (default: its own)"
    )

    fork = sub(
        wf,
        "fork",
        "start a new workflow that reuses the steps before N and runs live from N",
        _cmd_fork,
        "Start a new workflow with the same function and inputs whose log is a copy of the\n"
        "original's recorded steps 0..N-1: it replays those and runs live from step N (rerun\n"
        "an agent from turn N with a fixed tool). The original is not changed.",
    )
    fork.add_argument("workflow_id", metavar="ID", help="the workflow to fork")
    fork.add_argument(
        "--from-step", type=_natural, required=True, metavar="N", help="first step to run live"
    )
    fork.add_argument("--id", dest="new_id", type=_nonempty, help="id of the new workflow")
    fork.add_argument(
        "--executor", metavar="ID", help="executor id of the new workflow (default: the original's)"
    )

    step_cmds = sub(commands, "steps", "settle in-doubt steps", None)
    st = step_cmds.add_subparsers(dest="action", metavar="ACTION", title="actions")
    st.required = True
    resolve = sub(
        st,
        "resolve",
        "settle an in-doubt step of an IN_DOUBT workflow, which then continues",
        _cmd_resolve,
        "A non-idempotent step started before a crash and recorded no result: it may or may\n"
        "not have taken effect. Check the outside world, then either record the result it had\n"
        "(--result JSON: it happened) or let it run again (--rerun: it did not). The workflow\n"
        "becomes PENDING and continues in the first process with its function that claims it.",
    )
    resolve.add_argument("workflow_id", metavar="ID", help="workflow id")
    resolve.add_argument("seq", type=_natural, metavar="SEQ", help="position of the step")
    outcome = resolve.add_mutually_exclusive_group(required=True)
    outcome.add_argument(
        "--result", type=_json_value, metavar="JSON", help="the result it had (JSON)"
    )
    outcome.add_argument("--rerun", action="store_true", help="it did not happen: run it again")

    send = sub(
        commands,
        "send",
        "send a message to a workflow (it receives it with recv)",
        _cmd_send,
        "Send MESSAGE to the workflow ID, durably: it waits in the database until the\n"
        "workflow receives it with da.recv(topic). MESSAGE is a JSON value; text that is not\n"
        "JSON is sent as a string (--text always sends a string).",
    )
    send.add_argument("workflow_id", metavar="ID", help="destination workflow id")
    send.add_argument("message", metavar="MESSAGE", help="a JSON value, or text")
    send.add_argument("--topic", help="topic (default: the default topic)")
    send.add_argument(
        "--idempotency-key", metavar="KEY", help="send at most once with this key (for retries)"
    )
    send.add_argument("--text", action="store_true", help="send MESSAGE as a string, as is")

    gc = sub(
        commands,
        "gc",
        "delete finished workflows older than an age, with their steps, messages and events",
        _cmd_gc,
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
        type=_gc_status,
        action="extend",
        nargs="+",
        metavar="STATUS",
        help=f"delete only these (default: {' '.join(DEFAULT_STATUSES)})",
    )
    gc.add_argument(
        "--batch-size",
        type=_positive,
        default=DEFAULT_BATCH_SIZE,
        metavar="N",
        help=f"workflows per transaction (default {DEFAULT_BATCH_SIZE})",
    )
    gc.add_argument(
        "--dry-run", action="store_true", help="count what would be deleted; delete nothing"
    )

    commands.add_parser(
        "worker",
        help="run the recovery daemon for your app (dbos-agent worker --help)",
        add_help=False,
    )
    return parser


# -- the database -----------------------------------------------------------------------


def _database_url(args: argparse.Namespace) -> str:
    url: str | None = getattr(args, "database_url", None) or os.environ.get(URL_ENV)
    if url:
        return url
    from .storage.embedded import embedded_database_url

    try:
        return embedded_database_url()
    except Exception as exc:  # no server binaries, a broken data directory, ...
        raise CliError(f"cannot start the embedded Postgres in ./.dbos_agent/: {exc}") from None


def _check_schema(db: SystemDatabase) -> None:
    """Refuse to work on a schema this version does not match (never migrate implicitly)."""
    known = migrations()[-1][0]
    found = db.schema_version()
    if found == known:
        return
    if found == 0:
        raise CliError(
            f"the database at {db.redacted_url} has no dbos_agent schema; "
            f"run `{PROG} migrate` (or check --database-url)"
        )
    if found < known:
        raise CliError(
            f"the database at {db.redacted_url} has dbos_agent schema version {found}, "
            f"this {PROG} needs {known}; run `{PROG} migrate`"
        )
    raise CliError(
        f"the database at {db.redacted_url} has dbos_agent schema version {found}, newer than "
        f"this {PROG} knows ({known}); upgrade dbos-agent"
    )


# -- rendering --------------------------------------------------------------------------


def _ts(when: datetime | None) -> str:
    return "-" if when is None else when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms" if seconds >= 0.001 else f"{seconds * 1000:.2f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _summary(value: Any) -> str:
    """One line for a step result: an Anthropic Message as its stop reason and blocks."""
    if not (isinstance(value, dict) and value.get("type") == "message"):
        return _compact(value)
    content = value.get("content")
    if not isinstance(content, list):
        return _compact(value)
    parts = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            parts.append(_compact(block.get("text", "")))
        elif block.get("type") == "tool_use":
            parts.append(f"{block.get('name')}({_compact(block.get('input'))})")
    return f"[{value.get('stop_reason')}] " + " ".join(parts)


def _error_text(error: dict[str, Any] | None) -> str:
    if not error:
        return ""
    kind = str(error.get("type") or "Error").rsplit(".", 1)[-1]
    return f"{kind}: {error.get('message', '')}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]
    lines = [headers, *rows]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _wall_seconds(info: WorkflowInfo) -> float | None:
    end = info.finished_at if info.status.finished else None
    return None if end is None else (end - info.created_at).total_seconds()


def _message_usage(output: Any) -> Any:
    """The accounting ``Usage`` of a step output that is an Anthropic Message, else None."""
    if not (isinstance(output, dict) and output.get("type") == "message"):
        return None
    if not isinstance(output.get("usage"), dict):
        return None
    from .agent.accounting import usage_of_reply

    return usage_of_reply(output)


def _step_json(step: StepInfo) -> dict[str, Any]:
    data = dataclasses.asdict(step)
    data["duration_ms"] = step.duration_ms
    usage = _message_usage(step.output)
    data["tokens"] = (
        None if usage is None else {"input": usage.input_tokens, "output": usage.output_tokens}
    )
    return data


def _workflow_json(info: WorkflowInfo) -> dict[str, Any]:
    data = dataclasses.asdict(info)
    data["duration_seconds"] = _wall_seconds(info)
    return data


def _print_json(document: Any) -> None:
    json.dump(document, sys.stdout, indent=2, ensure_ascii=False, default=_json_default)
    sys.stdout.write("\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot encode {type(value).__name__}")


def _steps_table(steps: Sequence[StepInfo]) -> str:
    rows = []
    for step in steps:
        usage = _message_usage(step.output)
        if step.status is StepStatus.PENDING:
            result = "intent, no result (in doubt) inputs " + _compact(step.inputs)
        elif step.status is StepStatus.ERROR:
            result = _error_text(step.error)
        else:
            result = _summary(step.output)
        rows.append(
            [
                str(step.seq),
                step.name,
                str(step.status),
                str(step.attempts),
                _ts(step.started_at),
                _duration(None if step.duration_ms is None else step.duration_ms / 1000),
                "" if usage is None else f"{usage.input_tokens}/{usage.output_tokens}",
                _clip(result, _SUMMARY_CHARS),
            ]
        )
    headers = ["SEQ", "NAME", "STATUS", "ATTEMPTS", "STARTED (UTC)", "DURATION", "TOKENS IN/OUT"]
    return _table([*headers, "RESULT"], rows)


# -- commands ---------------------------------------------------------------------------


def _get(db: SystemDatabase, workflow_id: str) -> WorkflowInfo:
    info = db.workflows.get(workflow_id)
    if info is None:
        raise WorkflowNotFoundError(workflow_id)
    return info


def _cmd_migrate(args: argparse.Namespace, db: SystemDatabase) -> None:
    before = db.schema_version()
    after = db.migrate()
    if args.json:
        _print_json(
            {"database_url": db.redacted_url, "schema_version": after, "previous_version": before}
        )
    elif before == after:
        print(f"dbos_agent schema is up to date (version {after}) at {db.redacted_url}")
    else:
        print(f"dbos_agent schema migrated from version {before} to {after} at {db.redacted_url}")


def _cmd_list(args: argparse.Namespace, db: SystemDatabase) -> None:
    found = db.workflows.list(
        status=args.status,
        name=args.name,
        executor_id=args.executor,
        created_after=args.since,
        created_before=args.until,
        limit=args.limit,
    )
    if args.json:
        _print_json([_workflow_json(info) for info in found])
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
            _ts(info.created_at),
            _duration(_wall_seconds(info)),
            str(info.recovery_attempts),
            info.app_version or "-",
        ]
        for info in found
    ]
    headers = ["WORKFLOW ID", "NAME", "STATUS", "EXECUTOR", "CREATED (UTC)", "DURATION"]
    print(_table([*headers, "RECOVERIES", "APP VERSION"], rows))


def _cmd_show(args: argparse.Namespace, db: SystemDatabase) -> None:
    info = _get(db, args.workflow_id)
    steps = db.steps.list(info.workflow_id)
    origin = db.operations.fork_origin(info.workflow_id)
    usages = [u for u in (_message_usage(s.output) for s in steps) if u is not None]
    total = None
    if usages:
        total = usages[0]
        for usage in usages[1:]:
            total = total + usage
    if args.json:
        document = _workflow_json(info)
        document["forked_from"] = origin[0] if origin else None
        document["forked_from_step"] = origin[1] if origin else None
        document["steps"] = [_step_json(step) for step in steps]
        document["usage"] = (
            None
            if total is None
            else {
                "model_calls": len(usages),
                "input_tokens": total.input_tokens,
                "output_tokens": total.output_tokens,
                "cache_creation_input_tokens": total.cache_creation_input_tokens,
                "cache_read_input_tokens": total.cache_read_input_tokens,
                "cost_usd": total.cost(),
            }
        )
        _print_json(document)
        return
    fields: list[tuple[str, str]] = [
        ("Workflow", info.workflow_id),
        ("Name", info.name),
        ("Status", str(info.status)),
        (
            "Executor",
            info.executor_id + (f" (app version {info.app_version})" if info.app_version else ""),
        ),
        ("Created", _ts(info.created_at) + " UTC"),
        ("Updated", _ts(info.updated_at) + " UTC"),
        ("Finished", _ts(info.finished_at) + (" UTC" if info.finished_at else "")),
        ("Duration", _duration(_wall_seconds(info))),
        ("Recoveries", f"{info.recovery_attempts} of at most {info.max_recovery_attempts}"),
    ]
    if origin:
        fields.append(("Forked from", f"{origin[0]} at step {origin[1]}"))
    fields.append(("Inputs", _clip(_compact(info.inputs), _DETAIL_CHARS)))
    if info.status is WorkflowStatus.SUCCESS:
        fields.append(("Output", _clip(_compact(info.output), _DETAIL_CHARS)))
    if info.error:
        fields.append(("Error", _clip(_error_text(info.error), _DETAIL_CHARS)))
    if total is not None:
        cost = total.cost()
        fields.append(
            (
                "Tokens",
                f"{total.input_tokens} in, {total.output_tokens} out over {len(usages)} model "
                f"call(s)" + ("" if cost is None else f", about ${cost:.4f}"),
            )
        )
    width = max(len(label) for label, _ in fields)
    for label, value in fields:
        print(f"{label.ljust(width)}  {value}")
    print()
    if steps:
        print(f"Steps ({len(steps)})")
        print(_steps_table(steps))
    else:
        print("No steps recorded.")


def _cmd_steps(args: argparse.Namespace, db: SystemDatabase) -> None:
    _get(db, args.workflow_id)
    steps = db.steps.list(args.workflow_id)
    if args.json:
        _print_json([_step_json(step) for step in steps])
    elif steps:
        print(_steps_table(steps))
    else:
        print("no steps recorded")


def _who_runs_it(executor_id: str) -> str:
    return (
        f"it continues from its log in the first process with its function that claims it "
        f"(`{PROG} worker`, or a launch() with executor_id={executor_id!r})"
    )


def _cmd_cancel(args: argparse.Namespace, db: SystemDatabase) -> None:
    from .engine.operations import cancel_workflow

    previous = cancel_workflow(db, args.workflow_id)
    changed = previous is not WorkflowStatus.CANCELLED
    if args.json:
        _print_json(
            {
                "workflow_id": args.workflow_id,
                "status": WorkflowStatus.CANCELLED,
                "previous_status": previous,
                "changed": changed,
            }
        )
    elif changed:
        print(
            f"cancelled {args.workflow_id} (it was {previous}); a run in progress stops at its "
            f"next step boundary"
        )
    else:
        print(f"{args.workflow_id} was already CANCELLED; nothing changed")


def _cmd_resume(args: argparse.Namespace, db: SystemDatabase) -> None:
    from .engine.operations import resume_workflow

    result = resume_workflow(db, args.workflow_id, executor_id=args.executor)
    if args.json:
        _print_json(
            {
                "workflow_id": args.workflow_id,
                "status": WorkflowStatus.PENDING,
                "previous_status": result.previous,
                "executor_id": result.executor_id,
            }
        )
    else:
        print(
            f"resumed {args.workflow_id} (it was {result.previous}); it is PENDING on executor "
            f"{result.executor_id!r}: {_who_runs_it(result.executor_id)}"
        )


def _cmd_fork(args: argparse.Namespace, db: SystemDatabase) -> None:
    from .engine.operations import fork_workflow

    new_id, result = fork_workflow(
        db, args.workflow_id, args.from_step, new_workflow_id=args.new_id, executor_id=args.executor
    )
    if args.json:
        _print_json(
            {
                "workflow_id": new_id,
                "status": WorkflowStatus.PENDING,
                "forked_from": args.workflow_id,
                "forked_from_step": args.from_step,
                "copied_steps": result.copied_steps,
                "executor_id": result.executor_id,
            }
        )
    else:
        print(
            f"forked {args.workflow_id} from step {args.from_step} as {new_id} "
            f"({result.copied_steps} recorded step(s) reused); it is PENDING on executor "
            f"{result.executor_id!r}: {_who_runs_it(result.executor_id)}"
        )


def _cmd_resolve(args: argparse.Namespace, db: SystemDatabase) -> None:
    from .engine.operations import settle_in_doubt_step

    output = None if args.rerun else args.result
    settle_in_doubt_step(db, args.workflow_id, args.seq, output=output)
    info = _get(db, args.workflow_id)
    if args.json:
        _print_json(
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
            f"settled step {args.seq} of {args.workflow_id} ({how}); the workflow is "
            f"{info.status}: {_who_runs_it(info.executor_id)}"
        )


def _cmd_send(args: argparse.Namespace, db: SystemDatabase) -> None:
    value: Any = args.message
    if not args.text:
        try:
            value = json.loads(args.message)
        except ValueError:
            value = args.message
    payload = codec_for(Any).dumps(value, f"message to workflow {args.workflow_id!r}")
    found, inserted = db.messages.send(
        destination_id=args.workflow_id,
        topic=args.topic or "",
        message=payload,
        idempotency_key=args.idempotency_key,
    )
    if not found:
        raise WorkflowNotFoundError(args.workflow_id)
    if args.json:
        _print_json(
            {
                "workflow_id": args.workflow_id,
                "topic": args.topic,
                "message": value,
                "sent": inserted,
            }
        )
    elif inserted:
        topic = f" on topic {args.topic!r}" if args.topic else ""
        print(f"sent {_clip(payload, _SUMMARY_CHARS)} to {args.workflow_id}{topic}")
    else:
        print(
            f"a message with idempotency key {args.idempotency_key!r} was already sent to "
            f"{args.workflow_id}; nothing sent"
        )


def _cmd_gc(args: argparse.Namespace, db: SystemDatabase) -> None:
    statuses = check_statuses(args.statuses or DEFAULT_STATUSES)
    age = format_duration(args.older_than)
    last_line = time.monotonic()

    def progress(so_far: GcReport) -> None:
        """A line on stderr every few seconds of a long purge (stdout stays the result)."""
        nonlocal last_line
        if args.json or time.monotonic() - last_line < _PROGRESS_EVERY_S:
            return
        last_line = time.monotonic()
        rate = so_far.workflows / max(so_far.seconds, 1e-9)
        sys.stderr.write(
            f"{PROG} gc: {so_far.workflows:,} workflows deleted so far, "
            f"{so_far.batches:,} batches, {_duration(so_far.seconds)} ({rate:,.0f}/s)\n"
        )
        sys.stderr.flush()

    report = garbage_collect_db(
        db,
        args.older_than,
        statuses=statuses,
        batch_size=args.batch_size,
        dry_run=args.dry_run,
        progress=progress,
    )
    if args.json:
        _print_json(
            {
                **dataclasses.asdict(report),
                "older_than_seconds": args.older_than.total_seconds(),
                "statuses": statuses,
                "batch_size": args.batch_size,
            }
        )
        return
    what = (
        f"{report.workflows:,} workflow(s) finished more than {age} ago "
        f"({', '.join(statuses)}), with {report.steps:,} step(s), {report.messages:,} "
        f"message(s) and {report.events:,} event(s)"
    )
    if report.dry_run:
        print(
            f"would delete {what}, in {report.batches:,} batch(es) of at most "
            f"{args.batch_size:,}; dry run, nothing deleted ({_duration(report.seconds)})"
        )
    else:
        print(f"deleted {what}, in {report.batches:,} batch(es) ({_duration(report.seconds)})")


# -- main -------------------------------------------------------------------------------


def _worker_argv(argv: Sequence[str]) -> list[str] | None:
    """The arguments after ``worker`` when that is the command, else None.

    ``worker`` is handed to :func:`dbos_agent.worker.main` untouched (its own
    options and ``--help``); a ``--database-url`` given before it is passed on.
    """
    url: str | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--database-url" and i + 1 < len(argv):
            url, i = argv[i + 1], i + 2
        elif arg.startswith("--database-url="):
            url, i = arg.split("=", 1)[1], i + 1
        elif arg == "--json":
            i += 1
        elif arg == "worker":
            rest = list(argv[i + 1 :])
            return rest if url is None else ["--database-url", url, *rest]
        else:
            return None
    return None


def _run_worker(argv: list[str]) -> int:
    try:
        from . import worker
    except ImportError as exc:
        _fail(f"the worker command is not available in this installation ({exc})")
        return 1
    status = worker.main(argv)
    return status if isinstance(status, int) else 0


def _fail(message: str) -> None:
    """One line on stderr (libpq's multi-line hints included), easy to grep and log."""
    sys.stderr.write(f"{PROG}: error: {' '.join(message.split())}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (the console script exits with it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    worker_argv = _worker_argv(argv)
    if worker_argv is not None:
        return _run_worker(worker_argv)
    args = build_parser().parse_args(argv)
    args.json = getattr(args, "json", False)
    run: Callable[[argparse.Namespace, SystemDatabase], object] = args.run
    url: str | None = None
    db: SystemDatabase | None = None
    try:
        url = _database_url(args)
        db = SystemDatabase(url, pool_size=2)
        db.open()
        if run is not _cmd_migrate:
            _check_schema(db)
        run(args, db)
        sys.stdout.flush()
    except (CliError, DbosAgentError) as exc:
        _fail(scrub(str(exc), url))
        return 1
    except psycopg.Error as exc:
        _fail(scrub(f"database error: {str(exc).strip()}", url))
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `dbos-agent workflows list | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    finally:
        if db is not None:
            db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
