"""The stream routes: the keys a workflow streams under, and a durable stream as
Server-Sent Events, resumable.

Within the server's limits (:mod:`.limits`): at most ``max_streams`` answers at once (one
more is 503 ``TooManyStreams``); each holds one page of items at a time, at most
``page_bytes`` of JSON text (or one larger item alone), read only once the client has
taken the last page (the server's writes wait while the connection's buffer is full);
an item's text is relayed as stored, never rebuilt as Python values, in slices.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from .._engine.streams import StreamItem, follow_async
from .common import CHECKED, ONE, ClientOf, json_response
from .guard import SEGMENT
from .limits import STREAM_SLICE_CHARS

router = APIRouter(tags=["streams"], dependencies=CHECKED)


class StreamSlots:
    """The streams open now, all clients together, against ``most``; and the page size
    of each (an app's own: :func:`~dbos_agent.web.create_app` makes one)."""

    def __init__(self, most: int, page_bytes: int) -> None:
        if most < 1 or page_bytes < 1:
            raise ValueError(
                f"max_streams and stream_page_bytes must be >= 1, got {most}, {page_bytes}"
            )
        self.most = most
        self.page_bytes = page_bytes
        self.open = 0

    def take(self) -> bool:
        if self.open >= self.most:
            return False
        self.open += 1
        return True

    def give_back(self) -> None:
        self.open -= 1


class _EventStream(StreamingResponse):
    """A stream answer that holds a slot while it runs, or a 503 when none is free.
    The slot is given back, and the reading stopped, however the answer ends (the
    client gone included: the base class stops on ``http.disconnect``)."""

    def __init__(self, slots: StreamSlots, events: AsyncIterator[bytes]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.slots = slots
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.slots.take():
            await _close(self.events)
            busy = JSONResponse(
                {
                    "error": f"this server follows {self.slots.most} streams at once already "
                    f"(its --max-streams); try again later",
                    "type": "TooManyStreams",
                },
                status_code=503,
                headers={"Retry-After": "5"},
            )
            await busy(scope, receive, send)
            return
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slots.give_back()
            await _close(self.events)

    async def stream_response(self, send: Send) -> None:
        """The base class's, but the event loop runs once after each write, so that a
        connection the client has closed is seen as closed before the next write (each
        write to it would log a warning)."""
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        async for chunk in self.events:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await asyncio.sleep(0)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _close(iterator: AsyncIterator[object]) -> None:
    """Stop an async generator now (not when it is collected)."""
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()


async def _events(items: AsyncIterator[StreamItem]) -> AsyncIterator[bytes]:
    """The SSE bytes of ``items`` (values as JSON text), an item's text in slices.

    An item is let go of once written: when the answer is cancelled (the client gone)
    while the next page is read, the exception keeps this frame a while, and it must
    not keep an item with it."""
    try:
        async for item in items:
            kind = "reset" if item.reset else "value"
            yield (
                f'id: {item.offset}\nevent: {kind}\ndata: {{"offset": {item.offset}, "value": '
            ).encode()
            text: str = "null" if item.value is None else item.value
            for start in range(0, len(text), STREAM_SLICE_CHARS):
                yield text[start : start + STREAM_SLICE_CHARS].encode()
            yield (
                f', "reset": {json.dumps(item.reset)}, "step": {json.dumps(item.step)}, '
                f'"attempt": {json.dumps(item.attempt)}}}\n\n'
            ).encode()
            del item, text
        yield b"event: end\ndata: {}\n\n"
    finally:
        await _close(items)


@router.get(ONE + "/streams")
def stream_keys(workflow_id: str, client: ClientOf) -> Response:
    """The keys the workflow has written streams under, in order, each with
    ``next_offset`` (how many items it holds) and ``closed``: what may be followed
    (an empty list for a workflow that never streamed)."""
    return json_response([dataclasses.asdict(k) for k in client.stream_keys(workflow_id)])


@router.get(ONE + f"/streams/{{key:{SEGMENT}}}")
async def stream(
    workflow_id: str,
    key: str,
    request: Request,
    client: ClientOf,
    offset: Annotated[int, Query(alias="from", ge=0)] = 0,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    """The stream as Server-Sent Events: ``id`` is the offset (resume with
    ``Last-Event-ID``), ``event`` is ``value`` or ``reset``, ``data`` the item as
    JSON; ``event: end`` when the stream is closed or the workflow has finished.
    503 ``TooManyStreams`` when the server follows its most streams already."""
    start = offset
    if last_event_id is not None and last_event_id.strip().isdigit():
        start = int(last_event_id) + 1
    await asyncio.to_thread(client.get_workflow, workflow_id)
    slots: StreamSlots = request.app.state.stream_slots
    items = follow_async(
        client.db, None, workflow_id, key, start, page_bytes=slots.page_bytes, parse=False
    )
    return _EventStream(slots, _events(items))
