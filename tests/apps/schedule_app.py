"""The application the schedule test's workers run (`python -m dbos_agent.worker --app
tests.apps.schedule_app`): a per-second schedule, on a database clock the test moves.

Each slot's workflow runs one step that appends ``pid slot`` to $SCHEDULE_APP_LOG
(fsynced), so the test sees from outside who ran which slot, and how often. A thread keeps
this process's database clock ``$SCHEDULE_APP_CLOCK`` seconds ahead (the test rewrites
that file to move time for every worker at once).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import dbos_agent as da
from dbos_agent.errors import NotLaunchedError
from dbos_agent.testing import advance_clock, clock_offset

LOG = os.environ.get("SCHEDULE_APP_LOG", "/dev/null")
CLOCK = os.environ.get("SCHEDULE_APP_CLOCK")
NAME = os.environ.get("SCHEDULE_APP_NAME", "every-second")


@da.step
def note(slot: str) -> str:
    with open(LOG, "a") as f:
        f.write(f"{os.getpid()} {slot}\n")
        f.flush()
        os.fsync(f.fileno())
    return slot


@da.scheduled(
    "* * * * * *",
    name=NAME,
    catch_up="all",
    catch_up_window=timedelta(hours=1),
    overlap="allow",
)
@da.durable_workflow
def tick(scheduled_at: datetime) -> str:
    return note(f"{scheduled_at:%Y-%m-%dT%H:%M:%SZ}")


def _follow_the_clock(path: Path) -> None:
    """Keep this process's clock offset at the number in ``path``."""
    while True:
        with contextlib.suppress(NotLaunchedError, OSError, ValueError):
            target = float(path.read_text())
            if target != clock_offset():
                advance_clock(target - clock_offset())
        time.sleep(0.02)


if CLOCK:
    threading.Thread(
        target=_follow_the_clock, args=(Path(CLOCK),), name="follow-the-clock", daemon=True
    ).start()
