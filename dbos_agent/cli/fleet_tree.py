"""The fleet's commands of ``dbos-agent``: ``versions``, ``gc``, ``check-deploy``,
``export``, ``import``, ``schedules``, and the daemons ``worker`` and ``serve``."""

from __future__ import annotations

import argparse
from typing import Any

from .. import worker
from .._engine.retention import DEFAULT_BATCH_SIZE, DEFAULT_STATUSES
from .._limits import DEFAULT_MAX_CHECKPOINT_BYTES
from ..web import serve
from . import arguments as types
from . import commands, deploys, schedule_commands
from .arguments import PROG
from .building import Group, add_command, database_option


def add_versions(tree: Group[Any], common: argparse.ArgumentParser) -> None:
    versions = add_command(
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


def add_gc(tree: Group[Any], common: argparse.ArgumentParser) -> None:
    gc = add_command(
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
        type=types.age,
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


def add_deploys(tree: Group[Any], common: argparse.ArgumentParser) -> None:
    check = add_command(
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

    export = add_command(
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

    imported = add_command(
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


def add_schedules(tree: Group[Any], common: argparse.ArgumentParser) -> None:
    listing = "list cron schedules: cron, time zone, pause, last and next slots, last run"
    command = add_command(
        tree,
        common,
        "schedules",
        "list cron schedules (@scheduled); pause, resume or backfill one",
        schedule_commands.schedules,
        "Without an action: every schedule recorded in the database (a process that defines\n"
        "one records it when it launches), with its latest slot's workflow and status and its\n"
        "next slot. Slots are shown in UTC; the workflow of a slot has the id NAME@SLOT.",
    )
    actions = command.add_subparsers(dest="action", metavar="ACTION", title="actions")
    add_command(actions, common, "list", listing, schedule_commands.schedules)
    pause = add_command(
        actions,
        common,
        "pause",
        "pause a schedule in every process: its slots pass without runs",
        schedule_commands.pause_schedule,
    )
    pause.add_argument("name", metavar="NAME", help="schedule name")
    resume = add_command(
        actions,
        common,
        "resume",
        "resume a paused schedule from its next slot",
        schedule_commands.resume_schedule,
        "Resume a paused schedule: it runs again from its next slot. The slots that came due\n"
        "while it was paused are not caught up; `backfill` runs them.",
    )
    resume.add_argument("name", metavar="NAME", help="schedule name")
    backfill = add_command(
        actions,
        common,
        "backfill",
        "run every slot in a range that has not run, once each",
        schedule_commands.backfill,
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


def add_worker(tree: Group[Any]) -> None:
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
        parents=[database_option()],
    )
    worker.add_arguments(command, database_url=False)


def add_serve(tree: Group[Any]) -> None:
    """``serve``: the web API and dashboard (:mod:`dbos_agent.web.serve`), on a process of
    their own like ``worker``."""
    command: argparse.ArgumentParser = tree.add_parser(
        "serve",
        help="serve the JSON API and the web dashboard",
        description=serve.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[database_option()],
    )
    serve.add_arguments(command)
