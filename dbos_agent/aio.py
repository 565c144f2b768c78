"""The async forms of the workflow calls, under the same names: ``await aio.sleep(5)``
in an ``async def`` workflow is ``da.sleep(5)`` in a sync one, the same recorded step (a
replay returns the same outcome, whichever form recorded it).

They live apart so that the top level stays the short list a workflow body reads, and an
async body imports one module: ``from dbos_agent import aio``. Each call is what its sync
namesake's docstring says, awaited on the running event loop instead of blocking it.
"""

from __future__ import annotations

from ._engine.approvals import ask_approval_async as ask_approval
from ._engine.approvals import request_approval_async as request_approval
from ._engine.approvals import wait_for_approval_async as wait_for_approval
from ._engine.first import wait_first_async as wait_first
from ._engine.messaging import get_event_async as get_event
from ._engine.messaging import recv_async as recv
from ._engine.messaging import send_async as send
from ._engine.messaging import send_bulk_async as send_bulk
from ._engine.messaging import set_event_async as set_event
from ._engine.patches import patched_async as patched
from ._engine.run_step import run_step_async as run_step
from ._engine.streams import close_stream_async as close_stream
from ._engine.streams import read_stream_async as read_stream
from ._engine.streams import write_stream_async as write_stream
from ._engine.timers import sleep_async as sleep

__all__ = [
    "ask_approval",
    "close_stream",
    "get_event",
    "patched",
    "read_stream",
    "recv",
    "request_approval",
    "run_step",
    "send",
    "send_bulk",
    "set_event",
    "sleep",
    "wait_first",
    "wait_for_approval",
    "write_stream",
]
