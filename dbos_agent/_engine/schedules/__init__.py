"""Schedules: durable workflows started on a cron schedule, once per slot.

The chapter in three modules, each with one job: ``cron.py`` says when a cron expression
fires (in a time zone, handed out in UTC); ``definitions.py`` is ``@scheduled`` and the
process's registry of schedules; ``operations.py`` is what operators do to the recorded
schedules (list, pause, resume, backfill), from the database alone (the CLI, ``Client``) or
through the launched runtime. The pass that fires due slots is the runtime's
(``_engine/runtime/scheduler.py``, given this registry by ``launch``), and so is a slot's
workflow id and argument (``runtime/slots.py``): neither is part of this package.
"""

from .cron import CronTimes
from .definitions import (
    MAX_SLOTS,
    Schedule,
    forget_schedules,
    registered_schedules,
    scheduled,
    slot_inputs,
    slot_workflow_id,
)
from .operations import (
    BackfillReport,
    backfill_schedule,
    backfill_schedule_slots,
    list_schedules,
    pause_schedule,
    read_schedule,
    read_schedules,
    resume_schedule,
    set_schedule_paused,
)

__all__ = [
    "MAX_SLOTS",
    "BackfillReport",
    "CronTimes",
    "Schedule",
    "backfill_schedule",
    "backfill_schedule_slots",
    "forget_schedules",
    "list_schedules",
    "pause_schedule",
    "read_schedule",
    "read_schedules",
    "registered_schedules",
    "resume_schedule",
    "scheduled",
    "set_schedule_paused",
    "slot_inputs",
    "slot_workflow_id",
]
