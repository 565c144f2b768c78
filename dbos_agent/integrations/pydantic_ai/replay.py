"""Replaying a recorded model request without preparing it again.

A recovered Pydantic AI run re-runs its agent graph from the start, and every model
request is answered from the log. Answering it is cheap; *preparing* it is not: before a
request reaches the durable model, Pydantic AI maps the whole history for the provider
(``prepare_messages``), checks it for compaction, counts tokens and wraps the model, work
that grows with the history. Over a long run that is most of a replay's time (about half
of a 200-turn one), all of it for a request that will not be sent.

So when the next entry of the log is this request's recorded reply, the capability's
``prepare_model_request`` hook hands the reply to Pydantic AI as a
``SkipModelRequest``, Pydantic AI's documented way for a hook to answer a request
itself. Everything that shapes the run's history has run by then: the
``before_model_request`` hooks (history processors, queued messages, tool search) and
Pydantic AI's recording of the request's instructions and metadata. What is skipped is
the attempt's preparation for the wire and the hooks around the attempt, so the shortcut
is only taken when no other capability of the run has such a hook
(:func:`answers_from_log`): with one, the request is replayed the long way, as before.
A replayed reply then lands in the history exactly as the live one did (the tests
compare the two runs' messages). Streamed requests (``events=``, ``run_stream``) replay the
long way too: Pydantic AI rebuilds their event stream from the recorded reply for the
run's consumers, which a short-circuited request would not give them the same.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.capabilities.abstract import AbstractCapability

__all__ = ["ATTEMPT_HOOKS", "answers_from_log"]

#: The capability hooks that act on a request's attempt, after the history is settled:
#: a capability defining one must see the replayed request the long way (a response an
#: ``after_model_request`` hook rewrote or rejected live must be rewritten or rejected
#: again, a compaction must happen again).
ATTEMPT_HOOKS = (
    "prepare_model_request",
    "wrap_model_request",
    "after_model_request",
    "on_model_request_error",
    "compact_history",
    "get_wrapper_model",
)


def _hooks_attempts(capability: AbstractCapability[Any]) -> bool:
    cls = type(capability)
    return any(
        getattr(cls, hook, None) is not getattr(AbstractCapability, hook, None)
        for hook in ATTEMPT_HOOKS
    )


def answers_from_log(root: AbstractCapability[Any] | None, durability: object) -> bool:
    """Whether a recorded reply may stand in for a request of a run with this capability
    tree: no capability but ``durability`` acts on the request's attempt."""
    if root is None:
        return True
    leaves: list[AbstractCapability[Any]] = []
    root.apply(leaves.append)
    return not any(leaf is not durability and _hooks_attempts(leaf) for leaf in leaves)
