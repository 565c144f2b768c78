"""The budget's part of a model call, on its own (agent/budget.py): outside a workflow a
guard publishes nothing, checks nothing and lets a refusal through; a raise keeps the
limits it does not name.

No Postgres here (``pytest tests/unit``)."""

from __future__ import annotations

import asyncio

import pytest

from dbos_agent.agent.budget import Budget, BudgetGuard
from dbos_agent.errors import BudgetExceededError


def test_outside_a_workflow_a_guard_does_nothing_but_let_a_refusal_through() -> None:
    guard = BudgetGuard(Budget(max_tokens=10, wait_for_raise=True))
    guard.publish()  # no run: no event
    asyncio.run(guard.publish_async())
    guard.check({"max_tokens": 1_000})  # no run: no family to count
    refused = BudgetExceededError("over")
    with pytest.raises(BudgetExceededError) as raised:
        guard.wait_for_raise(refused)
    assert raised.value is refused
    with pytest.raises(BudgetExceededError) as raised:
        asyncio.run(guard.wait_for_raise_async(refused))
    assert raised.value is refused


def test_a_raise_keeps_the_limits_it_does_not_name() -> None:
    budget = Budget(max_tokens=10, max_cost_usd=1.0, wait_for_raise=True)
    assert budget.raised_to({"max_tokens": 50}) == Budget(
        max_tokens=50, max_cost_usd=1.0, wait_for_raise=True
    )
    assert budget.raised_to("not a dict") == budget
