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

The package: :mod:`.arguments` (value types), :mod:`.parser` (the command tree's root,
with :mod:`.workflow_tree` and :mod:`.fleet_tree` for its commands, built of
:mod:`.building`),
:mod:`.commands` (one function per command), :mod:`.render` (what is shown); here,
:func:`main` opens the database a command needs (never creating or migrating it, but for
``migrate``: see :mod:`dbos_agent.postgres.opening`) and turns failures into exit statuses.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import psycopg

from .. import worker
from .._storage.database import SystemDatabase
from .._storage.dsn import URL_ENV, scrub
from ..errors import DbosAgentError, DeployCheckError
from ..postgres.opening import connect_system_database, open_system_database
from ..web import serve
from . import commands, render
from .arguments import PROG
from .parser import Run, build_parser, parse

__all__ = ["build_parser", "main"]


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
        if run is commands.migrate:  # migrates itself, to report the version it found
            db = connect_system_database(args.database_url, create=True, pool_size=2)
        else:
            db = open_system_database(args.database_url, create=False, migrate=False, pool_size=2)
        status = run(args, db) or 0
        sys.stdout.flush()
    except DeployCheckError as exc:  # check-deploy checked nothing: not a verdict
        return _fail(exc, scrub(str(exc), url), as_json=args.json, status=2)
    except DbosAgentError as exc:
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
