"""Durable messages into workflows (``send``/``recv``) and events out of them.

Exactly once, by construction in the database:

* ``recv`` consumes the oldest unconsumed message of (workflow, topic) and
  records it as the result of its step in **one statement**
  (``receive_message`` in queries.sql): the message is marked with the step
  position that took it only if that step row was written. There is no moment
  at which a message is consumed but not recorded, or recorded twice; on
  replay ``recv`` returns the recorded message and touches no mailbox.
* ``send`` from a workflow is a step whose message carries the idempotency
  key ``"<workflow id>:<position>"`` (the position's :func:`step_key`): a
  crash between the insert and the checkpoint re-sends under the same key,
  which inserts nothing. From outside a workflow, pass ``idempotency_key``.
* ``set_event`` records its step and upserts the value in one statement.

Waiting uses LISTEN/NOTIFY with polling behind it (see notifications.py);
timeouts are durable deadlines on the database's clock (see timers.py).
Values are JSON through pydantic; pass ``as_type`` to get a typed value back.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterable
from contextlib import nullcontext
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar, overload

from .._limits import check_identifier, check_topic
from .._serialization import Codec, codec_for
from .._storage.database import SystemDatabase
from .._storage.rows import StepEffect
from .._storage.suspension import WaitCondition
from ..errors import NotInWorkflowError, WorkflowNotFoundError
from .runtime.checkpoints import adopt_recorded, builtin_step, checkpoint, recorded, where
from .runtime.clock import cancel_key, wait_once
from .runtime.context import WorkflowHost, current_context, in_step
from .runtime.current import current_engine
from .runtime.deadlines import continue_or_adopt, durable_wait
from .runtime.notifications import EVENTS_CHANNEL, MESSAGES_CHANNEL
from .runtime.outcome import Outcome
from .runtime.ownership import ensure_owned, owns_now
from .runtime.plans import Io, Plan, Wait, run_plan, run_plan_async
from .waits import check_seconds, step_attempt, workflow_only

T = TypeVar("T")

SEND_STEP = "dbos_agent.send"
SEND_BULK_STEP = "dbos_agent.send_bulk"
RECV_STEP = "dbos_agent.recv"
SET_EVENT_STEP = "dbos_agent.set_event"
GET_EVENT_STEP = "dbos_agent.get_event"

_ANY = codec_for(Any)
_SEND = builtin_step(SEND_STEP, codec_for(None))
_SEND_BULK = builtin_step(SEND_BULK_STEP, codec_for(None))
_SET_EVENT = builtin_step(SET_EVENT_STEP, codec_for(None))


def _timeout(timeout: float | None) -> float | None:
    """None (or infinity) waits forever."""
    if timeout is None or timeout == math.inf:
        return None
    return check_seconds(timeout, "timeout")


# -- send ---------------------------------------------------------------------------------


def _insert(
    db: SystemDatabase, destination_id: str, payload: str, topic: str | None, key: str | None
) -> Outcome:
    found, _ = db.messages.send(
        destination_id=destination_id, topic=topic or "", message=payload, idempotency_key=key
    )
    return Outcome() if found else Outcome(error=WorkflowNotFoundError(destination_id))


def _check_send(destination_id: str, topic: str | None, idempotency_key: str | None) -> None:
    check_identifier(destination_id, "destination workflow id")
    check_topic(topic)
    if idempotency_key is not None:
        check_identifier(idempotency_key, "idempotency key")


def send_plain(
    db: SystemDatabase,
    destination_id: str,
    message: Any,
    topic: str | None = None,
    idempotency_key: str | None = None,
) -> bool:
    """A send that is not a step (outside a workflow, in a step, from a client or the CLI);
    whether it stored a message (False: its key was sent before). Without a key one is
    made, so that a send retried through an outage is delivered once."""
    _check_send(destination_id, topic, idempotency_key)
    payload = _ANY.dumps(message, f"message to workflow {destination_id!r}")
    found, inserted = db.messages.send(
        destination_id=destination_id,
        topic=topic or "",
        message=payload,
        idempotency_key=idempotency_key or f"send:{uuid.uuid4()}",
    )
    if not found:
        raise WorkflowNotFoundError(destination_id)
    return inserted


def _send_plan(
    destination_id: str, message: Any, topic: str | None, idempotency_key: str | None
) -> Plan[None]:
    ctx = current_context()
    if ctx is None or in_step():
        engine = current_engine() if ctx is None else ctx.engine
        yield Io(partial(send_plain, engine.db, destination_id, message, topic, idempotency_key))
        return
    _check_send(destination_id, topic, idempotency_key)
    payload = _ANY.dumps(message, f"message to workflow {destination_id!r}")
    seq, row = ctx.begin_step(SEND_STEP)
    if row is not None:
        recorded(ctx, _SEND, seq, row).unwrap()
        return
    started_at = datetime.now(UTC)
    key = idempotency_key or f"{ctx.workflow_id}:{seq}"
    if not owns_now(ctx):  # the message is a side effect: only while the workflow is ours
        yield Io(partial(ensure_owned, ctx))
    sent = yield Io(partial(_insert, ctx.engine.db, destination_id, payload, topic, key))
    done: Outcome = yield Io(partial(checkpoint, ctx, _SEND, seq, sent, 1, started_at))
    done.unwrap()


def send(
    workflow_id: str,
    message: Any,
    topic: str | None = None,
    idempotency_key: str | None = None,
) -> None:
    """Send ``message`` (JSON through pydantic) to the workflow ``workflow_id``, durably.

    It waits in the database until that workflow ``recv``s it on ``topic``
    (None is the default topic, the same as ``""``). Messages with the same
    ``idempotency_key`` to the same workflow are delivered once. Called in a
    workflow, the send is a step (``dbos_agent.send``) keyed by its position, so
    replay never sends twice. Inside a ``@step`` it is a plain send (the step may
    run again): key it, e.g. ``idempotency_key=f"{da.step_key()}:1"``. Raises
    WorkflowNotFoundError for an unknown id.
    """
    run_plan(_send_plan(workflow_id, message, topic, idempotency_key))


async def send_async(
    workflow_id: str,
    message: Any,
    topic: str | None = None,
    idempotency_key: str | None = None,
) -> None:
    """:func:`send` for ``async`` code."""
    await run_plan_async(_send_plan(workflow_id, message, topic, idempotency_key))


# -- send_bulk ----------------------------------------------------------------------------

#: One message of ``send_bulk``: ``(destination_id, message)``, with a topic and an
#: idempotency key after it if wanted.
BulkMessage = (
    tuple[str, Any] | tuple[str, Any, str | None] | tuple[str, Any, str | None, str | None]
)
#: A message checked: destination, topic ('' the default), payload JSON, key (None: made).
_Checked = tuple[str, str, str, str | None]


def _checked(messages: Iterable[BulkMessage]) -> list[_Checked]:
    checked: list[_Checked] = []
    for item in messages:
        if not isinstance(item, tuple | list) or not 2 <= len(item) <= 4:
            raise TypeError(
                "send_bulk takes (destination_id, message[, topic[, idempotency_key]]) "
                f"tuples, got {item!r}"
            )
        destination_id, message, topic, key = (*item, None, None)[:4]
        _check_send(destination_id, topic, key)
        payload = _ANY.dumps(message, f"message to workflow {destination_id!r}")
        checked.append((destination_id, topic or "", payload, key))
    return checked


def _insert_many(db: SystemDatabase, messages: list[_Checked], keys: list[str]) -> Outcome:
    """The messages under ``keys`` (a message's own key first) in one statement; the
    count stored, or WorkflowNotFoundError (nothing stored) for a missing destination."""
    rows = [(d, t, p, own or made) for (d, t, p, own), made in zip(messages, keys, strict=True)]
    inserted, missing = db.messages.send_many(rows)
    return Outcome(error=WorkflowNotFoundError(missing[0])) if missing else Outcome(inserted)


def send_bulk_plain(db: SystemDatabase, messages: Iterable[BulkMessage]) -> int:
    """A ``send_bulk`` that is not a step (see :func:`send_plain`): how many messages it
    stored (the others' keys were sent before)."""
    checked = _checked(messages)
    if not checked:
        return 0
    made = [f"send:{uuid.uuid4()}" for _ in checked]
    return int(_insert_many(db, checked, made).unwrap())


def _send_bulk_plan(messages: Iterable[BulkMessage]) -> Plan[None]:
    ctx = current_context()
    if ctx is None or in_step():
        engine = current_engine() if ctx is None else ctx.engine
        yield Io(partial(send_bulk_plain, engine.db, list(messages)))
        return
    checked = _checked(messages)
    seq, row = ctx.begin_step(SEND_BULK_STEP)
    if row is not None:
        recorded(ctx, _SEND_BULK, seq, row).unwrap()
        return
    started_at = datetime.now(UTC)
    keys = [f"{ctx.workflow_id}:{seq}:{i}" for i in range(len(checked))]
    if not owns_now(ctx):
        yield Io(partial(ensure_owned, ctx))
    sent: Outcome = yield Io(partial(_insert_many, ctx.engine.db, checked, keys))
    outcome = Outcome() if sent.error is None else sent
    done: Outcome = yield Io(partial(checkpoint, ctx, _SEND_BULK, seq, outcome, 1, started_at))
    done.unwrap()


def send_bulk(messages: Iterable[BulkMessage]) -> None:
    """Send many messages at once: ``(destination_id, message)`` tuples, each with a topic
    and an idempotency key after it if wanted, in one statement, so that 10,000 messages
    cost about what a few sends do.

    Each message is what :func:`send` would store: delivered once per key (a message
    without a key gets one). All of them are stored, or none: a destination that does not
    exist raises WorkflowNotFoundError naming it. Called in a workflow it is one step
    (``dbos_agent.send_bulk``), replayed without sending again; elsewhere a plain call.
    """
    run_plan(_send_bulk_plan(messages))


async def send_bulk_async(messages: Iterable[BulkMessage]) -> None:
    """:func:`send_bulk` for ``async`` code."""
    await run_plan_async(_send_bulk_plan(messages))


# -- recv ---------------------------------------------------------------------------------


def recv_plan(topic: str | None, timeout: float | None, codec: Codec) -> Plan[Any]:
    check_topic(topic, "recv topic")
    timeout = _timeout(timeout)
    ctx = workflow_only("recv()")
    seq, row = ctx.begin_step(RECV_STEP)
    step = builtin_step(RECV_STEP, codec)
    if row is not None and row.status.finished:
        return recorded(ctx, step, seq, row).unwrap()
    db = ctx.engine.db
    started_at = datetime.now(UTC)
    inputs = {"topic": topic}

    def attempt() -> Plan[Outcome | None]:
        write, message = yield Io(
            partial(
                db.messages.receive,
                workflow_id=ctx.workflow_id,
                seq=seq,
                name=RECV_STEP,
                topic=topic or "",
                inputs=json.dumps(inputs),
                started_at=started_at,
                owner_key=ctx.engine.session_key,
            )
        )
        if write.written:
            return Outcome(codec.loads(message or "null", where(ctx, seq, step)))
        return continue_or_adopt(ctx, step, seq, write)  # None: nothing to take yet

    wakes = ((MESSAGES_CHANNEL, ctx.workflow_id), cancel_key(ctx))
    condition = WaitCondition("recv", target=ctx.workflow_id, name=topic or "")
    with ctx.engine.notifications.waiter(*wakes) as waiter:
        outcome = yield from durable_wait(
            ctx, step, seq, row, inputs, timeout, waiter, attempt, condition
        )
    return outcome.unwrap()


@overload
def recv(topic: str | None = None, timeout: float | None = 60.0) -> Any: ...
@overload
def recv(topic: str | None, timeout: float | None, *, as_type: type[T]) -> T: ...
@overload
def recv(*, topic: str | None = None, timeout: float | None = 60.0, as_type: type[T]) -> T: ...


def recv(topic: str | None = None, timeout: float | None = 60.0, *, as_type: Any = Any) -> Any:
    """Take the oldest message sent to this workflow on ``topic``, waiting up to ``timeout``.

    Returns None on timeout (``timeout=None`` waits forever). A step
    (``dbos_agent.recv``): the message is consumed and recorded in one
    statement, so it is received exactly once, also across crashes; replay
    returns the recorded message (or None). The timeout is a durable deadline:
    after a crash the wait ends at the original time. Only in a workflow.
    """
    return run_plan(recv_plan(topic, timeout, codec_for(as_type)))


async def recv_async(
    topic: str | None = None, timeout: float | None = 60.0, *, as_type: Any = Any
) -> Any:
    """:func:`recv` for ``async`` workflows (waits on the event loop)."""
    return await run_plan_async(recv_plan(topic, timeout, codec_for(as_type)))


# -- events -------------------------------------------------------------------------------


def _set_event_plan(key: str, value: Any) -> Plan[None]:
    check_identifier(key, "event key")
    ctx = current_context()
    if ctx is None:
        raise NotInWorkflowError("set_event() can only be called inside a durable workflow")
    where_ = f"workflow {ctx.workflow_id!r} event {key!r}"
    payload = _ANY.dumps(value, where_)
    if in_step():  # set with the step's checkpoint, if this attempt succeeds
        attempt = step_attempt("set_event()")
        attempt.effects.append(StepEffect("event", key, ctx.engine.db.json_in(payload, where_)))
        return
    seq, row = ctx.begin_step(SET_EVENT_STEP)
    if row is not None:
        recorded(ctx, _SET_EVENT, seq, row).unwrap()
        return
    write = yield Io(
        partial(
            ctx.engine.db.messages.set_event,
            workflow_id=ctx.workflow_id,
            seq=seq,
            name=SET_EVENT_STEP,
            key=key,
            value=payload,
            inputs=json.dumps({"key": key}),
            started_at=datetime.now(UTC),
            owner_key=ctx.engine.session_key,
        )
    )
    if not write.written:
        adopt_recorded(ctx, _SET_EVENT, seq, write).unwrap()


def set_event(key: str, value: Any) -> None:
    """Publish ``value`` (JSON through pydantic) under ``key`` from this workflow.

    The last value per key wins; :func:`get_event` reads it from anywhere. A
    step (``dbos_agent.set_event``): the step and the value are written in one
    statement, and replay does not write again. Only in a workflow.

    Inside a ``@step`` it is no step of its own: the value is set in the transaction
    that checkpoints the step, if the attempt succeeds (exactly once with the step; a
    failed attempt, or a crash before the checkpoint, sets nothing). A fork does not copy
    such a value, nor does a rewind take it back: they follow ``set_event`` steps.
    """
    run_plan(_set_event_plan(key, value))


async def set_event_async(key: str, value: Any) -> None:
    """:func:`set_event` for ``async`` workflows."""
    await run_plan_async(_set_event_plan(key, value))


#: How often a waiter without notifications (a client) looks again for an event.
_CLIENT_POLL_S = 0.1


def poll_event(
    db: SystemDatabase,
    engine: WorkflowHost | None,
    workflow_id: str,
    key: str,
    timeout: float | None,
    codec: Codec,
    default: Any = None,
) -> Plan[Any]:
    """Outside a workflow: wait for the event without recording anything, woken by the
    engine's notifications (a client, without an engine, polls); ``default`` at timeout."""
    end = math.inf if timeout is None else time.monotonic() + timeout
    where_ = f"workflow {workflow_id!r} event {key!r}"
    listening = (
        nullcontext(None)
        if engine is None
        else engine.notifications.waiter((EVENTS_CHANNEL, workflow_id))
    )
    with listening as waiter:
        while True:
            text = yield Io(partial(db.messages.get_event, workflow_id, key))
            if text is not None:
                return codec.loads(text, where_)
            left = end - time.monotonic()
            if left <= 0:
                return default
            if engine is None or waiter is None:
                yield Wait(None, min(left, _CLIENT_POLL_S))
            else:
                yield from wait_once(engine, waiter, left, None)


def _get_event_plan(workflow_id: str, key: str, timeout: float | None, codec: Codec) -> Plan[Any]:
    check_identifier(workflow_id, "workflow id")
    check_identifier(key, "event key")
    timeout = _timeout(timeout)
    ctx = current_context()
    if ctx is None or in_step():
        engine = current_engine() if ctx is None else ctx.engine
        return (yield from poll_event(engine.db, engine, workflow_id, key, timeout, codec))
    seq, row = ctx.begin_step(GET_EVENT_STEP)
    step = builtin_step(GET_EVENT_STEP, codec)
    if row is not None and row.status.finished:
        return recorded(ctx, step, seq, row).unwrap()
    db = ctx.engine.db
    started_at = datetime.now(UTC)

    def attempt() -> Plan[Outcome | None]:
        text = yield Io(partial(db.messages.get_event, workflow_id, key))
        if text is None:
            return None
        value = codec.loads(text, where(ctx, seq, step))
        done: Outcome = yield Io(partial(checkpoint, ctx, step, seq, Outcome(value), 1, started_at))
        return done

    inputs = {"workflow_id": workflow_id, "key": key}
    wakes = ((EVENTS_CHANNEL, workflow_id), cancel_key(ctx))
    condition = WaitCondition("event", target=workflow_id, name=key)
    with ctx.engine.notifications.waiter(*wakes) as waiter:
        outcome = yield from durable_wait(
            ctx, step, seq, row, inputs, timeout, waiter, attempt, condition
        )
    return outcome.unwrap()


@overload
def get_event(workflow_id: str, key: str, timeout: float | None = 60.0) -> Any: ...
@overload
def get_event(
    workflow_id: str, key: str, timeout: float | None = 60.0, *, as_type: type[T]
) -> T: ...


def get_event(
    workflow_id: str, key: str, timeout: float | None = 60.0, *, as_type: Any = Any
) -> Any:
    """The value workflow ``workflow_id`` published under ``key``, waiting up to ``timeout``.

    Returns None if it is not set in time (``timeout=None`` waits forever).
    Works from anywhere; in a workflow it is a step (``dbos_agent.get_event``)
    whose result replays, with a durable deadline like :func:`recv`.
    """
    return run_plan(_get_event_plan(workflow_id, key, timeout, codec_for(as_type)))


async def get_event_async(
    workflow_id: str, key: str, timeout: float | None = 60.0, *, as_type: Any = Any
) -> Any:
    """:func:`get_event` for ``async`` code (waits on the event loop)."""
    return await run_plan_async(_get_event_plan(workflow_id, key, timeout, codec_for(as_type)))
