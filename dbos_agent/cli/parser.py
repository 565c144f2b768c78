"""The command tree of ``dbos-agent``: its root, its common options and :func:`parse`;
the commands' options and help are in :mod:`.workflow_tree` and :mod:`.fleet_tree`."""

from __future__ import annotations

import argparse
import json
import sys

from .. import __version__
from . import commands, fleet_tree, queue_tree, workflow_tree
from .arguments import PROG
from .building import Parser, Run, UsageError, add_command, database_option

__all__ = ["Run", "build_parser", "parse"]


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


def _common() -> argparse.ArgumentParser:
    """Options accepted before or after the command (``dbos-agent workflows list --json``),
    absent unless given, as ``--database-url``'s."""
    common = Parser(add_help=False, parents=[database_option()])
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
    parser = Parser(
        prog=PROG,
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    tree = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    tree.required = True
    add_command(
        tree,
        common,
        "migrate",
        "apply the dbos_agent schema (numbered migrations) to the database",
        commands.migrate,
    )
    workflow_tree.add_workflows(tree, common)
    workflow_tree.add_steps(tree, common)
    workflow_tree.add_retry(tree, common)
    workflow_tree.add_send(tree, common)
    workflow_tree.add_stream(tree, common)
    workflow_tree.add_approvals(tree, common)
    fleet_tree.add_versions(tree, common)
    fleet_tree.add_gc(tree, common)
    fleet_tree.add_deploys(tree, common)
    fleet_tree.add_schedules(tree, common)
    queue_tree.add_queues(tree, common)
    fleet_tree.add_worker(tree)
    fleet_tree.add_serve(tree)
    return parser
