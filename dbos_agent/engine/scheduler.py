"""``dbos_agent.engine.scheduler.fire_due``, as the README once documented it: it works for
one more release and warns; use :func:`dbos_agent.testing.fire_due`."""

from __future__ import annotations

import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    if name != "fire_due":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        "dbos_agent.engine.scheduler.fire_due moved: use dbos_agent.testing.fire_due; "
        "the old path goes in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    from .._engine.passes import fire_due

    return fire_due
