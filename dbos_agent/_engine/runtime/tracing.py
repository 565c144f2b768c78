"""OpenTelemetry spans for workflow runs and live steps, when ``opentelemetry`` is there.

Install the ``otel`` extra (``pip install 'dbos-agent[otel]'``) and configure a tracer
provider as usual: every run of a workflow in this process is a span
(``workflow <name>``), every step that runs live is a child span (``step <name>``, with
its position and attempts), and the agent layer adds a span per model call with the
``gen_ai.*`` attributes. A step replayed from the log did no new work: it gets no span
of its own, only an event ``step replayed`` on its run's span (and the run counts them
in ``dbos_agent.steps_replayed``). Without opentelemetry installed all of this is a few
no-op calls.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

try:  # optional: the otel extra
    from opentelemetry import trace as _trace
    from opentelemetry.trace import Status, StatusCode
except ImportError:  # pragma: no cover - exercised where opentelemetry is absent
    _trace = None  # type: ignore[assignment]

__all__ = ["Span", "failed", "set_attributes", "span", "step_replayed"]

Span = Any
_INSTRUMENTATION = "dbos_agent"


#: Whether a tracer provider was found, and when that was last asked (monotonic seconds).
_provider_seen = False
_looked_at = -1.0
_LOOK_EVERY_S = 1.0


def _active() -> bool:
    """Whether a tracer provider is configured: until one is, spans would go nowhere, and
    a step pays nothing for them. OpenTelemetry sets a provider once and for all, so once
    seen it stays (asking costs an environment lookup, too much for every step)."""
    global _provider_seen, _looked_at
    if _provider_seen or _trace is None:
        return _provider_seen
    now = time.monotonic()
    # a provider set in code shows at once in OpenTelemetry's global; one named in the
    # environment (OTEL_PYTHON_TRACER_PROVIDER) loads when asked, so ask once a second
    if getattr(_trace, "_TRACER_PROVIDER", None) is not None or now - _looked_at >= _LOOK_EVERY_S:
        _looked_at = now
        provider = _trace.get_tracer_provider()
        _provider_seen = not isinstance(
            provider, _trace.ProxyTracerProvider | _trace.NoOpTracerProvider
        )
    return _provider_seen


#: The span of a block when nothing is traced (reusable: it holds no state).
_NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()


def span(
    describe: Callable[..., tuple[str, Mapping[str, Any] | None]], /, *args: Any
) -> contextlib.AbstractContextManager[Span | None]:
    """A span around the block, named and given attributes by ``describe(*args)`` (None
    without opentelemetry, or before a tracer provider is configured: then ``describe``
    is not called, so an untraced step builds no name or attributes); an exception out
    of the block marks it as an error."""
    if _trace is None or not _active():
        return _NO_SPAN
    return _recording(*describe(*args))


@contextlib.contextmanager
def _recording(name: str, attributes: Mapping[str, Any] | None) -> Iterator[Span]:
    assert _trace is not None
    tracer = _trace.get_tracer(_INSTRUMENTATION)
    with tracer.start_as_current_span(
        name,
        attributes=dict(attributes or {}),
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            if isinstance(exc, Exception):
                current.record_exception(exc)
                current.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise


def set_attributes(current: Span | None, attributes: Mapping[str, Any]) -> None:
    """Add attributes to a span of :func:`span` (nothing without opentelemetry)."""
    if current is not None:
        current.set_attributes({k: v for k, v in attributes.items() if v is not None})


def failed(current: Span | None, error: BaseException | None) -> None:
    """Mark a span as failed with ``error`` (a workflow's or step's recorded error)."""
    if current is not None and error is not None and _trace is not None:
        current.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


def step_replayed(seq: int, name: str) -> None:
    """Note on the current run's span that step ``seq`` was replayed (no new work)."""
    if _trace is None or not _active():
        return
    current = _trace.get_current_span()
    if current.is_recording():
        current.add_event(
            "step replayed", {"dbos_agent.step.seq": seq, "dbos_agent.step.name": name}
        )
        replayed = getattr(current, "attributes", {}).get("dbos_agent.steps_replayed", 0)
        current.set_attribute("dbos_agent.steps_replayed", int(replayed) + 1)
