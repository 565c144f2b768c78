"""A worker stopped while it is still starting stops as any other: it finishes starting,
then shuts down and exits 0 (a deploy may stop a worker whose app is still importing)."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.helpers import wait_until
from tests.processes import start_worker


def test_a_sigterm_while_the_app_imports_stops_the_worker_cleanly(
    dbos_agent_database_url: str, tmp_path: Path
) -> None:
    worker = start_worker(
        dbos_agent_database_url,
        "tests.apps.slow_import_app",
        env={"SLOW_IMPORT_DIR": str(tmp_path)},
    )
    try:
        wait_until(lambda: (tmp_path / "importing").exists(), 60, "the app's import began")
        worker.send_signal(signal.SIGTERM)
        (tmp_path / "go").touch()
        _, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, err
    assert "received a signal while starting: stopping" in err, err
    assert "stopped" in err, err
