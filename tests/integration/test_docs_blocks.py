"""Every runnable Python block of README.md and docs/ runs as written.

A block is runnable when the comment ``<!-- runnable -->`` is on the line before its
fence (tests/support/docs_blocks.py; docs/contributing.md says when to mark one). Each
runs in this process, compiled under its page and line (a traceback points at the
page), as ``__main__`` (a script's ``if __name__ == "__main__":`` part runs), with:

* ``$DBOS_AGENT_DATABASE_URL`` naming a fresh, migrated database of its own, so
  ``da.launch()`` and ``da.Client()`` without a URL open it;
* the Anthropic client (``anthropic.Anthropic()``, and ``Model()`` without one) pointed
  at a scripted Messages API server (``docs_blocks.scripted_model``): no key, no network;
* each ``test_*`` function it defines called afterwards, given ``dbos_agent_database_url``
  (that database) if it asks for it, as pytest would.

What a block registers (workflows, queues, schedules, the code version) is forgotten
after it, and a block must leave no runtime launched. Keep each block to well under a
few seconds: the suite runs them all.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

import dbos_agent as da
from dbos_agent._engine.queues import isolated_queues
from dbos_agent._engine.runtime import registry
from dbos_agent._engine.schedules import definitions as schedules
from dbos_agent.agent import model
from dbos_agent.agent.scripted_server import ScriptedServer
from dbos_agent.errors import NotLaunchedError
from dbos_agent.postgres.opening import open_system_database
from dbos_agent.testing import fresh_database
from tests.support.docs_blocks import Block, runnable_blocks, scripted_model

BLOCKS = runnable_blocks()


@pytest.fixture(scope="module")
def model_url() -> Iterator[str]:
    with ScriptedServer(scripted_model) as server:
        yield server.url


@pytest.fixture
def block_database(dbos_agent_postgres_url: str) -> Iterator[str]:
    with fresh_database(dbos_agent_postgres_url) as url:
        open_system_database(url, create=False, migrate=True, pool_size=1).close()
        yield url


@pytest.fixture
def isolated(
    monkeypatch: pytest.MonkeyPatch, block_database: str, model_url: str
) -> Iterator[None]:
    """A block's world: its database and model, and registries of its own."""
    monkeypatch.setenv("DBOS_AGENT_DATABASE_URL", block_database)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", model_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "docs-scripted")
    monkeypatch.setattr(model, "_default_client", anthropic.Anthropic())
    monkeypatch.setattr(model, "_default_async_client", None)
    monkeypatch.setattr(registry, "_workflows", {})
    monkeypatch.setattr(registry, "_code_modules", dict(registry._code_modules))
    monkeypatch.setattr(schedules, "_schedules", {})
    with isolated_queues():
        yield


def test_the_docs_have_runnable_blocks() -> None:
    assert {block.path.name for block in BLOCKS} >= {"README.md", "testing.md"}


@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_runnable_block(block: Block, block_database: str, isolated: None) -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    code = "\n" * (block.line - 1) + block.code
    try:
        exec(compile(code, str(block.path), "exec"), namespace)
        for name, value in list(namespace.items()):
            if name.startswith("test_") and inspect.isfunction(value):
                wants = inspect.signature(value).parameters
                value(**({"dbos_agent_database_url": block_database} if wants else {}))
    finally:
        left = _launched()
        if left is not None:
            left.shutdown(grace=1)
    assert left is None, f"{block.name} left a runtime launched: use `with da.launch():`"


def _launched() -> da.Runtime | None:
    try:
        return da.current_runtime()
    except NotLaunchedError:
        return None
