"""The HTTP API: the CLI's operator actions as JSON over HTTP, and streams as SSE.

``create_app(database_url, token=...)`` returns an ASGI application (FastAPI, with its
OpenAPI document at ``/api/openapi.json``; no docs page, which would load its scripts from
a CDN onto the server's origin) that works on the system database through a
:class:`~dbos_agent.Client`: it runs no workflow itself, so it is stateless and may run
in as many copies as wanted beside the workers. ``dbos-agent serve`` runs it on uvicorn
with the dashboard at ``/``.

Errors are JSON ``{"error": ..., "type": ...}``: 401 without the bearer token (when one is
set), 404 for an unknown workflow or step, 409 for an action the workflow's status does
not allow, 400 for a bad value (an id with a NUL, an over-long id), 422 for a body that
does not fit; what :mod:`.guard` refuses before the API sees a request (a foreign host or
origin, a body that is not JSON or too large) is JSON too. They never contain the
database password.

The routes are in routers by what they act on (:mod:`.workflows`, :mod:`.approvals`,
:mod:`.streams`, on :mod:`.common`); this module puts them together with the guard, the
error answers and the dashboard.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from functools import cache
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response

from .._engine.client import Client
from .._storage.dsn import scrub
from ..errors import (
    ApprovalError,
    DbosAgentError,
    InvalidIdentifierError,
    SerializationError,
    WorkflowNotFoundError,
    WorkflowStatusError,
)
from . import approvals, streams, workflows
from .guard import DEFAULT_MAX_BODY_BYTES, Guard
from .limits import DEFAULT_MAX_STREAMS, DEFAULT_STREAM_PAGE_BYTES
from .streams import StreamSlots

__all__ = ["create_app"]


def _status_of(exc: Exception) -> int:
    if isinstance(exc, WorkflowNotFoundError):
        return 404
    if isinstance(exc, WorkflowStatusError | ApprovalError):
        return 409
    if isinstance(exc, InvalidIdentifierError | SerializationError | ValueError):
        return 400
    return 500


async def _on_error(request: Request, exc: Exception) -> Response:
    """The library's errors and refused values are answers, not crashes: JSON with the
    status they mean, the database password scrubbed."""
    status = _status_of(exc)
    message = str(exc) if status != 500 else f"internal error: {exc}"
    client: Client | None = getattr(request.app.state, "client", None)
    return JSONResponse(
        {
            "error": scrub(message, None if client is None else client.db.url),
            "type": type(exc).__name__,
        },
        status_code=status,
    )


async def _on_bad_body(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
    return JSONResponse(
        {"error": f"invalid request: {problems}", "type": "RequestValidationError"},
        status_code=422,
    )


def create_app(
    database_url: str | None = None,
    *,
    token: str | None = None,
    host: str = "127.0.0.1",
    allow_hosts: Iterable[str] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_streams: int = DEFAULT_MAX_STREAMS,
    stream_page_bytes: int = DEFAULT_STREAM_PAGE_BYTES,
    client: Client | None = None,
) -> FastAPI:
    """The API (and the dashboard at ``/``) on the system database at ``database_url``
    (default: as ``launch()`` finds it). With ``token``, every request but the dashboard's
    page must carry ``Authorization: Bearer <token>``. ``host`` is the address it is
    served on and ``allow_hosts`` other names it answers for (the ``Host`` header is
    checked against them); bodies are at most ``max_body_bytes`` (see :mod:`.guard`).
    At most ``max_streams`` stream answers run at once, each holding at most
    ``stream_page_bytes`` of items (see :mod:`.streams`). The app opens a
    :class:`Client` at start, which never migrates the schema; or it serves ``client``,
    open already and left open (``dbos-agent serve``'s, which opens it before listening)."""
    if client is not None and database_url is not None:
        raise TypeError("create_app() takes database_url or client, not both")
    slots = StreamSlots(max_streams, stream_page_bytes)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.client = Client(database_url) if client is None else client
        try:
            yield
        finally:
            opened = app.state.client
            del app.state.client
            if client is None:
                opened.close()

    app = FastAPI(
        title="dbos_agent",
        summary="See and steer durable workflows",
        lifespan=lifespan,
        openapi_url="/api/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    app.state.stream_slots = slots
    app.add_middleware(
        Guard,
        token=token,
        bound_host=host,
        allow_hosts=tuple(allow_hosts),
        max_body_bytes=max_body_bytes,
    )
    for kind in (DbosAgentError, ValueError):
        app.add_exception_handler(kind, _on_error)
    app.add_exception_handler(RequestValidationError, _on_bad_body)
    for router in (workflows.router, approvals.router, streams.router):
        app.include_router(router)
    app.add_api_route(
        "/", _dashboard, response_class=HTMLResponse, include_in_schema=False, methods=["GET"]
    )
    return app


def _dashboard() -> HTMLResponse:
    html, policy = _dashboard_page()
    return HTMLResponse(html, headers={"Content-Security-Policy": policy})


@cache
def _dashboard_page() -> tuple[str, str]:
    """The page, and its Content-Security-Policy: its own inline script (by hash) and
    styles, requests to its own origin, nothing else (an injected script or handler does
    not run, no page may frame it)."""
    html = resources.files(__package__).joinpath("dashboard.html").read_text(encoding="utf-8")
    scripts = re.findall(r"<script>(.*?)</script>", html, flags=re.DOTALL)
    hashes = " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'"
        for s in scripts
    )
    policy = (
        f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )
    return html, policy
