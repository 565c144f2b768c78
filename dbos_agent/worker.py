"""The recovery daemon: ``dbos-agent worker --app module[:object]``.

It imports the application (so its workflows, queues and schedules are registered),
launches an executor that recovers its own pending workflows, then keeps
taking over orphaned workflows of dead executors, running queued ones and firing
the slots of its cron schedules (and, with ``--retention``, deleting old finished
ones) until SIGTERM/SIGINT.
On a signal it stops taking work, lets running steps finish within a grace
period, and exits 0; whatever did not finish is taken over at once by the
next executor (a clean exit gives up the session).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import socket
import sys
import threading
from datetime import timedelta
from types import FrameType

from . import __version__
from ._durations import parse_duration
from ._engine.extending import workflow_names
from ._engine.launch import launch
from ._engine.queues import registered_queues
from ._engine.schedules import registered_schedules
from ._storage.dsn import URL_ENV, scrub
from .errors import DbosAgentError, InvalidDurationError

log = logging.getLogger(__name__)


PROG = "dbos-agent worker"
DESCRIPTION = "Run durable workflows: recover, take over orphans, run queues, fire schedules."


def add_arguments(parser: argparse.ArgumentParser, *, database_url: bool = True) -> None:
    """Add every option of the worker to ``parser``: ``python -m dbos_agent.worker`` and
    ``dbos-agent worker`` share them, so both take and document the same ones (the
    latter's ``--database-url`` is the CLI's global one: ``database_url=False``)."""
    parser.add_argument(
        "--app",
        required=True,
        metavar="MODULE[:OBJECT]",
        help="module that defines the workflows and queues (imported first)",
    )
    if database_url:
        parser.add_argument(
            "--database-url",
            default=argparse.SUPPRESS,
            help="system database (default: $DBOS_AGENT_DATABASE_URL, else the "
            "embedded Postgres in ./.dbos_agent); visible to other local users (ps): keep "
            "its password in $DBOS_AGENT_DATABASE_URL, $PGPASSWORD or $PGPASSFILE",
        )
    parser.add_argument(
        "--session-url",
        default=None,
        help="a direct URL of the system database beside a pooled one (?pooler=transaction), "
        "for the session's lock, LISTEN and migrations (default: $DBOS_AGENT_SESSION_URL; "
        "none: liveness by the lease alone, wake-ups polled; see docs/pooled-urls.md)",
    )
    parser.add_argument(
        "--pool-size",
        type=int,
        default=None,
        help="database connections for statements (default: --workers + 4)",
    )
    parser.add_argument(
        "--no-listen",
        dest="listen",
        action="store_false",
        default=None,
        help="poll for wake-ups instead of holding a connection that LISTENs",
    )
    parser.add_argument(
        "--executor-id", default=None, help="this executor's id (default: HOST:PID)"
    )
    parser.add_argument(
        "--app-version", default=None, help="only recover/run workflows of this application version"
    )
    parser.add_argument(
        "--workers", type=int, default=16, help="workflows run at once by this process (default 16)"
    )
    parser.add_argument(
        "--lease",
        type=float,
        default=30.0,
        help="heartbeat lease in seconds: a hung or partitioned worker's workflows are taken "
        "over once it ran out; a dead one's sooner, see --session-grace (default 30)",
    )
    parser.add_argument(
        "--session-grace",
        type=float,
        default=3.0,
        help="seconds this worker's session may lose its lock (a dropped connection) before "
        "others take its workflows over; a live worker reconnects well within it (default 3)",
    )
    parser.add_argument(
        "--outage-timeout",
        type=float,
        default=60.0,
        help="seconds a database call retries through an outage before giving up; the "
        "workflow stays PENDING and is continued when the database is back (default 60)",
    )
    parser.add_argument(
        "--poll",
        type=float,
        default=1.0,
        help="seconds between looks for orphaned workflows (default 1)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=30.0,
        help="seconds to let running steps finish on SIGTERM (default 30)",
    )
    parser.add_argument(
        "--retention",
        type=_age,
        default=None,
        metavar="AGE",
        help="also delete finished workflows older than AGE (45s, 90m, 12h, 30d, 2w), with "
        "their steps, messages and events, every AGE/10 (at most hourly); default: never",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log other libraries' INFO lines too (httpx's line per HTTP request...); by "
        "default only those of dbos_agent and of the app are",
    )
    parser.add_argument("--version", action="version", version=f"dbos-agent {__version__}")


def _age(text: str) -> timedelta:
    """``--retention``'s value; refused as a usage error (exit 2) saying what is read."""
    try:
        return parse_duration(text)
    except InvalidDurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def import_app(spec: str) -> object:
    """Import ``module[:object]`` the way ASGI servers do; the cwd is importable."""
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # not found, or its own code failed while it was imported
        raise DbosAgentError(
            f"cannot import the app module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    if not attr:
        return module
    try:
        return getattr(module, attr)
    except AttributeError:
        raise DbosAgentError(f"module {module_name!r} has no attribute {attr!r}") from None


def main(argv: list[str] | None = None) -> int:
    """``python -m dbos_agent.worker``: parse ``argv`` and :func:`run`."""
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


class _OwnLines(logging.Filter):
    """Lets through warnings and errors from anyone, and the INFO lines of the worker, of
    dbos_agent and of the app (the top-level packages in ``own``): not those of the
    libraries below them (httpx logs a line per HTTP request: each model call)."""

    def __init__(self, own: set[str]) -> None:
        super().__init__()
        self._own = own

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or record.name.split(".", 1)[0] in self._own


def configure_logging(*, quiet: bool, verbose: bool, app: str | None = None) -> None:
    """Log on stderr: INFO and up (WARNING and up with ``quiet``), other libraries' INFO
    lines left out unless ``verbose`` (those of dbos_agent, of the worker and of ``app``,
    the module given to ``--app``, kept). Logging the app configured while it was
    imported (a handler on the root logger) is left as it is."""
    root = logging.getLogger()
    if root.handlers:
        return
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if verbose:
        return
    own = {"dbos_agent", "__main__"}
    if app:
        own.add(app.split(":", 1)[0].split(".", 1)[0])
    for handler in root.handlers:
        handler.addFilter(_OwnLines(own))


def run(args: argparse.Namespace) -> int:
    """Run the daemon with the options of :func:`add_arguments` until a signal; returns
    the exit status."""
    executor_id = args.executor_id or f"{socket.gethostname()}:{os.getpid()}"
    # Before the app's import and the launch, which take a while: a SIGTERM meanwhile (a
    # deploy stopping a worker that is still starting) stops it once it has started, as
    # any other, instead of killing it half-way through taking its workflows back.
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        import_app(args.app)
        configure_logging(quiet=args.quiet, verbose=args.verbose, app=args.app)
        runtime = launch(
            getattr(args, "database_url", None),
            executor_id=executor_id,
            app_version=args.app_version,
            workers=args.workers,
            lease_seconds=args.lease,
            session_grace=args.session_grace,
            outage_timeout=args.outage_timeout,
            retention=args.retention,
            take_over_every=args.poll,
            session_url=args.session_url,
            pool_size=args.pool_size,
            listen=args.listen,
        )
    except DbosAgentError as exc:
        given = getattr(args, "database_url", None) or os.environ.get(URL_ENV)
        print(f"dbos-agent: error: {scrub(str(exc), given)}", file=sys.stderr)
        return 1
    log.info(
        "worker %s started (session %s): %d workflow(s), queues: %s, schedules: %s",
        executor_id,
        runtime.session_key,
        len(workflow_names()),
        ", ".join(q.name for q in registered_queues()) or "none",
        ", ".join(s.name for s in registered_schedules()) or "none",
    )
    if stop.is_set():  # its own line went out before logging was set up
        log.info("received a signal while starting: stopping")
    while not stop.wait(1.0):  # the take-over and queue threads do the work
        pass
    running = len(runtime.running())
    log.info(
        "stopping: %d workflow(s) running, waiting up to %.0fs for their steps", running, args.grace
    )
    runtime.shutdown(grace=args.grace)
    log.info("worker %s stopped", executor_id)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
