"""A schedule's slot as a workflow: its id and its recorded inputs, the same whoever makes
them (the scheduler pass firing a slot, a backfill, ``@scheduled`` checking that a name
leaves room for them), so each slot runs once wherever it is fired."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from ..._serialization import codec_for

#: The most slots one look at a schedule fires after downtime, and one backfill records:
#: a long outage of a per-second schedule never starts millions of workflows.
MAX_SLOTS = 10_000
#: ``@2026-12-04T17:30:00Z``: what a slot adds to the schedule's name in a workflow id.
SLOT_ID_BYTES = len("@2026-12-04T17:30:00Z")
_SLOT_CODEC = codec_for(datetime)


def slot_workflow_id(name: str, slot: datetime) -> str:
    """The id of the workflow of ``slot``: the schedule's name, ``@``, the slot in UTC."""
    return f"{name}@{slot.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def slot_inputs(slot_param: str, slot: datetime) -> str:
    """The recorded inputs of a slot's workflow, exactly as the workflow's own codec writes
    them (``{"param": "2026-12-04T17:30:00Z"}``): built here, they need no code."""
    value = _SLOT_CODEC.to_jsonable(slot.astimezone(UTC), f"slot {slot.isoformat()}")
    return json.dumps({slot_param: value}, separators=(",", ":"))
