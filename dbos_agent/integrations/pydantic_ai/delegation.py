"""Delegate agents: an agent that one of a durable agent's tools runs.

Pydantic AI's delegation is a tool whose body runs another agent (``await
helper.run(question, usage=ctx.usage)``). Inside a workflow, where that body runs decides
what is durable and what a budget sees:

* in the tool's step (the default), the delegate's model calls are part of that step: a
  crash re-runs the whole tool, and its calls are never recorded, so no budget can count
  them. With a budget in force that would be a budget that silently does not hold, so such
  a call is refused with a :class:`~dbos_agent.errors.ConfigurationError` that says how to
  fix it (the workflow stays PENDING, nothing is recorded);
* in the workflow's own code (the tool's metadata ``{"dbos_agent": False}``), each of the
  delegate's model requests and tool calls is a step of the same workflow: recorded,
  replayed, and counted by the family's budget, which the delegate inherits from the agent
  whose tool runs it when it has none of its own.

A tool that is not a step runs alone (``sequential``), so the steps its body takes have the
same positions on every replay.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ..._engine.extending import current_context, in_step
from ...agent.budget import BudgetGuard
from ...errors import ConfigurationError

__all__ = ["budget_in_force", "guard_for", "refuse_unrecorded_call"]

#: The budget of the innermost durable agent run that has one, for the agents it delegates to.
_in_force: ContextVar[BudgetGuard | None] = ContextVar("dbos_agent_pai_budget", default=None)


@contextmanager
def budget_in_force(guard: BudgetGuard) -> Iterator[None]:
    """Within the block (an agent run), ``guard``'s budget holds for delegate agents too."""
    if guard.budget is None:
        yield
        return
    token = _in_force.set(guard)
    try:
        yield
    finally:
        _in_force.reset(token)


def guard_for(own: BudgetGuard) -> BudgetGuard:
    """An agent's budget: its own, else the one of the run that delegates to it."""
    if own.budget is not None:
        return own
    return _in_force.get() or own


def refuse_unrecorded_call(agent_name: str | None, guard: BudgetGuard) -> None:
    """Refuse a model request made inside a step while a budget is in force: it could be
    neither recorded nor charged to the family's budget."""
    if guard.budget is None or not in_step() or current_context() is None:
        return
    raise ConfigurationError(
        f"agent {agent_name!r} makes a model request inside a step (a tool that delegates "
        "to it), where the call can be neither recorded nor charged to the budget in force; "
        "give the delegating tool metadata={'dbos_agent': False} so that its body runs in "
        "the workflow and the delegate's requests are steps the budget counts"
    )
