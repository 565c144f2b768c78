"""``check_replay``: does new code fit recorded histories? For tests and CI.

It is ``dbos-agent check-deploy`` as a function: import the new code, replay histories
against it without running anything live (see :mod:`dbos_agent._engine.deploy_check`),
and return the report to assert on::

    def test_the_new_code_fits_what_production_has_in_flight(dbos_agent_database_url):
        report = check_replay("myapp.workflows", "tests/histories.jsonl",
                              database_url=dbos_agent_database_url)
        assert report.fits, report.verdicts

Histories come from a database (its unfinished workflows of the names the code
registers) or from an export (``dbos-agent export --unfinished > histories.jsonl``: a
path, or the lines themselves).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType

from .._engine import deploy_check
from .._engine.extending import workflow_names
from .._storage.database import SystemDatabase
from .._storage.histories import History, read_export, read_histories
from ..postgres.embedded import resolve_url
from ..worker import import_app


def check_replay(
    app: str | ModuleType | None,
    histories: str | os.PathLike[str] | Iterable[str] | None = None,
    *,
    database_url: str | None = None,
    names: Iterable[str] | None = None,
    app_version: str | None = None,
    timeout: float = deploy_check.DEFAULT_TIMEOUT_S,
) -> deploy_check.DeployCheck:
    """Replay ``histories`` against the code of ``app`` (a module or its name, imported
    first; None: what this process registered already), running nothing live.

    ``histories``: None for the unfinished workflows in the database (of ``names``,
    default every registered workflow), a path to an export, or its lines. The database
    (``database_url``, default as ``launch``) is only read: the replays look up the
    workflows they started and the clock there, on read-only connections.
    """
    if isinstance(app, str):
        import_app(app)
    db = SystemDatabase(resolve_url(database_url), pool_size=2, read_only=True)
    db.open()
    try:
        wanted = sorted(names if names is not None else workflow_names())
        if histories is None:
            found: Iterable[History] = deploy_check.stored_histories(db, wanted)
        else:
            found = _given(histories)
        return deploy_check.check(found, db, app_version=app_version, timeout=timeout)
    finally:
        db.close()


def _given(histories: str | os.PathLike[str] | Iterable[str]) -> Iterator[History]:
    if isinstance(histories, str | os.PathLike):
        for _, _, history in read_export(str(Path(histories))):
            yield history
        return
    for _, _, history in read_histories(histories, "the histories given"):
        yield history
