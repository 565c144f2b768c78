"""An app whose import waits (as a large app's does) until the test lets it go: it writes
``$SLOW_IMPORT_DIR/importing``, then waits for ``$SLOW_IMPORT_DIR/go``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import dbos_agent as da

_DIR = Path(os.environ["SLOW_IMPORT_DIR"])
(_DIR / "importing").touch()
for _ in range(6000):  # at most a minute
    if (_DIR / "go").exists():
        break
    time.sleep(0.01)


@da.durable_workflow
def idle() -> str:
    return "idle"
