"""Every exported name resolves: ``from dbos_agent.x import *`` and ``dbos_agent.x.Name``
work for every name a module lists in ``__all__`` (lazy packages included), and the
values users are handed (a recovery's report, a suspended workflow's wait) are exported.

No Postgres here (``pytest tests/unit``)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

import dbos_agent


def _modules() -> list[str]:
    """Every module of the package, ``__main__`` (which runs the CLI) aside."""
    names = [dbos_agent.__name__]
    for info in pkgutil.walk_packages(dbos_agent.__path__, f"{dbos_agent.__name__}."):
        if not info.name.endswith("__main__"):
            names.append(info.name)
    return names


MODULES = _modules()


def _all_of(module: ModuleType) -> list[str]:
    exported = getattr(module, "__all__", None)
    return [] if exported is None else list(exported)


@pytest.mark.parametrize("name", MODULES)
def test_every_name_in_all_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = _all_of(module)
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ lists names that do not resolve: {missing}"
    doubled = sorted({n for n in exported if exported.count(n) > 1})
    assert not doubled, f"{name}.__all__ lists names twice: {doubled}"


def test_the_packages_all_are_checked() -> None:
    for package in ("dbos_agent", "dbos_agent.agent", "dbos_agent.testing", "dbos_agent.web"):
        assert package in MODULES
        assert _all_of(importlib.import_module(package)), f"{package} exports nothing"


def test_what_users_are_handed_is_exported() -> None:
    from dbos_agent.records import RecoveryReport, WaitInfo

    assert dbos_agent.records.RecoveryReport is RecoveryReport
    assert dbos_agent.records.WaitInfo is WaitInfo


def test_async_forms_of_the_approval_calls_are_exported() -> None:
    for name in ("ask_approval", "wait_for_approval", "request_approval"):
        assert name in dbos_agent.aio.__all__
        assert inspect.iscoroutinefunction(getattr(dbos_agent.aio, name)), name


def test_the_agent_spend_is_the_budget_spend() -> None:
    from dbos_agent.agent import Spend
    from dbos_agent.agent.budget import Spend as BudgetSpend

    assert Spend is BudgetSpend


def test_recorded_errors_have_their_own_module_and_keep_their_old_path() -> None:
    import dbos_agent._serialization as serialization

    codec = importlib.import_module("dbos_agent._errors_codec")
    for name in ("dumps_error", "error_from_json", "loads_error"):
        assert getattr(serialization, name) is getattr(codec, name)
    assert "pydantic" not in codec.__dict__  # it needs no value codec
    error = codec.loads_error(codec.dumps_error(ValueError("bad input")))
    assert isinstance(error, ValueError) and str(error) == "bad input"
