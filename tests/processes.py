"""Worker daemons as real processes, for the tests that kill, pause and restart them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def start_worker(
    url: str, app: str, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``python -m dbos_agent.worker --app APP`` on ``url`` (stderr kept, stdout dropped),
    polling for orphans every 0.2 s unless ``extra`` says otherwise."""
    return subprocess.Popen(
        [sys.executable, "-m", "dbos_agent.worker", "--app", app, "--poll", "0.2", *extra],
        env={**os.environ, "DBOS_AGENT_DATABASE_URL": url, "PYTHONPATH": str(ROOT), **(env or {})},
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_workers(procs: list[subprocess.Popen[str]]) -> str:
    """SIGTERM each (after SIGCONT, in case one is paused), wait, and return what they
    wrote on stderr; one that does not stop within 30 s is killed."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
    logs = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        logs.append(err or "")
    return "\n".join(logs)
