"""``dbos-agent``: operate durable workflows from a terminal or a script.

It works from the database alone: it never imports or runs the user's workflow
functions and never recovers anything (``worker`` aside, which is the daemon that does,
and ``check-deploy``, whose child process imports the new code to replay logs against
it, running nothing live).
Human-readable tables by default, one JSON document on stdout with ``--json`` (JSON
Lines for ``stream``). Errors go to stderr as ``dbos-agent: error: ...`` (and, with
``--json``, as ``{"error": ..., "type": ...}`` on stdout; a usage error as that document
on stderr); exit status 0 on success, 1 for operational errors (unknown
id, wrong status, no or unreachable database), 2 for usage errors (and for a
``check-deploy`` that could not check the new code at all). No password ever
appears in the output.

The package: :mod:`.arguments` (value types), :mod:`.parser` (the command tree),
:mod:`.commands` (one function per command), :mod:`.render` (what is shown); here,
:func:`main` opens the database a command needs and turns failures into exit statuses.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import psycopg

from .. import worker
from ..errors import DbosAgentError, DeployCheckError
from ..postgres.embedded import DEFAULT_DIRECTORY, embedded_database_url
from ..storage.database import SystemDatabase
from ..storage.dsn import URL_ENV, configured_url, scrub
from ..storage.sql_files import migrations
from ..web import serve
from . import commands, render
from .arguments import PROG
from .parser import Run, build_parser, parse

__all__ = ["CliError", "build_parser", "main"]


class CliError(Exception):
    """An expected, operational failure: message to stderr, exit status 1."""


def _embedded_directory() -> Path:
    """The folder of the embedded database that ``launch()`` uses here."""
    return Path(DEFAULT_DIRECTORY).expanduser().resolve()


def _database_url(args: argparse.Namespace, *, may_create: bool) -> str:
    """The URL given, else $DBOS_AGENT_DATABASE_URL, else the embedded database's.

    Only a command that creates (``migrate``) may start a new embedded cluster: anything
    else run in the wrong folder would otherwise make an empty database and report that
    nothing is there."""
    url = configured_url(args.database_url)
    if url:
        return url
    directory = _embedded_directory()
    if not may_create and not directory.is_dir():
        raise CliError(
            f"no database: there is no embedded Postgres in {directory}/ (the first launch() "
            f"or `{PROG} migrate` in a folder makes one there); run this where your app "
            f"runs, or pass --database-url URL or set ${URL_ENV}"
        )
    try:
        return embedded_database_url(directory)
    except Exception as exc:  # no server binaries, a broken data directory, ...
        raise CliError(f"cannot start the embedded Postgres in {directory}/: {exc}") from None


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


def _fail(exc: Exception, message: str, *, as_json: bool, status: int = 1) -> int:
    """Report an operational error: one line on stderr (libpq's multi-line hints
    included), easy to grep and log, and with ``--json`` a document a script can read;
    returns the exit ``status``."""
    line = " ".join(message.split())
    if as_json:
        render.print_json({"error": line, "type": type(exc).__name__})
        sys.stdout.flush()
    sys.stderr.write(f"{PROG}: error: {line}\n")
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (the console script exits with it)."""
    args = parse(sys.argv[1:] if argv is None else list(argv))
    args.json = getattr(args, "json", False)
    args.database_url = getattr(args, "database_url", None)
    if args.command == "worker":  # a daemon, on connections of its own
        return worker.run(args)
    if args.command == "serve":  # a web server, on connections of its own
        return serve.run(args)
    run: Run = args.run
    # What errors are scrubbed of until the URL is read (one that cannot be is refused
    # with a message that shows none of it; this is a second guard).
    url: str | None = args.database_url or os.environ.get(URL_ENV)
    db: SystemDatabase | None = None
    try:
        url = _database_url(args, may_create=run is commands.migrate)
        db = SystemDatabase(url, pool_size=2)
        db.open()
        if run is not commands.migrate:
            _check_schema(db)
        status = run(args, db) or 0
        sys.stdout.flush()
    except DeployCheckError as exc:  # check-deploy checked nothing: not a verdict
        return _fail(exc, scrub(str(exc), url), as_json=args.json, status=2)
    except (CliError, DbosAgentError) as exc:
        return _fail(exc, scrub(str(exc), url), as_json=args.json)
    except psycopg.Error as exc:
        return _fail(exc, scrub(f"database error: {str(exc).strip()}", url), as_json=args.json)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `dbos-agent workflows list | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    finally:
        if db is not None:
            db.close()
    return status
