"""What the API's routers share: the client of the app they serve, the id check, the
paths, and JSON answers written with the documents' own encoder."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any

from fastapi import Depends, Request, Response

from .. import _documents as documents
from .._engine.client import Client
from .._limits import check_identifier
from ..records import APPROVAL_TOPIC_PREFIX, WorkflowInfo, WorkflowStatus
from .guard import SEGMENT

#: The path of one workflow: its id is one segment, with any ``/`` in it sent as ``%2F``.
ONE = f"/api/workflows/{{workflow_id:{SEGMENT}}}"


async def app_client(request: Request) -> Client:
    """The :class:`Client` of the app serving the request (opened by its lifespan; async,
    so that finding it takes no worker thread)."""
    client: Client = request.app.state.client
    return client


#: A route's client, as a parameter: ``client: ClientOf``.
ClientOf = Annotated[Client, Depends(app_client)]


def valid_ids(request: Request) -> None:
    """A bad id is the caller's mistake (400), not a database error (500)."""
    for name in ("workflow_id", "key"):
        value = request.path_params.get(name)
        if value is not None:
            check_identifier(value, "workflow id" if name == "workflow_id" else "stream key")


#: Every route with ids in its path checks them first.
CHECKED = [Depends(valid_ids)]


def json_response(document: Any) -> Response:
    """``document`` as JSON, times and enums as the CLI's ``--json`` writes them."""
    body = json.dumps(document, default=documents.json_default, ensure_ascii=False)
    return Response(body, media_type="application/json")


def workflow_document(info: WorkflowInfo, orphan: bool = False) -> dict[str, Any]:
    """A workflow as the API answers it: the CLI's document and what it waits for (the
    dependency a step waits out, else a suspended wait's condition), in words."""
    document = documents.workflow_json(info)
    if info.retrying is not None:
        document["waiting_for"] = info.retrying.describe()
    else:
        document["waiting_for"] = info.waiting_for.describe() if info.waiting_for else None
    document["waiting"] = _temporary_waiting(info, orphan)
    return document


# TEMPORARY, replaced by the waiting branch (issue 31 item 3): the "waiting" document of
# the contract between the dashboard and the "waiting for" model, computed roughly here so
# that the dashboard can be built and tested before that model lands.
_WAIT_KINDS = {"sleep": "timer", "recv": "message", "event": "event", "child": "child"}


def _temporary_waiting(info: WorkflowInfo, orphan: bool) -> dict[str, Any] | None:
    def wait(kind: str, text: str, step: int | None, until: Any) -> dict[str, Any]:
        return {"kind": kind, "text": text, "step": step, "until": until}

    if info.status is WorkflowStatus.DIVERGED and info.diverged is not None:
        return wait(
            "divergence",
            f"code that fits its log ({info.diverged.describe()})",
            info.diverged.position,
            None,
        )
    if info.retrying is not None:
        retry = info.retrying
        return wait("dependency", retry.describe(), retry.seq, retry.next_at)
    if info.status is WorkflowStatus.ENQUEUED:
        return wait("queue", "its turn in its queue", None, info.delayed_until)
    found = info.waiting_for
    if info.status is WorkflowStatus.SUSPENDED and found is not None:
        topic = found.name or ""
        if found.kind == "recv" and topic.startswith(APPROVAL_TOPIC_PREFIX):
            asked = topic[len(APPROVAL_TOPIC_PREFIX) :]
            text = f"a human's approval (asked at step {asked})"
            return wait("approval", text, None, found.until)
        kind = _WAIT_KINDS.get(found.kind, "dependency")
        text = {
            "timer": "a timer",
            "message": f"a message on topic {topic!r}" if topic else "a message",
            "event": f"event {topic!r} of {found.target}",
            "child": f"the result of {found.target}",
        }.get(kind, found.describe())
        return wait(kind, text, None, found.until)
    if info.status is WorkflowStatus.PENDING and orphan:
        return wait("orphan", "no live process owns it", None, None)
    return None


def temporary_orphans(client: Client, infos: list[WorkflowInfo]) -> set[str]:
    """The PENDING ones among ``infos`` whose owner's session is not live (TEMPORARY)."""
    ids = [i.workflow_id for i in infos if i.status is WorkflowStatus.PENDING]
    if not ids:
        return set()
    with client.db.connection() as conn:
        rows = conn.execute(
            "SELECT workflow_id FROM dbos_agent.workflows WHERE workflow_id = ANY(%s)"
            " AND status = 'PENDING' AND (owner_key IS NULL"
            " OR owner_key NOT IN (SELECT dbos_agent.locked_sessions()))",
            (ids,),
        ).fetchall()
    return {r["workflow_id"] for r in rows}


def approval_document(request: Any) -> dict[str, Any]:
    """An approval request as JSON data."""
    return dataclasses.asdict(request)
