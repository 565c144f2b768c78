"""Patching: changing a workflow's code while runs recorded by the old code still wait.

A workflow's log is its code's past: replay hands each position's recorded result to the
call the code makes there. Code that calls another step at a recorded position no longer
fits the log (the workflow is held DIVERGED, see core.py). To change the code anyway, guard
the new path with ``da.patched(name)``::

    if da.patched("check-stock-first"):
        check_stock(order)              # the new step
    reserve(order)                      # what the old code did at this position

* A run that reaches the patch live (past the end of its log) records a marker step
  (``dbos_agent.patch:<name>``) at that position and takes the new branch (True).
* A replay of a log written before the patch existed finds another step (or the gap of a
  position that recorded none) there: it takes the old branch (False) and consumes no
  position, so the old log's steps line up with the old calls.
* A replay of a log that has the marker takes the new branch again.

Once no run of the old code remains (``dbos-agent check-deploy`` tells), replace the
call with ``da.deprecate_patch(name)``, which accepts logs with or without the marker
(it consumes the marker when there is one, records nothing live) and always returns
True; later, drop it. One name is one place: the same name at two call sites of one
run is a :class:`PatchError`; called again at its site (a loop) it returns what it
returned the first time. Two ``patched_async`` calls of one run at once (tasks of one
``asyncio.gather``) are a :class:`PatchError` too, as DBOS refuses them: which of them
meets which position would depend on the tasks' timing, not on the code.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from datetime import UTC, datetime

from .._limits import MAX_IDENTIFIER_BYTES, check_identifier
from .._serialization import codec_for
from ..errors import InvalidIdentifierError, PatchError
from .runtime.checkpoints import builtin_step, checkpoint
from .runtime.context import WorkflowContext
from .runtime.outcome import Outcome
from .runtime.plans import Io, Plan, run_plan, run_plan_async
from .waits import workflow_only

#: The name of a patch's marker step is this prefix and the patch name.
PATCH_PREFIX = "dbos_agent.patch:"

_MARKER = codec_for(bool)
#: The longest patch name: its marker step's name (the prefix and the name) must be an
#: identifier.
MAX_PATCH_NAME_BYTES = MAX_IDENTIFIER_BYTES - len(PATCH_PREFIX)

#: The runs with a ``patched_async`` call in progress.
_patching: set[WorkflowContext] = set()
_patching_lock = threading.Lock()


def marker_name(name: str) -> str:
    """The step a run records where it took patch ``name``'s new branch."""
    if isinstance(name, str) and len(name.encode("utf-8", "surrogatepass")) > MAX_PATCH_NAME_BYTES:
        raise InvalidIdentifierError(  # one limit stated, whatever the name's length
            f"a patch name may be at most {MAX_PATCH_NAME_BYTES} bytes (UTF-8), got "
            f"{len(name.encode('utf-8', 'surrogatepass'))} bytes: {name[:60]!r}..."
        )
    check_identifier(name, "patch name")
    return PATCH_PREFIX + name


def _call_site() -> tuple[str, int]:
    """Where the workflow called ``patched``/``deprecate_patch`` (two frames up)."""
    frame = sys._getframe(2)
    return frame.f_code.co_filename, frame.f_lineno


def _patch_plan(
    ctx: WorkflowContext, name: str, site: tuple[str, int], *, deprecated: bool
) -> Plan[bool]:
    step_name = marker_name(name)
    known = ctx.patch_seen(name, site)
    if known is not None:
        return known
    row = ctx.next_recorded()
    if row is not None:  # replay: the marker, or a log from before the patch
        took = row.name == step_name
        if took:
            ctx.begin_step(step_name)  # consumes the marker's position
        result = took or deprecated
    elif not ctx.live_from_here():  # a position that recorded no step (a child's start)
        result = deprecated
    elif deprecated:  # live, and no old run remains: nothing to record
        result = True
    else:  # live: record the marker here, then take the new branch
        seq, _ = ctx.begin_step(step_name)
        step = builtin_step(step_name, _MARKER)
        done = yield Io(lambda: checkpoint(ctx, step, seq, Outcome(True), 1, datetime.now(UTC)))
        done.unwrap()
        result = True
    ctx.note_patch(name, site, result)
    return result


def patched(name: str) -> bool:
    """True where the workflow takes the new branch of the change named ``name``: in a
    run that reaches it live (a marker is recorded) or whose log has its marker; False in
    a replay of a log recorded before the change existed (no position is consumed).

    Only in a workflow function (not in a step). See the module docstring.
    """
    ctx = workflow_only("patched()")
    return run_plan(_patch_plan(ctx, name, _call_site(), deprecated=False))


async def patched_async(name: str) -> bool:
    """:func:`patched` for ``async`` workflows (the marker is written off the event loop)."""
    ctx = workflow_only("patched_async()")
    site = _call_site()
    with _patching_lock:
        if ctx in _patching:
            raise PatchError(
                f"patched_async({name!r}) was called while another patched_async of workflow "
                f"{ctx.workflow_id!r} is in progress (concurrent tasks, e.g. one "
                "asyncio.gather): which patch meets which position would depend on timing; "
                "await each patched_async before the next"
            )
        _patching.add(ctx)
    try:
        # A scheduling point, live or replayed alike (a replay may write nothing): a
        # concurrent call is refused on every run, not only on those that wrote a marker.
        await asyncio.sleep(0)
        return await run_plan_async(_patch_plan(ctx, name, site, deprecated=False))
    finally:
        with _patching_lock:
            _patching.discard(ctx)


def deprecate_patch(name: str) -> bool:
    """The last stage of patch ``name``, once no run recorded before it remains: always
    True; a log's marker at this position is consumed, and nothing is recorded live. Sync
    and async workflows alike (it never waits for the database)."""
    ctx = workflow_only("deprecate_patch()")
    return run_plan(_patch_plan(ctx, name, _call_site(), deprecated=True))
