"""Token and cost accounting, computed from the step log alone.

Every model step records the whole reply, usage included, so a workflow's bill is a sum
over its log: nothing else has to be kept in sync, and a recovered run is counted once.
Prices are per million tokens and configurable; the defaults are list prices at the time
of writing, so pass your own table when money matters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_PRICES",
    "MODEL_STEP_NAMES",
    "TOOL_STEP_PREFIX",
    "Price",
    "PriceTable",
    "Usage",
    "UsageTotals",
    "is_tool_call",
    "is_tool_step",
    "register_tool_step_recogniser",
    "usage_of_reply",
    "usage_totals",
]

#: Names of the steps that are model calls (:class:`~dbos_agent.agent.Model` adds its own).
MODEL_STEP_NAMES: set[str] = set()
#: Tool steps are named ``tool:<tool name>``.
TOOL_STEP_PREFIX = "tool:"
#: Other ways a step name says "a tool call" (an integration's tools, named its own way).
_tool_step_recognisers: list[Callable[[str], bool]] = []
#: Recorded outcomes of a tool step that say the tool did not run to its end (it deferred).
_deferral_recognisers: list[Callable[[Any], bool]] = []


def register_tool_step_recogniser(
    recognise: Callable[[str], bool], *, deferred: Callable[[Any], bool] | None = None
) -> None:
    """Count the steps whose name ``recognise(name)`` accepts as tool calls (in the totals
    and the replay report), beside the ``tool:<name>`` steps of :func:`~dbos_agent.agent.tool`.

    For layers above this one that name their tool steps otherwise (an integration of
    another agent framework); registering the same function twice counts it once.
    ``deferred(output)`` tells a step whose recorded output is a deferral (the tool asked
    for an approval instead of running): not a call, the approved call's own step is.
    """
    if recognise not in _tool_step_recognisers:
        _tool_step_recognisers.append(recognise)
    if deferred is not None and deferred not in _deferral_recognisers:
        _deferral_recognisers.append(deferred)


def is_tool_step(name: str) -> bool:
    """Whether a step of this name is a tool call (or a tool's deferral)."""
    return name.startswith(TOOL_STEP_PREFIX) or any(r(name) for r in _tool_step_recognisers)


def is_tool_call(name: str, output: Any) -> bool:
    """Whether a step of this name, which recorded ``output`` (parsed JSON), was a call
    of its tool: a tool step that is not a deferral."""
    return is_tool_step(name) and not any(d(output) for d in _deferral_recognisers)


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens."""

    input: float
    output: float
    cache_write: float | None = None
    cache_read: float | None = None


PriceTable = Mapping[str, Price]
"""Model name (or name prefix: the longest matching prefix wins) to its price."""

DEFAULT_PRICES: PriceTable = {
    "claude-opus-4-5": Price(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4": Price(15.0, 75.0, 18.75, 1.50),
    "claude-sonnet-4": Price(3.0, 15.0, 3.75, 0.30),
    "claude-3-7-sonnet": Price(3.0, 15.0, 3.75, 0.30),
    "claude-3-5-sonnet": Price(3.0, 15.0, 3.75, 0.30),
    "claude-haiku-4-5": Price(1.0, 5.0, 1.25, 0.10),
    "claude-3-5-haiku": Price(0.80, 4.0, 1.0, 0.08),
    "claude-3-haiku": Price(0.25, 1.25, 0.30, 0.03),
}


def price_of(model: str, prices: PriceTable | None = None) -> Price | None:
    """The price of ``model``: exact name first, else the longest matching prefix."""
    table = DEFAULT_PRICES if prices is None else prices
    if model in table:
        return table[model]
    matches = [key for key in table if model.startswith(key)]
    return table[max(matches, key=len)] if matches else None


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens of one or more model replies, per model (for pricing)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    by_model: tuple[tuple[str, int, int, int, int], ...] = ()

    def __add__(self, other: Usage) -> Usage:
        merged: dict[str, list[int]] = {}
        for model, *counts in (*self.by_model, *other.by_model):
            slot = merged.setdefault(model, [0, 0, 0, 0])
            for i, n in enumerate(counts):
                slot[i] += n
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_creation_input_tokens + other.cache_creation_input_tokens,
            self.cache_read_input_tokens + other.cache_read_input_tokens,
            tuple((m, c[0], c[1], c[2], c[3]) for m, c in sorted(merged.items())),
        )

    def cost(self, prices: PriceTable | None = None) -> float | None:
        """Dollars, or None when a model in it has no price in the table."""
        total = 0.0
        for model, inp, out, cache_write, cache_read in self.by_model:
            price = price_of(model, prices)
            if price is None:
                return None
            total += inp * price.input + out * price.output
            total += cache_write * (
                price.cache_write if price.cache_write is not None else price.input
            )
            total += cache_read * (
                price.cache_read if price.cache_read is not None else price.input
            )
        return total / 1_000_000


def _count(usage: Mapping[str, Any], key: str) -> int:
    value = usage.get(key)
    return int(value) if isinstance(value, int | float) else 0


def usage_of_reply(reply: Any) -> Usage:
    """The usage of one recorded reply (a ``Message`` as stored JSON)."""
    if not isinstance(reply, Mapping):
        return Usage()
    usage = reply.get("usage")
    if not isinstance(usage, Mapping):
        return Usage()
    inp, out, cache_write, cache_read = (
        _count(usage, "input_tokens"),
        _count(usage, "output_tokens"),
        _count(usage, "cache_creation_input_tokens"),
        _count(usage, "cache_read_input_tokens"),
    )
    model = str(reply.get("model") or "unknown")
    return Usage(inp, out, cache_write, cache_read, ((model, inp, out, cache_write, cache_read),))


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """A workflow's model bill, from its step log."""

    workflow_id: str
    model_calls: int
    model_attempts: int
    failed_model_calls: int
    tool_calls: int
    usage: Usage
    cost_usd: float | None

    @property
    def input_tokens(self) -> int:
        return self.usage.input_tokens

    @property
    def output_tokens(self) -> int:
        return self.usage.output_tokens


def totals_from_steps(
    workflow_id: str,
    steps: Iterable[tuple[str, str, Any, int]],
    prices: PriceTable | None = None,
) -> UsageTotals:
    """Totals over ``(name, status, parsed output, attempts)`` rows of one workflow."""
    usage = Usage()
    calls = attempts = failed = tools = 0
    for name, status, output, tries in steps:
        if is_tool_call(name, output):
            tools += 1
        if name not in MODEL_STEP_NAMES:
            continue
        attempts += tries
        if status == "SUCCESS":
            calls += 1
            usage = usage + usage_of_reply(output)
        else:
            failed += 1
    return UsageTotals(workflow_id, calls, attempts, failed, tools, usage, usage.cost(prices))


def usage_totals(workflow_id: str, prices: PriceTable | None = None) -> UsageTotals:
    """Model calls, attempts, tokens and cost of a workflow (needs :func:`launch`)."""
    from .._engine.workflow import list_steps

    rows = ((s.name, str(s.status), s.output, s.attempts) for s in list_steps(workflow_id))
    return totals_from_steps(workflow_id, rows, prices)
