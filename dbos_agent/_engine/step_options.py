"""The options of a step, said once.

``@da.step``, ``@tool``/``Tool``, an MCP server's tools (``ToolRegistry.add_mcp``) and a
Pydantic AI tool's metadata (``{"dbos_agent": {...}}``) all take :class:`StepOptions`, by
keyword or as a dict, and all turn them into a step the same way, through
:meth:`StepSettings.of`: an option one of them accepts, every one accepts, with the same
meaning and the same defaults, and an unknown one is refused everywhere by the same words.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypedDict, cast

from ..errors import InvalidOptionError
from .runtime.registry import RetryPolicy, StepDefinition, step_definition

__all__ = [
    "RETRY_OPTIONS",
    "STEP_OPTIONS",
    "StepOptions",
    "StepSettings",
    "check_known",
    "layered",
]


class StepOptions(TypedDict, total=False):
    """How a step runs, retries and is recorded; an option left out takes its default
    (those of :class:`~dbos_agent.RetryPolicy`, ``idempotent=True``, no ``guard``, no
    ``timeout``). See ``@da.step`` for the whole story."""

    retries: int
    """Attempts after the first, for errors in ``retry_on`` that ``retry_if`` allows."""
    interval: float
    """Seconds before the first retry, times ``backoff`` each time, at most
    ``max_interval``."""
    backoff: float
    max_interval: float
    jitter: float
    """Each wait randomised by +/- this fraction (0 to 1)."""
    retry_on: tuple[type[BaseException], ...]
    """The exception classes retried (default: ``Exception``)."""
    retry_if: Callable[[BaseException], bool] | None
    """A predicate beside ``retry_on``: only errors for which it returns true are retried
    (a 429 but not a 400 of one exception class)."""
    retry_policy: RetryPolicy | None
    """A :class:`~dbos_agent.RetryPolicy` in place of every other retry option."""
    give_up_after: float | timedelta | None
    """Seconds (or a ``timedelta``; ``math.inf`` for ever) from the first attempt during
    which a retried error (or a ``DependencyUnavailableError``) is tried again past
    ``retries``, waiting durably; None: ``retries`` alone decides."""
    waits_for: str | None
    """What a failing step waits for, as operators read it (default: the step's name)."""
    idempotent: bool
    """False: the intent is recorded before the step runs (at most once, see ``guard``)."""
    guard: Callable[..., Any] | None
    """Called with the step's arguments when a non-idempotent step is found in doubt after
    a crash: the earlier result if the effect happened, else :data:`~dbos_agent.NotDone`."""
    timeout: float | None
    """Seconds an attempt of an ``async def`` step may take before it is cancelled (a
    TimeoutError, retried and recorded like any error)."""


#: Every option of a step.
STEP_OPTIONS: frozenset[str] = StepOptions.__optional_keys__
#: The options a ``retry_policy`` stands for (given beside it, they are refused).
RETRY_OPTIONS = frozenset(field.name for field in dataclasses.fields(RetryPolicy))


def check_known(options: Mapping[str, object], known: Set[str], owner: str) -> None:
    """Refuse an option that is not one of ``known``, naming it and the known ones (a
    TypeError, as Python's own for an unexpected keyword)."""
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(
            f"{owner}: unknown options {unknown}; the options are {', '.join(sorted(known))}"
        )


def layered(base: Mapping[str, Any], over: Mapping[str, Any]) -> StepOptions:
    """``over`` given over ``base`` (a role's or a server's defaults under a tool's own).

    Each option of ``over`` replaces the same one of ``base``; a ``retry_policy`` replaces
    every retry option beneath it, and a retry option over a ``retry_policy`` changes that
    one field of the policy, so that no layer's choice is silently dropped.
    """
    merged = dict(base)
    policy = over.get("retry_policy")
    if policy is not None:
        for name in RETRY_OPTIONS:
            merged.pop(name, None)
    under = merged.get("retry_policy")
    tuned = {name: value for name, value in over.items() if name in RETRY_OPTIONS}
    if policy is None and under is not None and tuned:
        merged["retry_policy"] = dataclasses.replace(under, **tuned)
        over = {name: value for name, value in over.items() if name not in RETRY_OPTIONS}
    merged.update(over)
    return cast(StepOptions, merged)


@dataclass(frozen=True, slots=True)
class StepSettings:
    """What a step's options come to: each checked, the defaults filled in. The one place
    options become a retry policy, so a tool's step retries as a ``@da.step`` does."""

    retry: RetryPolicy = dataclasses.field(default_factory=RetryPolicy)
    idempotent: bool = True
    guard: Callable[..., Any] | None = None
    timeout: float | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any], owner: str = "step") -> StepSettings:
        """The settings of ``options`` (:class:`StepOptions`); ``owner`` names what they
        were given to in errors (``"step 'charge'"``, ``"tool 'search'"``)."""
        check_known(options, STEP_OPTIONS, owner)
        retry_options = {name: value for name, value in options.items() if name in RETRY_OPTIONS}
        policy = options.get("retry_policy")
        if policy is not None:
            if not isinstance(policy, RetryPolicy):
                raise InvalidOptionError(
                    f"{owner}: retry_policy must be a RetryPolicy, got {policy!r}"
                )
            if retry_options:
                raise InvalidOptionError(
                    f"{owner}: {', '.join(f'{name}=' for name in sorted(retry_options))} "
                    "given with retry_policy=: set them on the policy"
                )
        else:
            retry_on = retry_options.get("retry_on")
            if retry_on is not None:
                retry_options["retry_on"] = tuple(retry_on)
            policy = RetryPolicy(**retry_options)
        return cls(
            retry=policy,
            idempotent=bool(options.get("idempotent", True)),
            guard=options.get("guard"),
            timeout=_timeout(options.get("timeout"), owner),
        )

    def define(
        self, fn: Callable[..., Any], name: str | None, *, counts_in_code_version: bool = True
    ) -> StepDefinition:
        """The step ``fn`` is with these settings (see ``registry.step_definition``)."""
        return step_definition(
            fn,
            name,
            self.retry,
            idempotent=self.idempotent,
            guard=self.guard,
            timeout=self.timeout,
            counts_in_code_version=counts_in_code_version,
        )


def _timeout(value: object, owner: str) -> float | None:
    """A ``timeout`` option as seconds: a finite number (or ``timedelta``) above zero."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidOptionError(f"{owner}: timeout must be a number of seconds, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise InvalidOptionError(f"{owner}: timeout must be > 0 seconds, got {value}")
    return float(value)
