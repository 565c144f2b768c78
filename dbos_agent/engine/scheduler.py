"""Where :func:`fire_due` was first documented: the scheduler pass's one look on demand.
The pass itself is the runtime's (``runtime/scheduler.py``), given the process's schedules
by ``launch``; ``fire_due`` lives with the other one-shot passes (``passes.py``)."""

from .passes import fire_due as fire_due
from .runtime.scheduler import ON_TIME as ON_TIME
from .runtime.scheduler import FiredSlot as FiredSlot
from .runtime.scheduler import plan_slots as plan_slots
