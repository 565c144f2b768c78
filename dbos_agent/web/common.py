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
from ..records import WorkflowInfo
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


def workflow_document(info: WorkflowInfo) -> dict[str, Any]:
    """A workflow as the API answers it: the CLI's document, with ``waiting`` (what it
    waits for: ``{"kind", "text", "step", "until"}`` or None, see ``records.Waiting``),
    and ``waiting_for`` in words (the dependency a step waits out, else a suspended
    wait's condition), as it always said."""
    document = documents.workflow_json(info)
    if info.retrying is not None:
        document["waiting_for"] = info.retrying.describe()
    else:
        document["waiting_for"] = info.waiting_for.describe() if info.waiting_for else None
    return document


def approval_document(request: Any) -> dict[str, Any]:
    """An approval request as JSON data."""
    return dataclasses.asdict(request)
