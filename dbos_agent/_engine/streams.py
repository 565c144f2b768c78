"""Durable streams: ordered JSON values a workflow publishes, followed by readers anywhere.

The contract, for a reader following ``(workflow, key)`` from an offset:

* Items come in offset order, each once; a reader that reconnects with the offset after
  the last item it saw gets neither a gap nor a duplicate.
* A value written **from the workflow body** (``da.write_stream``) is checkpointed with a
  step, in the same transaction: exactly once, and a replay writes nothing again.
* A value written **from inside a step** (model token deltas) goes out live, tagged with
  the step's position (``item.step``) and attempt. If that attempt fails, or the process
  dies and the step runs again, the step's earlier items are void: a ``reset`` item naming
  the step comes before anything newer of it (written when the attempt fails, and before
  the first item of the next attempt). A UI drops what it shows of that step and goes on.
* ``da.close_stream`` (from the body, checkpointed) ends the stream; nothing may follow
  it. Called inside a step, the close is made in the transaction that checkpoints the
  step, if that attempt succeeds (so once, with the step; the close item is tagged with
  the step, so a rewind before it reopens the stream). Closing a closed stream there is
  no error: it stays closed. A reader also stops once the workflow has finished and it
  has read everything.
* A workflow body that reads a stream (``da.read_stream``) records each item it reads,
  and the end, as a step: its replay reads the same items, whatever the stream holds
  then. A cancel of the reading workflow ends its wait.

Readers in a launched process are woken by ``LISTEN/NOTIFY`` (channel
``dbos_agent_streams``, payload the workflow id) and poll as a fallback; a
:class:`~dbos_agent.Client` polls.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pydantic_core

from .._limits import check_identifier
from .._serialization import codec_for
from .._storage.database import SystemDatabase
from .._storage.rows import StepEffect
from ..errors import DbosAgentError, SerializationError, WorkflowNotFoundError
from .runtime.checkpoints import adopt_recorded, builtin_step, checkpoint, recorded
from .runtime.clock import cancel_key, stop_if_interrupted
from .runtime.context import WorkflowContext, current_attempt, current_context, in_step
from .runtime.current import current_engine
from .runtime.notifications import Notifications, Waiter
from .runtime.outcome import Outcome
from .runtime.plans import Io, Plan, Wait, run_plan, run_plan_async
from .waits import step_attempt

STREAM_STEP = "dbos_agent.write_stream"
CLOSE_STEP = "dbos_agent.close_stream"
READ_STEP = "dbos_agent.read_stream"
#: NOTIFY channel of stream writes; the payload is the workflow id.
STREAMS_CHANNEL = "dbos_agent_streams"
# the output: the item's offset, as every version wrote and reads it; the inputs name the key
_WRITE = builtin_step(STREAM_STEP, codec_for(int))
_CLOSE = builtin_step(CLOSE_STEP, codec_for(int))
# the output: an item ({"offset", "value", "reset", "step", "attempt"}), {"end": true},
# or {"timeout": message}
_READ = builtin_step(READ_STEP, codec_for(dict[str, Any]))
#: How often a reader without LISTEN looks again (a Client; a lost NOTIFY).
_POLL_S = 0.1
_PAGE = 500
#: The most JSON text of one page of items (but one item, however large): a reader holds
#: one page at a time.
PAGE_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class StreamItem:
    """One item of a stream: a value, or a ``reset`` voiding step ``step``'s earlier items."""

    offset: int
    value: Any
    reset: bool = False
    #: The position of the step that wrote it (None: the workflow body).
    step: int | None = None
    #: Which attempt of that step.
    attempt: int | None = None


def _json(value: object, key: str) -> str:
    try:
        return pydantic_core.to_json(value).decode()
    except Exception as exc:
        raise SerializationError(
            f"a value written to stream {key!r} is not JSON-serialisable "
            f"({type(value).__name__}): {exc}"
        ) from None


def _write_plan(key: str, value: object, kind: str) -> Plan[None]:
    check_identifier(key, "stream key")
    text = _json(value, key) if kind == "value" else None
    ctx = current_context()
    if ctx is None:
        what = "write_stream" if kind == "value" else "close_stream"
        raise DbosAgentError(f"{what} can only be called inside a durable workflow")
    db = ctx.engine.db
    if in_step():
        if kind == "value":
            yield from _write_live(ctx, key, text)
            return
        # closed with the step's checkpoint, if this attempt succeeds
        attempt = step_attempt("close_stream()")
        attempt.effects.append(StepEffect("close", key, None, attempt.number, attempt.id))
        return
    step = _WRITE if kind == "value" else _CLOSE
    seq, row = ctx.begin_step(step.name)
    if row is not None:  # replay: written once already
        recorded(ctx, step, seq, row).unwrap()
        return
    write, _ = yield Io(
        partial(
            db.streams.append_checkpointed,
            workflow_id=ctx.workflow_id,
            key=key,
            kind=kind,
            value=text,
            seq=seq,
            step_name=step.name,
            owner_key=ctx.engine.session_key,
            started_at=datetime.now(UTC),
        )
    )
    if not write.written:
        adopt_recorded(ctx, step, seq, write).unwrap()


def _write_live(ctx: WorkflowContext, key: str, text: str | None) -> Plan[None]:
    """A value from inside a step: out now, tagged with the attempt; voided if it fails."""
    attempt = current_attempt()
    db = ctx.engine.db
    seq, number, tag = (
        (None, None, None) if attempt is None else (attempt.seq, attempt.number, attempt.id)
    )
    yield Io(
        partial(
            db.streams.append_live,
            ctx.workflow_id,
            key,
            "value",
            text,
            seq=seq,
            attempt=number,
            attempt_id=tag,
            owner_key=ctx.engine.session_key,
        )
    )
    if attempt is not None:
        attempt.on_void(
            f"stream {key!r}",
            partial(
                db.streams.append_live,
                ctx.workflow_id,
                key,
                "reset",
                None,
                seq=attempt.seq,
                attempt=attempt.number,
                attempt_id=attempt.id,
                owner_key=ctx.engine.session_key,
            ),
        )


def write_stream(key: str, value: object) -> None:
    """Append ``value`` (JSON) to this workflow's stream ``key``.

    From the workflow function it is checkpointed (exactly once; a replay writes
    nothing); from inside a step it goes out at once, tagged with the step and its
    attempt (see the module's contract). Raises StreamClosedError after close_stream.
    """
    run_plan(_write_plan(key, value, "value"))


async def write_stream_async(key: str, value: object) -> None:
    """:func:`write_stream` for async code (the write runs off the event loop)."""
    await run_plan_async(_write_plan(key, value, "value"))


def close_stream(key: str) -> None:
    """End this workflow's stream ``key`` (checkpointed): readers stop after it. Inside a
    ``@step`` the close happens with the step's checkpoint, if the attempt succeeds."""
    run_plan(_write_plan(key, None, "close"))


async def close_stream_async(key: str) -> None:
    """:func:`close_stream` for async workflows."""
    await run_plan_async(_write_plan(key, None, "close"))


# -- reading ------------------------------------------------------------------------------


def _next_page(
    db: SystemDatabase,
    workflow_id: str,
    key: str,
    offset: int,
    deadline: float | None,
    waiter: Waiter | None,
    timeout: float | None,
    ctx: WorkflowContext | None = None,
    *,
    page_bytes: int = PAGE_BYTES,
    parse: bool = True,
) -> Plan[tuple[list[StreamItem], bool]]:
    """The next items from ``offset`` (waiting for some), and whether the stream ended.
    Waiting in workflow ``ctx``, a cancel (or shutdown) ends the wait by raising.
    Without ``parse`` a value is its JSON text, as stored (for a relay)."""
    while True:
        rows, status = yield Io(
            partial(db.streams.read, workflow_id, key, offset, _PAGE, page_bytes)
        )
        items: list[StreamItem] = []
        for row in rows:
            if row.kind == "close":
                return items, True
            value = row.value
            if parse and value is not None:
                value = pydantic_core.from_json(value)
            items.append(
                StreamItem(row.offset, value, row.kind == "reset", row.step_seq, row.attempt)
            )
        if items:
            return items, False
        if status is not None and status.finished:
            return items, True
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            if status is None:  # waited for, as DBOS does: it may start a moment later
                raise WorkflowNotFoundError(workflow_id)
            raise TimeoutError(
                f"no new item in stream {key!r} of workflow {workflow_id!r} within {timeout}s"
            )
        pause = _POLL_S if waiter is None else 1.0
        yield Wait(waiter, pause if left is None else min(pause, left))
        if ctx is not None:
            stop_if_interrupted(ctx)


def _listening(
    notifications: Notifications | None, workflow_id: str
) -> AbstractContextManager[Waiter | None]:
    if notifications is None:
        return nullcontext(None)
    notifications.listen(STREAMS_CHANNEL)
    return notifications.waiter((STREAMS_CHANNEL, workflow_id))


def follow(
    db: SystemDatabase,
    notifications: Notifications | None,
    workflow_id: str,
    key: str,
    offset: int = 0,
    timeout: float | None = None,
) -> Iterator[StreamItem]:
    """The items of a stream from ``offset``, as they come, until it ends (the engine's
    read_stream and the Client's)."""
    check_identifier(workflow_id, "workflow id")
    check_identifier(key, "stream key")
    with _listening(notifications, workflow_id) as waiter:
        while True:
            deadline = None if timeout is None else time.monotonic() + timeout
            items, ended = run_plan(
                _next_page(db, workflow_id, key, offset, deadline, waiter, timeout)
            )
            items.reverse()  # each item let go of once taken, the page before the next read
            while items:
                item = items.pop()
                offset = item.offset + 1
                yield item
                del item
            if ended:
                return


async def follow_async(
    db: SystemDatabase,
    notifications: Notifications | None,
    workflow_id: str,
    key: str,
    offset: int = 0,
    timeout: float | None = None,
    *,
    page_bytes: int = PAGE_BYTES,
    parse: bool = True,
) -> AsyncIterator[StreamItem]:
    """:func:`follow` for an event loop. ``page_bytes`` bounds the JSON text of a page
    (one item at least); without ``parse`` a value is its JSON text, as stored. The next
    page is read only once the caller has taken every item of the last one."""
    check_identifier(workflow_id, "workflow id")
    check_identifier(key, "stream key")
    with _listening(notifications, workflow_id) as waiter:
        while True:
            deadline = None if timeout is None else time.monotonic() + timeout
            items, ended = await run_plan_async(
                _next_page(
                    db,
                    workflow_id,
                    key,
                    offset,
                    deadline,
                    waiter,
                    timeout,
                    page_bytes=page_bytes,
                    parse=parse,
                )
            )
            items.reverse()  # each item let go of once taken, the page before the next read
            while items:
                item = items.pop()
                offset = item.offset + 1
                yield item
                del item
            if ended:
                return


# -- reading from a workflow body: every item read is a step ------------------------------


@dataclass(slots=True)
class _Reading:
    """A read_stream in a workflow body: where it is, and the items of the last page read
    that it has not returned yet."""

    ctx: WorkflowContext
    workflow_id: str
    key: str
    offset: int
    timeout: float | None
    waiter: Waiter
    page: deque[StreamItem] = field(default_factory=deque)
    ended: bool = False


def _record_of(item: StreamItem) -> dict[str, Any]:
    return {
        "offset": item.offset,
        "value": item.value,
        "reset": item.reset,
        "step": item.step,
        "attempt": item.attempt,
    }


def _read_plan(reading: _Reading) -> Plan[StreamItem | None]:
    """The next item (None: the stream ended) as a step: recorded when read live, taken
    from the log on replay, so a replay reads what the run read, whatever the stream holds
    now. A wait for an item ends with the workflow's cancel."""
    ctx = reading.ctx
    seq, row = ctx.begin_step(READ_STEP)
    if row is None:
        started_at = datetime.now(UTC)
        record = yield from _read_live(reading)
        done: Outcome = yield Io(
            partial(checkpoint, ctx, _READ, seq, Outcome(record), 1, started_at)
        )
        record = done.unwrap()
    else:
        record = recorded(ctx, _READ, seq, row).unwrap()
    if "timeout" in record:
        raise TimeoutError(record["timeout"])
    if record.get("end"):
        return None
    item = StreamItem(
        record["offset"], record["value"], record["reset"], record["step"], record["attempt"]
    )
    reading.offset = item.offset + 1
    while reading.page and reading.page[0].offset < reading.offset:
        reading.page.popleft()
    return item


def _read_live(reading: _Reading) -> Plan[dict[str, Any]]:
    """What the next read step records: an item, the end, or a timeout."""
    if not reading.page and not reading.ended:
        deadline = None if reading.timeout is None else time.monotonic() + reading.timeout
        try:
            with reading.ctx.waiting():
                items, reading.ended = yield from _next_page(
                    reading.ctx.engine.db,
                    reading.workflow_id,
                    reading.key,
                    reading.offset,
                    deadline,
                    reading.waiter,
                    reading.timeout,
                    reading.ctx,
                )
        except TimeoutError as exc:
            return {"timeout": str(exc)}
        reading.page.extend(items)
    if reading.page:
        return _record_of(reading.page[0])
    return {"end": True}


def _reading(ctx: WorkflowContext, workflow_id: str, key: str) -> AbstractContextManager[Waiter]:
    """The waiter of a read in a workflow: woken by a write to the stream, or a cancel."""
    check_identifier(workflow_id, "workflow id")
    check_identifier(key, "stream key")
    notifications = ctx.engine.notifications
    notifications.listen(STREAMS_CHANNEL)
    return notifications.waiter((STREAMS_CHANNEL, workflow_id), cancel_key(ctx))


def _read_unrecorded(ctx: WorkflowContext) -> bool:
    """Whether this read replays a log of a version that did not record reads: the log
    holds another step where the first read would be recorded. It then reads the stream
    as that version did (a deploy must not make a waiting workflow diverge)."""
    row = ctx.next_recorded()
    return row is not None and row.name != READ_STEP


def _read_in_workflow(
    ctx: WorkflowContext, workflow_id: str, key: str, offset: int, timeout: float | None
) -> Iterator[StreamItem]:
    if _read_unrecorded(ctx):
        yield from follow(
            ctx.engine.db, ctx.engine.notifications, workflow_id, key, offset, timeout
        )
        return
    with _reading(ctx, workflow_id, key) as waiter:
        reading = _Reading(ctx, workflow_id, key, offset, timeout, waiter)
        while (item := run_plan(_read_plan(reading))) is not None:
            yield item


async def _read_in_workflow_async(
    ctx: WorkflowContext, workflow_id: str, key: str, offset: int, timeout: float | None
) -> AsyncIterator[StreamItem]:
    if _read_unrecorded(ctx):
        engine = ctx.engine
        async for unrecorded in follow_async(
            engine.db, engine.notifications, workflow_id, key, offset, timeout
        ):
            yield unrecorded
        return
    with _reading(ctx, workflow_id, key) as waiter:
        reading = _Reading(ctx, workflow_id, key, offset, timeout, waiter)
        while (item := await run_plan_async(_read_plan(reading))) is not None:
            yield item


def read_stream(
    workflow_id: str, key: str, offset: int = 0, *, timeout: float | None = None
) -> Iterator[StreamItem]:
    """Follow stream ``key`` of a workflow from ``offset``: items as they are written,
    until the stream is closed or the workflow has finished. ``timeout`` bounds the wait
    for each next item (TimeoutError). A workflow that does not exist yet is waited for,
    as DBOS does (WorkflowNotFoundError if it still does not when the timeout passes).

    From a workflow body each item read, the end and a timeout are steps
    (``dbos_agent.read_stream``): a replay returns what the run read without reading the
    stream, and a cancel of the reading workflow ends its wait."""
    ctx = current_context()
    if ctx is not None and not in_step():
        return _read_in_workflow(ctx, workflow_id, key, offset, timeout)
    engine = current_engine()
    return follow(engine.db, engine.notifications, workflow_id, key, offset, timeout)


def read_stream_async(
    workflow_id: str, key: str, offset: int = 0, *, timeout: float | None = None
) -> AsyncIterator[StreamItem]:
    """:func:`read_stream` as an async iterator (``async for item in ...``)."""
    ctx = current_context()
    if ctx is not None and not in_step():
        return _read_in_workflow_async(ctx, workflow_id, key, offset, timeout)
    engine = current_engine()
    return follow_async(engine.db, engine.notifications, workflow_id, key, offset, timeout)


__all__ = [
    "StreamItem",
    "close_stream",
    "close_stream_async",
    "read_stream",
    "read_stream_async",
    "write_stream",
    "write_stream_async",
]
