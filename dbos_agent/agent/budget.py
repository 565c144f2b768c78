"""Token and cost budgets counted from the step log, so that nothing resets them.

The spend is the usage of every recorded model reply of the workflow's *family*: its root
ancestor and every workflow started below it. A recovered run reads the same log, a fork
copies the steps it reuses (and their usage with them), and a child workflow counts
against its parent's family: none of them starts the count over.

Before a live model call the spend is read (the family's running total, which the
database adds each reply to as it is recorded: a few rows, however long the log), and
the call is refused with
:class:`~dbos_agent.errors.BudgetExceededError` when the tokens spent plus the call's
``max_tokens`` would pass ``max_tokens``, or the cost spent has reached ``max_cost_usd``.
The refusal is the model step's recorded (not retried) error: the workflow ends in
ERROR unless it catches it, and a replay raises the same error again.

:class:`BudgetGuard` is a :class:`~dbos_agent.agent.Model`'s budget in the runs that call
it: published once per run, checked before each live call, raised by a message while the
run waits (``wait_for_raise``). The model step itself knows nothing else of budgets.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, replace
from typing import Any

from .._documents import BUDGET_EVENT
from .._engine.extending import WorkflowContext, current_context, in_step
from .._engine.messaging import recv, recv_async, send, set_event, set_event_async
from ..errors import BudgetExceededError
from .accounting import MODEL_STEP_NAMES, PriceTable, Usage

__all__ = [
    "BUDGET_EVENT",
    "BUDGET_TOPIC",
    "Budget",
    "BudgetGuard",
    "Spend",
    "family_spend",
    "raise_budget",
]

#: The topic of the message that raises a waiting workflow's budget.
BUDGET_TOPIC = "dbos_agent.budget"


def raise_budget(
    workflow_id: str, *, max_tokens: int | None = None, max_cost_usd: float | None = None
) -> None:
    """Raise the budget of a workflow waiting for it (``Budget(wait_for_raise=True)``):
    it tries the refused call again under the new limits. The same as ``dbos-agent send
    ID '{"max_tokens": N}' --topic dbos_agent.budget``."""
    limits: dict[str, Any] = {}
    if max_tokens is not None:
        limits["max_tokens"] = max_tokens
    if max_cost_usd is not None:
        limits["max_cost_usd"] = max_cost_usd
    send(workflow_id, limits, topic=BUDGET_TOPIC)


@dataclass(frozen=True, slots=True)
class Spend:
    """What a workflow's family spent on model calls."""

    tokens: int
    cost_usd: float | None
    model_calls: int


@dataclass(frozen=True, slots=True)
class Budget:
    """At most ``max_tokens`` (input + output, cache included) and ``max_cost_usd`` over a
    workflow's family; ``prices`` for the cost (default: the list prices)."""

    max_tokens: int | None = None
    max_cost_usd: float | None = None
    prices: PriceTable | None = None
    #: On a refusal, wait (suspended) for a raised budget (:func:`raise_budget`) and try
    #: the call again, instead of raising BudgetExceededError into the workflow.
    wait_for_raise: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"Budget: max_tokens must be >= 1, got {self.max_tokens}")
        if self.max_cost_usd is not None and not (
            self.max_cost_usd > 0 and math.isfinite(self.max_cost_usd)
        ):
            raise ValueError(f"Budget: max_cost_usd must be > 0, got {self.max_cost_usd}")

    def raised_to(self, message: Any) -> Budget:
        """This budget with the limits a :func:`raise_budget` message gives."""
        given = message if isinstance(message, dict) else {}
        return replace(
            self,
            max_tokens=given.get("max_tokens", self.max_tokens),
            max_cost_usd=given.get("max_cost_usd", self.max_cost_usd),
        )

    def document(self) -> dict[str, Any]:
        """The budget as published in the workflow's ``dbos_agent.budget`` event."""
        return {"max_tokens": self.max_tokens, "max_cost_usd": self.max_cost_usd}

    def check(self, ctx: WorkflowContext, call_max_tokens: int) -> Spend:
        """Refuse (BudgetExceededError) a call this budget cannot cover; the spend so far."""
        spend = family_spend(ctx, self.prices)
        where = f"workflow {ctx.workflow_id!r}"
        if self.max_tokens is not None and spend.tokens + call_max_tokens > self.max_tokens:
            raise BudgetExceededError(
                f"{where}: its family spent {spend.tokens:,} of its {self.max_tokens:,}-token "
                f"budget, and this call may use up to {call_max_tokens:,} more"
            )
        if (
            self.max_cost_usd is not None
            and spend.cost_usd is not None
            and spend.cost_usd >= self.max_cost_usd
        ):
            raise BudgetExceededError(
                f"{where}: its family spent ${spend.cost_usd:.4f} of its "
                f"${self.max_cost_usd:.4f} budget"
            )
        return spend


def family_spend(ctx: WorkflowContext, prices: PriceTable | None = None) -> Spend:
    """The model spend of the running workflow's family, from its running total."""
    rows = ctx.engine.db.steps.family_model_usage(ctx.workflow_id, sorted(MODEL_STEP_NAMES))
    usage = Usage()
    for r in rows:
        counts = (
            r.input_tokens,
            r.output_tokens,
            r.cache_creation_input_tokens,
            r.cache_read_input_tokens,
        )
        usage = usage + Usage(*counts, by_model=((r.model, *counts),))
    tokens = (
        usage.input_tokens
        + usage.output_tokens
        + usage.cache_creation_input_tokens
        + usage.cache_read_input_tokens
    )
    return Spend(tokens, usage.cost(prices), sum(r.replies for r in rows))


class BudgetGuard:
    """A model's :class:`Budget` in the runs that call the model.

    Per run (weakly keyed by its context, so a finished run leaves nothing behind) it
    remembers whether the budget was published and what a raise made of it.
    """

    def __init__(self, budget: Budget | None) -> None:
        self.budget = budget
        self._published: weakref.WeakSet[WorkflowContext] = weakref.WeakSet()
        self._raised: weakref.WeakKeyDictionary[WorkflowContext, Budget] = (
            weakref.WeakKeyDictionary()
        )

    def _to_publish(self) -> Budget | None:
        """The budget, the first time a run's body calls the model (None otherwise)."""
        ctx = current_context()
        if self.budget is None or ctx is None or in_step() or ctx in self._published:
            return None
        self._published.add(ctx)
        return self.budget

    def publish(self) -> None:
        """Say the budget once per run, as an event (a step: replayed like the others)."""
        budget = self._to_publish()
        if budget is not None:
            set_event(BUDGET_EVENT, budget.document())

    async def publish_async(self) -> None:
        """:meth:`publish` for async workflows."""
        budget = self._to_publish()
        if budget is not None:
            await set_event_async(BUDGET_EVENT, budget.document())

    def of(self, ctx: WorkflowContext) -> Budget | None:
        """This run's budget: the model's, or what a raise made of it."""
        return self._raised.get(ctx, self.budget)

    def check(self, request: dict[str, Any]) -> None:
        """Inside the model step, before the API call: refuse what the budget cannot cover."""
        ctx = current_context()
        budget = None if ctx is None else self.of(ctx)
        if budget is not None and ctx is not None:
            budget.check(ctx, int(request.get("max_tokens") or 0))

    def _waiting_run(self) -> tuple[WorkflowContext, Budget] | None:
        """The run and its budget, if a refused call should wait for a raised budget (from
        the run's body, not a step)."""
        ctx = current_context()
        if ctx is None or in_step() or self.budget is None or not self.budget.wait_for_raise:
            return None
        current = self.of(ctx)
        assert current is not None  # waiting needs a budget
        return ctx, current

    def wait_for_raise(self, refused: BudgetExceededError) -> None:
        """After a refused call: wait (suspended) for :func:`raise_budget` and publish the
        raised budget, or raise ``refused`` when this budget does not wait."""
        waiting = self._waiting_run()
        if waiting is None:
            raise refused
        ctx, current = waiting
        raised = current.raised_to(recv(BUDGET_TOPIC, timeout=None))
        self._raised[ctx] = raised
        set_event(BUDGET_EVENT, raised.document())

    async def wait_for_raise_async(self, refused: BudgetExceededError) -> None:
        """:meth:`wait_for_raise` for async workflows."""
        waiting = self._waiting_run()
        if waiting is None:
            raise refused
        ctx, current = waiting
        raised = current.raised_to(await recv_async(BUDGET_TOPIC, timeout=None))
        self._raised[ctx] = raised
        await set_event_async(BUDGET_EVENT, raised.document())
