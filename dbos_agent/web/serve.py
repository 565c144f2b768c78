"""``dbos-agent serve``: the API and the dashboard on uvicorn."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys

TOKEN_ENV = "DBOS_AGENT_HTTP_TOKEN"
DESCRIPTION = (
    "Serve the JSON API (/api/...) and the web dashboard (/) on the system database.\n"
    f"With --token (or ${TOKEN_ENV}) every API call needs 'Authorization: Bearer TOKEN';\n"
    "a --host other than a loopback address is refused without one."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8787, help="port (default 8787)")
    parser.add_argument("--token", help=f"bearer token required by the API (or ${TOKEN_ENV})")
    parser.add_argument(
        "--database-url", help="system database (default: $DBOS_AGENT_DATABASE_URL, embedded)"
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; 2 for a refused configuration."""
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if not is_loopback(args.host) and token is None:
        sys.stderr.write(
            f"dbos-agent serve: error: refusing to serve on {args.host} without a token: "
            f"anyone who reaches it could cancel and steer workflows; set --token or "
            f"${TOKEN_ENV} (or listen on 127.0.0.1)\n"
        )
        return 2
    try:
        import uvicorn

        from .api import create_app
    except ImportError as exc:
        sys.stderr.write(
            f"dbos-agent serve: error: {exc.name} is not installed: pip install 'dbos-agent[web]'\n"
        )
        return 2
    app = create_app(args.database_url, token=token)
    print(f"dbos_agent: serving http://{args.host}:{args.port}/ (API under /api)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
