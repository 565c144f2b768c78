"""The stream route: a workflow's durable stream as Server-Sent Events, resumable."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse

from .common import CHECKED, ONE, ClientOf
from .guard import SEGMENT

router = APIRouter(tags=["streams"], dependencies=CHECKED)


@router.get(ONE + f"/streams/{{key:{SEGMENT}}}")
async def stream(
    workflow_id: str,
    key: str,
    client: ClientOf,
    offset: Annotated[int, Query(alias="from", ge=0)] = 0,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    """The stream as Server-Sent Events: ``id`` is the offset (resume with
    ``Last-Event-ID``), ``event`` is ``value`` or ``reset``, ``data`` the item as
    JSON; ``event: end`` when the stream is closed or the workflow has finished."""
    start = offset
    if last_event_id is not None and last_event_id.strip().isdigit():
        start = int(last_event_id) + 1
    client.get_workflow(workflow_id)
    items = client.read_stream_async(workflow_id, key, start)

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
