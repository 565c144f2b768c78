"""``dbos-agent serve``: the API and the dashboard on uvicorn.

A token by default, as Jupyter does: any web page the user's browser opens can reach a
loopback server, so it starts with a fresh token and prints the dashboard's URL with
it. It binds its port and opens its database before it says it serves: a port in use or
an unreachable database is one line and exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import resource
import secrets
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from .._engine.client import Client
from .._storage.dsn import URL_ENV, scrub
from ..errors import DbosAgentError
from ..postgres.embedded import DEFAULT_DIRECTORY
from .guard import DEFAULT_MAX_BODY_BYTES, host_name, is_loopback, is_wildcard
from .limits import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_STREAMS,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_SEND_TIMEOUT,
    DEFAULT_STREAM_PAGE_BYTES,
)

__all__ = ["DESCRIPTION", "TOKEN_ENV", "add_arguments", "is_loopback", "run"]

TOKEN_ENV = "DBOS_AGENT_HTTP_TOKEN"
DESCRIPTION = (
    "Serve the JSON API (/api/...) and the web dashboard (/) on the system database.\n"
    "Every request but the dashboard's page needs 'Authorization: Bearer TOKEN': the\n"
    f"token is --token or --token-file's, else ${TOKEN_ENV}, else a fresh one printed in\n"
    "the dashboard's URL at start. --no-token serves without one, on a loopback address\n"
    "only. A command line is visible to every local user (ps): give the token in\n"
    f"${TOKEN_ENV} or a file, and keep the database password out of --database-url\n"
    f"(${URL_ENV}, or $PGPASSWORD, or a password file: $PGPASSFILE, ~/.pgpass).\n"
    "The Host header must name the server (--host, an --allow-host name, or localhost\n"
    "when on loopback); no page of another origin may use the API; changes need a JSON\n"
    "body; bodies are at most --max-body-bytes.\n"
    "Limits: --max-streams streams at once (503 beyond), each holding --stream-page-bytes\n"
    "of items at most; --max-connections connections (503 beyond); a request must arrive\n"
    "within --request-timeout s, an idle connection closes after --idle-timeout s, and a\n"
    "client that takes none of its answer for --send-timeout s is dropped.\n"
    "exit status: 0 stopped (SIGTERM, Ctrl-C); 1 cannot listen or reach the database;\n"
    "2 usage error."
)
_PROG = "dbos-agent serve"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The server's options (its ``--database-url`` is the CLI's global one)."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8787, help="port (default 8787)")
    parser.add_argument(
        "--token",
        help=f"bearer token required by the API (default: ${TOKEN_ENV}, else a new one); "
        f"visible to other local users (ps): prefer ${TOKEN_ENV} or --token-file",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help="read the bearer token from this file (its first line)",
    )
    parser.add_argument(
        "--no-token", action="store_true", help="serve without a token (loopback addresses only)"
    )
    parser.add_argument(
        "--allow-host",
        dest="allow_hosts",
        action="append",
        default=[],
        type=_host,
        metavar="NAME",
        help="another name the server answers for in the Host header (repeatable)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=_positive,
        default=DEFAULT_MAX_BODY_BYTES,
        metavar="N",
        help=f"largest request body (default {DEFAULT_MAX_BODY_BYTES})",
    )
    limits: list[tuple[str, Callable[[str], float], float, str, str]] = [
        ("--max-streams", _positive, DEFAULT_MAX_STREAMS, "N", "streams (SSE answers) at once"),
        (
            "--stream-page-bytes",
            _positive,
            DEFAULT_STREAM_PAGE_BYTES,
            "N",
            "most JSON text of items a stream answer holds",
        ),
        ("--max-connections", _positive, DEFAULT_MAX_CONNECTIONS, "N", "connections at once"),
        ("--request-timeout", _seconds, DEFAULT_REQUEST_TIMEOUT, "S", "seconds to send a request"),
        (
            "--idle-timeout",
            _positive,
            DEFAULT_IDLE_TIMEOUT,
            "S",
            "seconds an idle connection lasts",
        ),
        (
            "--send-timeout",
            _seconds,
            DEFAULT_SEND_TIMEOUT,
            "S",
            "seconds to take none of an answer",
        ),
    ]
    for flag, kind, default, metavar, text in limits:
        parser.add_argument(
            flag, type=kind, default=default, metavar=metavar, help=f"{text} (default {default:g})"
        )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return value


def _host(text: str) -> str:
    if host_name(text) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a host name")
    return text


def _enough_open_files(connections: int) -> None:
    """Raise this process's soft limit of open files (often 1024) towards its hard one,
    so that ``connections`` clients and the database's fit: the cap refuses clients
    before the process runs out of files."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        ceiling = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, ceiling), hard))


def _error(message: str) -> None:
    sys.stderr.write(f"{_PROG}: error: {' '.join(message.split())}\n")


def _token_from_file(path: Path) -> str | None:
    """The token in ``path`` (its first line, spaces around it dropped); None, said on
    stderr, when it cannot be read or is empty. Never shows what the file holds."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        _error(f"cannot read the token file {path}: {reason}")
        return None
    token = lines[0].strip() if lines else ""
    if not token:
        _error(f"the token file {path} is empty")
        return None
    return token


def _token(args: argparse.Namespace) -> tuple[str | None, bool] | None:
    """The token and whether it was made here; None when the options are refused."""
    if args.token_file is not None and args.token:
        _error("--token and --token-file contradict each other")
        return None
    if args.no_token:
        if args.token or args.token_file is not None:
            which = "--token" if args.token else "--token-file"
            _error(f"{which} and --no-token contradict each other")
            return None
        if not is_loopback(args.host):
            _error(
                f"refusing to serve on {args.host} without a token: anyone who reaches it "
                f"could cancel and steer workflows; --no-token is for loopback addresses only"
            )
            return None
        return None, False
    if args.token_file is not None:
        from_file = _token_from_file(args.token_file)
        return None if from_file is None else (from_file, False)
    given = args.token or os.environ.get(TOKEN_ENV) or None
    if given is not None:
        return given, False
    return secrets.token_urlsafe(24), True


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound and listening on ``host:port`` (uvicorn serves on it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or Ctrl-C (0); 1 when it cannot listen or reach its database,
    2 for a refused configuration."""
    chosen = _token(args)
    if chosen is None:
        return 2
    token, generated = chosen
    try:
        import uvicorn

        from .api import create_app
        from .connections import ConnectionLimits, server_config
    except ImportError as exc:
        _error(f"{exc.name} is not installed: pip install 'dbos-agent[web]'")
        return 2
    given = getattr(args, "database_url", None) or os.environ.get(URL_ENV)
    try:  # opened once, before serving: never created nor migrated here
        client = Client(getattr(args, "database_url", None))
    except DbosAgentError as exc:  # no database, no schema, a URL refused, unreachable
        _error(scrub(str(exc), given))
        return 1
    except Exception as exc:
        _error(scrub(f"database error: {exc}", given))
        return 1
    with client:
        try:
            sock = _listen(args.host, args.port)
        except OSError as exc:
            _error(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
            return 1
        app = create_app(
            client=client,
            token=token,
            host=args.host,
            allow_hosts=args.allow_hosts,
            max_body_bytes=args.max_body_bytes,
            max_streams=args.max_streams,
            stream_page_bytes=args.stream_page_bytes,
        )
        limits = ConnectionLimits(
            max_connections=args.max_connections,
            request_timeout=args.request_timeout,
            idle_timeout=args.idle_timeout,
            send_timeout=args.send_timeout,
        )
        _enough_open_files(limits.max_connections)
        port = sock.getsockname()[1]
        shown_host = "127.0.0.1" if is_wildcard(args.host) else args.host
        shown_host = f"[{shown_host}]" if ":" in shown_host else shown_host
        where = f"http://{shown_host}:{port}/"
        folder = Path(DEFAULT_DIRECTORY).expanduser().resolve()
        which = client.db.redacted_url if given else f"the embedded Postgres in {folder}/"
        print(f"dbos_agent: serving {which}", flush=True)
        if token is None:
            print(f"dbos_agent: dashboard at {where} (API under /api; no token)", flush=True)
        elif generated:
            print(f"dbos_agent: dashboard at {where}?token={token} (API under /api)", flush=True)
        else:
            print(f"dbos_agent: dashboard at {where} (API under /api; your token)", flush=True)

        def stop(signum: int, frame: FrameType | None) -> None:
            """uvicorn shuts down on the signal, then raises it again: once it has, the
            process ends here with status 0 instead of dying of it."""

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, stop)
        server = uvicorn.Server(server_config(app, limits, lifespan="on"))
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()
        if not server.started:
            _error("the server did not start (see above)")
            return 1
        return 0
