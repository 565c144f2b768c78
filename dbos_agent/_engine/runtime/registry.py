"""What the decorators know about each function: its name, codecs and policies.

Workflow definitions are registered by name (in ``_workflows``) so that
recovery can find the function of a row written by another process.
Registration is process-wide: decorators run at import time.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import math
import random
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..._limits import check_identifier
from ..._serialization import Codec, InputsCodec, result_codec
from ...errors import DbosAgentError, DependencyUnavailableError, InvalidOptionError

log = logging.getLogger(__name__)

_lock = threading.RLock()
#: ``@durable_workflow`` definitions by workflow name.
_workflows: dict[str, WorkflowDefinition] = {}
#: The result codecs of the ``@step`` functions by step name, each under the function's
#: origin (two functions may share a step name): an edited fork checks a replaced output.
_step_results: dict[str, dict[str, Codec]] = {}
#: The modules that define durable code (workflows, steps), each with a digest of its
#: source as imported: the process's code version is made of them.
_code_modules: dict[str, str] = {}


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently a failing step is tried again.

    Two limits, as Temporal's retry policy has: ``retries`` attempts after the first for
    any error it retries (``retry_on`` and ``retry_if``), and, with ``give_up_after``, a
    horizon in seconds from the first attempt during which a *transient* error is tried
    again past ``retries`` (a dependency that is down is waited out). Waits longer than
    the engine's ``suspend_after`` are durable (see ``runtime/retries.py``).
    """

    retries: int = 0
    interval: float = 1.0
    backoff: float = 2.0
    max_interval: float = 60.0
    jitter: float = 0.1
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    #: A predicate beside ``retry_on``: an error is retried only if it is one of
    #: ``retry_on`` *and* ``retry_if(error)`` is true (a 429 but not a 400 of one
    #: exception class). An exception raised by the predicate itself ends the retries.
    retry_if: Callable[[BaseException], bool] | None = None
    #: Seconds from the first attempt during which a transient error is tried again,
    #: whatever ``retries`` says (None: ``retries`` alone decides; ``math.inf``: never
    #: give up). Past it the last error is recorded.
    give_up_after: float | None = None
    #: What a transient failure waits for, as operators read it (``"the model API"``);
    #: None: the step's own name.
    waits_for: str | None = None

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if self.interval < 0 or self.max_interval < 0 or self.backoff < 1:
            raise ValueError("interval and max_interval must be >= 0 and backoff >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be between 0 and 1, got {self.jitter}")
        object.__setattr__(self, "give_up_after", seconds_option(self.give_up_after))

    def transient(self, error: BaseException) -> bool:
        """Whether ``error`` is worth another attempt at all (whatever the count says):
        one of ``retry_on`` that ``retry_if`` allows, never an engine signal. A
        :class:`~dbos_agent.errors.DependencyUnavailableError` always is."""
        if isinstance(error, DependencyUnavailableError):
            return True
        if not isinstance(error, self.retry_on) or isinstance(error, DbosAgentError):
            return False
        return self.retry_if is None or self._predicate_allows(error)

    def backoff_delay(self, attempt: int, error: BaseException) -> float:
        """Seconds before attempt ``attempt + 1``: ``interval * backoff**(attempt-1)``, at
        most ``max_interval``, randomised by +/- ``jitter``."""
        exponent = min(attempt - 1, 64)  # no overflow after thousands of attempts
        delay = min(self.interval * self.backoff**exponent, self.max_interval)
        return delay * random.uniform(1 - self.jitter, 1 + self.jitter)

    def delay_before_retry(self, attempt: int, error: BaseException) -> float | None:
        """Seconds to wait before attempt ``attempt + 1`` within ``retries``, or None."""
        if attempt > self.retries or not self.transient(error):
            return None
        if isinstance(error, DependencyUnavailableError) and not isinstance(error, self.retry_on):
            return None  # only the horizon retries what the step did not ask to retry
        return self.backoff_delay(attempt, error)

    def _predicate_allows(self, error: BaseException) -> bool:
        """``retry_if(error)``; a predicate that fails says no (the step's own error is
        what gets recorded, not the predicate's)."""
        assert self.retry_if is not None
        try:
            return bool(self.retry_if(error))
        except Exception as exc:
            log.warning("retry_if of a step raised %r on %r: not retrying", exc, error)
            return False

    @property
    def max_attempts(self) -> int:
        """How many attempts a step gets at most (1 + retries; a step with a horizon may
        get more while its errors are transient)."""
        return self.retries + 1


def seconds_option(value: object, name: str = "give_up_after") -> float | None:
    """A duration option as seconds: a number or a ``timedelta``, not negative, not NaN
    (``math.inf``: for ever); None stays None. Anything else is an InvalidOptionError
    naming the option, raised where it is given."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidOptionError(
            f"{name} must be a number of seconds or a timedelta, got {value!r}"
        )
    seconds = float(value)
    if math.isnan(seconds) or seconds < 0:
        raise InvalidOptionError(f"{name} must be >= 0 seconds (or math.inf), got {value!r}")
    return seconds


class _NotDone:
    """The type of :data:`NotDone`."""

    _instance: _NotDone | None = None

    def __new__(cls) -> _NotDone:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NotDone"


#: What a step's ``guard`` returns when the effect did not happen (run the step).
NotDone = _NotDone()


@dataclass(frozen=True, slots=True)
class StepDefinition:
    """A ``@step`` function and how to checkpoint it.

    A non-idempotent step records an intent (with its inputs) before it runs;
    ``guard`` is its check-then-act: called with the step's arguments when the
    step is found in doubt after a crash, it returns the earlier result if the
    effect happened, or :data:`NotDone`.
    """

    name: str
    fn: Callable[..., Any]
    is_async: bool
    retry: RetryPolicy
    result: Codec
    idempotent: bool = True
    guard: Callable[..., Any] | None = None
    inputs: InputsCodec | None = None
    #: Seconds an attempt of an async step may take before it is cancelled.
    timeout: float | None = None


def note_code(fn: Callable[..., Any]) -> None:
    """Count ``fn``'s module among those that make up this process's code version: the
    digest of the module's source file as it is imported (the decorators run then)."""
    module = getattr(fn, "__module__", None) or "?"
    if module in _code_modules:
        return
    path = getattr(sys.modules.get(module), "__file__", None)
    try:
        with open(path or "", "rb") as source:
            digest = hashlib.sha256(source.read()).hexdigest()
    except OSError:  # no file (an interactive session): its name and the function's code
        digest = hashlib.sha256(getattr(fn, "__code__", fn).__repr__().encode()).hexdigest()
    with _lock:
        _code_modules.setdefault(module, digest)


def code_version() -> str:
    """The version of this process's durable code: a digest of the source of every module
    that defines a workflow or a step (the library's own agent layer included).

    A workflow whose replay diverged under this code is left alone by every process of
    the same code version (another version may fit it); unlike the application version
    (``launch(app_version=)``), which routes work and is chosen by people, it changes by
    itself with the code.
    """
    with _lock:
        modules = sorted(_code_modules.items())
    lines = "\n".join(f"{module} {digest}" for module, digest in modules)
    return hashlib.sha256(lines.encode()).hexdigest()[:16]


def step_definition(
    fn: Callable[..., Any],
    name: str | None,
    retry: RetryPolicy,
    *,
    idempotent: bool = True,
    guard: Callable[..., Any] | None = None,
    timeout: float | None = None,
    counts_in_code_version: bool = True,
) -> StepDefinition:
    """``counts_in_code_version`` False for a function called as a step from a workflow
    body (``da.run_step``): the workflow's module counts already, and a module noted
    while workflows run would change the code version under them."""
    fallback = getattr(fn, "__qualname__", None) or type(fn).__name__
    step_name = check_identifier(name or fallback, "step name")
    if counts_in_code_version:
        note_code(fn)
    if guard is not None and idempotent:
        raise ValueError(f"step {step_name!r}: a guard only makes sense with idempotent=False")
    is_async = inspect.iscoroutinefunction(fn)
    if timeout is not None and not is_async:  # its value was checked with the options
        raise ValueError(
            f"step {step_name!r}: timeout= needs an async step (a running thread cannot "
            "be stopped; give the call inside the step its own timeout)"
        )
    result = result_codec(fn)
    with _lock:
        origin = f"{getattr(fn, '__module__', '?')}.{fn.__qualname__}"
        _step_results.setdefault(step_name, {})[origin] = result
    return StepDefinition(
        name=step_name,
        fn=fn,
        is_async=is_async,
        retry=retry,
        result=result,
        idempotent=idempotent,
        guard=guard,
        inputs=None if idempotent else InputsCodec(fn, step_name),
        timeout=timeout,
    )


@dataclass(frozen=True, slots=True)
class WorkflowDefinition:
    """A ``@durable_workflow`` function and how to store its calls."""

    name: str
    fn: Callable[..., Any]
    is_async: bool
    max_recovery_attempts: int
    inputs: InputsCodec
    result: Codec
    origin: str = field(default="")


def register_workflow(
    fn: Callable[..., Any], name: str | None, max_recovery_attempts: int
) -> WorkflowDefinition:
    """Create and register the definition; two different functions may not share a name."""
    if max_recovery_attempts < 0:
        raise ValueError(f"max_recovery_attempts must be >= 0, got {max_recovery_attempts}")
    wf_name = check_identifier(name or fn.__qualname__, "workflow name")
    note_code(fn)
    origin = f"{fn.__module__}.{fn.__qualname__}"
    definition = WorkflowDefinition(
        name=wf_name,
        fn=fn,
        is_async=inspect.iscoroutinefunction(fn),
        max_recovery_attempts=max_recovery_attempts,
        inputs=InputsCodec(fn, wf_name),
        result=result_codec(fn),
        origin=origin,
    )
    with _lock:
        existing = _workflows.get(wf_name)
        if existing is not None and existing.origin != origin:
            raise DbosAgentError(
                f"two workflows are named {wf_name!r}: {existing.origin} and {origin}; "
                f"give one of them another name with @durable_workflow(name=...)"
            )
        _workflows[wf_name] = definition  # the same function defined again replaces itself
    return definition


def find_workflow(name: str) -> WorkflowDefinition | None:
    """The registered definition of that name, if this process has imported it."""
    return _workflows.get(name)


def step_results(name: str) -> list[Codec]:
    """The result codecs of the steps of that name this process has defined (usually
    one; none when it has not imported them)."""
    with _lock:
        return list(_step_results.get(name, {}).values())


def workflow_names() -> list[str]:
    """Names of every registered workflow."""
    with _lock:
        return list(_workflows)


def workflow_names_of(is_async: bool) -> list[str]:
    """Names of the registered workflows of one kind: ``async def`` ones run on the event
    loop, the others on the worker pool, and each kind is claimed as its room allows."""
    with _lock:
        return [name for name, d in _workflows.items() if d.is_async is is_async]


def forget_workflows() -> None:
    """Forget every registered workflow (for tests that define them on the fly)."""
    with _lock:
        _workflows.clear()
