"""The public surface has a budget: the top level is what a workflow body and a program's
start-up write, ``dbos_agent.agent`` what an agent's author writes; every error lives in
``dbos_agent.errors``; the names that moved still resolve, for one release, with a
DeprecationWarning that names their new path.

No Postgres here (``pytest tests/unit``)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import warnings

import pytest

import dbos_agent
import dbos_agent.agent
import dbos_agent.errors

#: The caps: raising one is a decision about the surface, not a side effect of a feature.
TOP_LEVEL_BUDGET = 50
AGENT_BUDGET = 25

#: Exception classes that never reach a library user: the CLI's exit paths (caught by its
#: ``main``) and the pool's signal to the connector (a psycopg error, retried as an outage).
INTERNAL_SIGNALS = {
    "dbos_agent.cli.building.UsageError",
    "dbos_agent._storage.pool.PoolExhausted",
}


def test_the_top_level_keeps_its_budget() -> None:
    assert len(dbos_agent.__all__) <= TOP_LEVEL_BUDGET, sorted(dbos_agent.__all__)


def test_the_agent_package_keeps_its_budget() -> None:
    assert len(dbos_agent.agent.__all__) <= AGENT_BUDGET, sorted(dbos_agent.agent.__all__)


def test_dir_lists_only_the_new_surface() -> None:
    top = set(dir(dbos_agent))
    assert set(dbos_agent.__all__) <= top
    assert top - set(dbos_agent.__all__) == {"aio", "errors", "operations", "records"}
    assert set(dir(dbos_agent.agent)) == set(dbos_agent.agent.__all__)
    assert not {"cancel", "sleep_async", "StepInfo", "WorkflowStatusError"} & top


def _library_modules() -> list[str]:
    """Every module, the optional integrations' included (their extras are installed in
    development); ``__main__`` aside, which runs the CLI."""
    names = [
        info.name
        for info in pkgutil.walk_packages(dbos_agent.__path__, "dbos_agent.")
        if not info.name.endswith("__main__")
    ]
    return names


def test_every_error_of_the_library_is_in_the_errors_module() -> None:
    elsewhere = []
    for name in _library_modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, Exception)
                and value.__module__ == name
                and name != "dbos_agent.errors"
                and not attr.startswith("_")
                and f"{name}.{attr}" not in INTERNAL_SIGNALS
            ):
                elsewhere.append(f"{name}.{attr}")
    assert elsewhere == [], f"errors defined outside dbos_agent.errors: {elsewhere}"


@pytest.mark.parametrize(
    "name",
    ["AsyncOnlyToolError", "McpConnectionError", "ToolInputError", "ToolCallRejected"],
)
def test_the_agent_layers_errors_are_in_the_errors_module(name: str) -> None:
    assert getattr(dbos_agent.errors, name).__module__ == "dbos_agent.errors"


def test_the_top_level_errors_are_the_errors_modules() -> None:
    errors = [n for n in dbos_agent.__all__ if n.endswith("Error")]
    assert errors and all(getattr(dbos_agent, n) is getattr(dbos_agent.errors, n) for n in errors)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("cancel", dbos_agent.operations.cancel),
        ("sleep_async", dbos_agent.aio.sleep),
        ("WorkflowStatusError", dbos_agent.errors.WorkflowStatusError),
        ("StepInfo", dbos_agent.records.StepInfo),
    ],
)
def test_an_old_top_level_name_warns_and_is_the_same_object(old: str, new: object) -> None:
    with pytest.warns(DeprecationWarning, match=rf"dbos_agent\.{old} moved: use dbos_agent\."):
        assert getattr(dbos_agent, old) is new


def test_an_old_import_still_works_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="dbos_agent.operations.list_workflows"):
        from dbos_agent import list_workflows
    assert list_workflows is dbos_agent.operations.list_workflows


def test_an_old_agent_name_warns_and_is_the_same_object() -> None:
    from dbos_agent.agent.replay import replaying

    with pytest.warns(DeprecationWarning, match=r"use dbos_agent\.agent\.replay\.replaying"):
        assert dbos_agent.agent.replaying is replaying
    with pytest.warns(DeprecationWarning, match=r"use dbos_agent\.errors\.ToolInputError"):
        assert dbos_agent.agent.ToolInputError is dbos_agent.errors.ToolInputError


def test_every_moved_name_resolves() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in dbos_agent._MOVED:
            assert getattr(dbos_agent, name) is not None, name
        for name in dbos_agent.agent._MOVED:
            assert getattr(dbos_agent.agent, name) is not None, name


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        dbos_agent.no_such_name  # noqa: B018
    with pytest.raises(AttributeError, match="no_such_name"):
        dbos_agent.agent.no_such_name  # noqa: B018


def test_the_async_forms_keep_the_sync_names() -> None:
    for name in dbos_agent.aio.__all__:
        assert getattr(dbos_agent.aio, name).__name__ == f"{name}_async"
        assert name in dbos_agent.__all__, f"aio.{name} has no sync form at the top level"


def test_the_documented_engine_path_of_fire_due_warns_and_is_the_same_object() -> None:
    import dbos_agent.testing

    with pytest.warns(DeprecationWarning) as said:
        old = importlib.import_module("dbos_agent.engine.scheduler")
    assert old.fire_due is dbos_agent.testing.fire_due
    assert any("dbos_agent.testing.fire_due" in str(w.message) for w in said)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("dbos_agent.engine.runtime.core", "dbos_agent._engine.runtime.core"),
        ("dbos_agent.engine.runtime.engine", "dbos_agent._engine.runtime.current"),
        ("dbos_agent.engine.schedule_operations", "dbos_agent._engine.schedules.operations"),
        ("dbos_agent.storage.database", "dbos_agent._storage.database"),
        ("dbos_agent.serialization", "dbos_agent._serialization"),
    ],
)
def test_a_module_that_became_private_is_the_same_module_under_its_old_name(
    old: str, new: str
) -> None:
    """One module object under both names (one set of registries), its own name kept."""
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning) as said:  # the old parent packages warn too
        module = importlib.import_module(old)
    assert any(f"{old} is private now and moved: {new} " in str(w.message) for w in said)
    assert module is importlib.import_module(new)
    assert module.__name__ == new and module.__spec__ is not None
    assert module.__spec__.name == new
