"""The HTTP API: the CLI's operator actions as JSON over HTTP, and streams as SSE.

``create_app(database_url, token=...)`` returns an ASGI application (FastAPI, with its
OpenAPI document at ``/api/openapi.json``) that works on the system database through a
:class:`~dbos_agent.Client`: it runs no workflow itself, so it is stateless and may run
in as many copies as wanted beside the workers. ``dbos-agent serve`` runs it on uvicorn
with the dashboard at ``/``.

Errors are JSON ``{"error": ..., "type": ...}``: 401 without the bearer token (when one is
set), 404 for an unknown workflow or step, 409 for an action the workflow's status does
not allow, 400 for a bad value (an id with a NUL, an over-long id), 422 for a body that
does not fit; what :mod:`.guard` refuses before the API sees a request (a foreign host or
origin, a body that is not JSON or too large) is JSON too. They never contain the
database password.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from importlib import resources
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from .. import documents
from ..engine.client import Client
from ..engine.operations import CANCELLABLE, RESUMABLE
from ..engine.retention import parse_moment
from ..errors import (
    ApprovalError,
    DbosAgentError,
    InvalidIdentifierError,
    SerializationError,
    WorkflowNotFoundError,
    WorkflowStatusError,
)
from ..limits import check_identifier
from ..records import WorkflowInfo, WorkflowStatus, describe_step
from ..storage.dsn import scrub
from ..storage.rows import ForkResult, ResumeResult
from .guard import DEFAULT_MAX_BODY_BYTES, SEGMENT, Guard

__all__ = ["create_app"]

#: The path of one workflow: its id is one segment, with any ``/`` in it sent as ``%2F``.
_ONE = f"/api/workflows/{{workflow_id:{SEGMENT}}}"


class ForkBody(BaseModel):
    from_step: int = Field(ge=0, description="the first step to run live")
    new_id: str | None = Field(default=None, description="id of the new workflow")


class SendBody(BaseModel):
    message: Any = Field(description="any JSON value")
    topic: str | None = None
    idempotency_key: str | None = None


class ResolveBody(BaseModel):
    result: Any = Field(default=None, description="the result the step had (it happened)")
    rerun: bool = Field(default=False, description="it did not happen: run it again")


class DecisionBody(BaseModel):
    approve: bool = Field(description="true approves the call, false rejects it")
    digest: str = Field(description="the digest of the request being decided")
    reason: str | None = None


def _status_of(exc: Exception) -> int:
    if isinstance(exc, WorkflowNotFoundError):
        return 404
    if isinstance(exc, WorkflowStatusError | ApprovalError):
        return 409
    if isinstance(exc, InvalidIdentifierError | SerializationError | ValueError):
        return 400
    return 500


def create_app(
    database_url: str | None = None,
    *,
    token: str | None = None,
    host: str = "127.0.0.1",
    allow_hosts: Iterable[str] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The API (and the dashboard at ``/``) on the system database at ``database_url``
    (default: as ``launch()`` finds it). With ``token``, every request but the dashboard's
    page must carry ``Authorization: Bearer <token>``. ``host`` is the address it is
    served on and ``allow_hosts`` other names it answers for (the ``Host`` header is
    checked against them); bodies are at most ``max_body_bytes`` (see :mod:`.guard`)."""
    state: dict[str, Client] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state["client"] = Client(database_url)
        try:
            yield
        finally:
            state.pop("client").close()

    app = FastAPI(
        title="dbos_agent",
        summary="See and steer durable workflows",
        lifespan=lifespan,
        openapi_url="/api/openapi.json",
        docs_url="/api/docs",
        redoc_url=None,
    )

    app.add_middleware(
        Guard,
        token=token,
        bound_host=host,
        allow_hosts=tuple(allow_hosts),
        max_body_bytes=max_body_bytes,
    )

    def client() -> Client:
        return state["client"]

    def valid_ids(request: Request) -> None:
        """A bad id is the caller's mistake (400), not a database error (500)."""
        for name in ("workflow_id", "key"):
            value = request.path_params.get(name)
            if value is not None:
                check_identifier(value, "workflow id" if name == "workflow_id" else "stream key")

    def url_of_db() -> str | None:
        client = state.get("client")
        return None if client is None else client.db.url

    async def on_error(_: Request, exc: Exception) -> Response:
        status = _status_of(exc)
        message = str(exc) if status != 500 else f"internal error: {exc}"
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return JSONResponse(
            {"error": scrub(message, url_of_db()), "type": type(exc).__name__},
            status_code=status,
            headers=headers,
        )

    # the library's errors and refused values are answers, not crashes
    for kind in (DbosAgentError, ValueError):
        app.add_exception_handler(kind, on_error)

    @app.exception_handler(RequestValidationError)
    async def on_bad_body(_: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return JSONResponse(
            {"error": f"invalid request: {problems}", "type": "RequestValidationError"},
            status_code=422,
        )

    guard = [Depends(valid_ids)]

    def _json(document: Any) -> Response:
        body = json.dumps(document, default=documents.json_default, ensure_ascii=False)
        return Response(body, media_type="application/json")

    @app.get("/api/workflows", dependencies=guard)
    def list_workflows(
        status: WorkflowStatus | None = None,
        name: str | None = None,
        queue: str | None = None,
        executor: str | None = None,
        since: Annotated[str | None, Query(description="ISO time or 30m, 2h, 7d ago")] = None,
        until: Annotated[str | None, Query(description="ISO time or 30m, 2h, 7d ago")] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    ) -> Response:
        """Workflows matching every given filter, newest first (the CLI's filters)."""
        found = client().list_workflows(
            status=status,
            name=None if name is None else check_identifier(name, "workflow name"),
            queue=None if queue is None else check_identifier(queue, "queue name"),
            executor_id=None if executor is None else check_identifier(executor, "executor id"),
            created_after=None if since is None else parse_moment(since),
            created_before=None if until is None else parse_moment(until),
            limit=limit,
        )
        return _json([_workflow(info) for info in found])

    @app.get(_ONE, dependencies=guard)
    def show(workflow_id: str) -> Response:
        """One workflow with its steps (timings, attempts, tokens) and its token usage."""
        info = client().get_workflow(workflow_id)
        steps = client().list_steps(workflow_id)
        digests = [describe_step(step) for step in steps]
        origin = client().fork_origin(workflow_id)
        document = _workflow(info)
        document["forked_from"] = origin[0] if origin else None
        document["forked_from_step"] = origin[1] if origin else None
        document["actions"] = {  # what the dashboard offers: what the status allows
            "cancel": info.status in CANCELLABLE,
            "resume": info.status in RESUMABLE,
        }
        document["steps"] = [
            {
                **documents.step_json(s, d),
                "summary": d.summary if d else None,
                "replayed": info.replayed(s),
            }
            for s, d in zip(steps, digests, strict=True)
        ]
        document["usage"] = documents.token_totals(digests)
        budget = client().get_event(workflow_id, documents.BUDGET_EVENT)
        document["budget"] = documents.budget_json(
            None if budget is None else json.dumps(budget), document["usage"]
        )
        return _json(document)

    @app.get(_ONE + "/steps", dependencies=guard)
    def steps(workflow_id: str) -> Response:
        """The recorded steps of a workflow, in order."""
        found = client().list_steps(workflow_id)
        return _json([documents.step_json(s, describe_step(s)) for s in found])

    @app.post(_ONE + "/cancel", dependencies=guard)
    def cancel(workflow_id: str) -> Response:
        """Cancel a workflow (and the ones it started); cancelling again changes nothing."""
        previous = client().cancel(workflow_id)
        return _json({"workflow_id": workflow_id, "previous_status": previous})

    @app.post(_ONE + "/resume", dependencies=guard)
    def resume(workflow_id: str) -> Response:
        """Make a cancelled or dead-lettered workflow PENDING again (a worker continues it)."""
        report = client().resume(workflow_id).report
        assert isinstance(report, ResumeResult)
        return _json({"workflow_id": workflow_id, "previous_status": report.previous})

    @app.post(_ONE + "/fork", dependencies=guard)
    def fork(workflow_id: str, body: ForkBody) -> Response:
        """A new workflow that reuses the steps before ``from_step`` and runs live from it."""
        handle = client().fork(workflow_id, body.from_step, new_workflow_id=body.new_id)
        result = handle.report
        assert isinstance(result, ForkResult)
        return _json(
            {
                "workflow_id": handle.workflow_id,
                "status": WorkflowStatus.PENDING,
                "forked_from": workflow_id,
                "forked_from_step": result.from_step,
                "requested_from_step": body.from_step,
                "copied_steps": result.copied_steps,
                "executor_id": result.executor_id,
            }
        )

    @app.post(_ONE + "/send", dependencies=guard)
    def send(workflow_id: str, body: SendBody) -> Response:
        """Send a message to the workflow (it receives it with ``recv(topic)``)."""
        sent = client().send(workflow_id, body.message, body.topic, body.idempotency_key)
        return _json({"workflow_id": workflow_id, "topic": body.topic, "sent": sent})

    @app.post(_ONE + "/steps/{seq}/resolve", dependencies=guard)
    def resolve(workflow_id: str, seq: int, body: ResolveBody) -> Response:
        """Resolve an in-doubt step: record the result it had, or let it run again."""
        if body.rerun == ("result" in body.model_fields_set):
            raise ValueError('give exactly one of "result" (it happened) or "rerun": true')
        if body.rerun:
            handle = client().resolve_in_doubt(workflow_id, seq, rerun=True)
        else:
            handle = client().resolve_in_doubt(workflow_id, seq, result=body.result)
        return _json({"workflow_id": workflow_id, "seq": seq, "status": handle.status()})

    @app.get("/api/approvals", dependencies=guard)
    def pending_approvals() -> Response:
        """Every PENDING approval request, newest first."""
        return _json([_approval(a) for a in client().approvals()])

    @app.get(_ONE + "/approvals", dependencies=guard)
    def approvals(workflow_id: str) -> Response:
        """A workflow's approval requests (the tool, its arguments, their digest, status)."""
        client().get_workflow(workflow_id)
        return _json([_approval(a) for a in client().approvals(workflow_id)])

    @app.post(_ONE + "/approvals/{seq}", dependencies=guard)
    def decide_approval(workflow_id: str, seq: int, body: DecisionBody) -> Response:
        """Approve or reject the call asked about at step ``seq``, bound to its digest:
        409 for other arguments, a second decision, or a workflow that no longer waits."""
        decision = client().approve if body.approve else client().reject
        decision(workflow_id, seq, body.digest, body.reason)
        return _json({"workflow_id": workflow_id, "seq": seq, "approved": body.approve})

    @app.get(_ONE + f"/streams/{{key:{SEGMENT}}}", dependencies=guard)
    async def stream(
        workflow_id: str,
        key: str,
        offset: Annotated[int, Query(alias="from", ge=0)] = 0,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> StreamingResponse:
        """The stream as Server-Sent Events: ``id`` is the offset (resume with
        ``Last-Event-ID``), ``event`` is ``value`` or ``reset``, ``data`` the item as
        JSON; ``event: end`` when the stream is closed or the workflow has finished."""
        start = offset
        if last_event_id is not None and last_event_id.strip().isdigit():
            start = int(last_event_id) + 1
        client().get_workflow(workflow_id)
        items = client().read_stream_async(workflow_id, key, start)

        async def events() -> AsyncIterator[str]:
            async for item in items:
                data = {
                    "offset": item.offset,
                    "value": item.value,
                    "reset": item.reset,
                    "step": item.step,
                    "attempt": item.attempt,
                }
                kind = "reset" if item.reset else "value"
                yield f"id: {item.offset}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"
            yield "event: end\ndata: {}\n\n"

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard() -> HTMLResponse:
        return HTMLResponse(_dashboard_html())

    return app


def _workflow(info: WorkflowInfo) -> dict[str, Any]:
    document = documents.workflow_json(info)
    document["waiting_for"] = info.waiting_for.describe() if info.waiting_for else None
    return document


def _approval(request: Any) -> dict[str, Any]:
    return dataclasses.asdict(request)


def _dashboard_html() -> str:
    return resources.files(__package__).joinpath("dashboard.html").read_text(encoding="utf-8")
