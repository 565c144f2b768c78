"""What the command tree of ``dbos-agent`` is built of: a command, its actions, and the
parser whose usage errors :func:`~dbos_agent.cli.parser.parse` reports."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from .._storage.database import SystemDatabase
from .._storage.dsn import URL_ENV

#: What a command runs, on the database ``main`` opened for it (set as ``run``); it may
#: return the exit status (``check-deploy``: 1 when some workflow does not fit).
Run = Callable[[argparse.Namespace, SystemDatabase], int | None]


class UsageError(Exception):
    """A command line that does not fit the tree: ``parser.parse`` reports it (exit 2)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors ``parser.parse`` reports, as text or as JSON."""

    #: Said after an unknown action of this command (``dbos-agent steps ID``: where
    #: what was likely meant is).
    hint: str | None = None

    def error(self, message: str) -> NoReturn:
        if self.hint is not None and "invalid choice" in message:
            message = f"{message}; {self.hint}"
        raise UsageError(self, message)


Group = argparse._SubParsersAction  # the object add_subparsers() returns


def add_command(
    group: Group[Any],
    common: argparse.ArgumentParser,
    name: str,
    help_text: str,
    run: Run | None,
    description: str | None = None,
    *,
    hint: str | None = None,
) -> argparse.ArgumentParser:
    """A (sub)command that accepts the common options; ``run`` is what it does; ``hint``
    is said after an unknown action of it."""
    command: argparse.ArgumentParser = group.add_parser(
        name,
        help=help_text,
        description=description or help_text,
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.set_defaults(run=run)
    if isinstance(command, Parser):
        command.hint = hint
    return command


def add_actions(command: argparse.ArgumentParser) -> Group[Any]:
    actions = command.add_subparsers(dest="action", metavar="ACTION", title="actions")
    actions.required = True
    return actions


def database_option() -> argparse.ArgumentParser:
    """``--database-url``, defined once for the whole tree: accepted before or after any
    command (``worker`` and ``serve`` included). Its default is "absent", so that a
    subcommand's parse never overwrites a value given before the command."""
    database = Parser(add_help=False)
    database.add_argument(
        "--database-url",
        metavar="URL",
        default=argparse.SUPPRESS,
        help=f"system database (default: ${URL_ENV}, else the embedded Postgres); visible "
        f"to other local users (ps): keep its password in ${URL_ENV}, $PGPASSWORD or "
        f"$PGPASSFILE",
    )
    return database
