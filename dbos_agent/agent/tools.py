"""``@tool``: a typed function becomes a durable step and an Anthropic tool definition.

The schema the model sees and the validation its input gets come from one place, the
function's signature (through a pydantic model), so they cannot drift apart. The
description is the docstring; ``Args:`` lines of a Google-style docstring, or
``Annotated[..., Field(description=...)]``, describe the parameters.
"""

from __future__ import annotations

import functools
import inspect
import re
import typing
from collections.abc import Callable
from typing import Annotated, Any, Generic, ParamSpec, TypeVar, overload

import pydantic
import pydantic_core
from anthropic.types import ToolParam

from ..engine.runtime.registry import NotDone
from ..engine.step import step as engine_step
from .accounting import TOOL_STEP_PREFIX

__all__ = ["NotDone", "Tool", "ToolCallRejected", "ToolInputError", "tool"]

P = ParamSpec("P")
R = TypeVar("R")

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")


class ToolInputError(Exception):
    """A tool call the registry refused: unknown tool name or input that fails validation."""


class ToolCallRejected(Exception):
    """A human rejected the tool call (its tool requires approval)."""


def _split_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Description without the ``Args:`` section, and the per-argument descriptions."""
    lines = doc.splitlines()
    args: dict[str, str] = {}
    for i, line in enumerate(lines):
        if line.strip() in ("Args:", "Arguments:", "Parameters:"):
            current: str | None = None
            for entry in lines[i + 1 :]:
                if entry.strip() and not entry.startswith((" ", "\t")):
                    break
                match = re.match(r"^\s+(\w+)(?:\s*\([^)]*\))?\s*:\s*(.*)$", entry)
                if match and (current is None or len(entry) - len(entry.lstrip()) <= 4):
                    current = match.group(1)
                    args[current] = match.group(2).strip()
                elif current is not None and entry.strip():
                    args[current] = f"{args[current]} {entry.strip()}".strip()
            return "\n".join(lines[:i]).strip(), args
    return doc.strip(), args


def _clean_schema(node: Any) -> Any:
    """Drop pydantic's generated titles: noise for the model, tokens for us."""
    if isinstance(node, list):
        return [_clean_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs") and isinstance(value, dict):
            out[key] = {name: _clean_schema(sub) for name, sub in value.items()}
        else:
            out[key] = _clean_schema(value)
    return out


def _input_model(fn: Callable[..., Any], name: str, arg_docs: dict[str, str]) -> type[Any]:
    hints = typing.get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args and **kwargs cannot be described to a model")
        annotation = hints.get(pname, Any)
        if pname in arg_docs:
            annotation = Annotated[annotation, pydantic.Field(description=arg_docs[pname])]
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (annotation, default)
    model: type[Any] = pydantic.create_model(
        f"{name}_input", __config__=pydantic.ConfigDict(extra="forbid"), **fields
    )
    return model


def _format_validation_error(name: str, error: pydantic.ValidationError) -> str:
    problems = "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or 'input'}: {item['msg']}"
        for item in error.errors()
    )
    return f"invalid input for tool {name!r}: {problems}"


class Tool(Generic[P, R]):
    """A function the model can call, run as a durable step named ``tool:<name>``.

    ``def`` and ``async def`` functions both work. Calling the tool inside a workflow is a
    step (checkpointed, replayed); outside it is a plain call. ``idempotent=False`` (with an
    optional ``guard``) is passed to the step: the intent is recorded before the tool runs,
    and after a crash the guard decides whether the effect already happened.
    """

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        name: str | None = None,
        description: str | None = None,
        idempotent: bool = True,
        guard: Callable[..., Any] | None = None,
        retries: int = 0,
        interval: float = 1.0,
        backoff: float = 2.0,
        max_interval: float = 60.0,
        retry_on: tuple[type[BaseException], ...] = (Exception,),
        timeout: float | None = None,
        requires_approval: bool = False,
    ) -> None:
        self.name = name or fn.__name__
        if not _NAME.match(self.name):
            raise ValueError(f"tool name {self.name!r} must match {_NAME.pattern}")
        doc, arg_docs = _split_docstring(inspect.getdoc(fn) or "")
        self.description = description if description is not None else doc
        self.fn = fn
        #: An ``async def`` tool: calling it returns a coroutine (run it with
        #: ``ToolRegistry.call_async`` / ``call_all_async``, or ``await`` it).
        self.is_async = inspect.iscoroutinefunction(fn)
        self.idempotent = idempotent
        self.guard = guard
        #: A human approves each call first (see ToolRegistry and da.request_approval).
        self.requires_approval = requires_approval
        self.input_model = _input_model(fn, self.name, arg_docs)
        self.input_schema: dict[str, Any] = _clean_schema(self.input_model.model_json_schema())

        self._step: Callable[..., R] = engine_step(
            name=TOOL_STEP_PREFIX + self.name,
            retries=retries,
            interval=interval,
            backoff=backoff,
            max_interval=max_interval,
            retry_on=retry_on,
            idempotent=idempotent,
            guard=guard,
            timeout=timeout,
        )(fn)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._step(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Tool {self.name}>"

    def param(self) -> ToolParam:
        """The tool definition for the Messages API ``tools`` list."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }

    def validate(self, raw: object) -> dict[str, Any]:
        """The model's input as keyword arguments; raises :class:`ToolInputError`."""
        try:
            parsed = self.input_model.model_validate(raw)
        except pydantic.ValidationError as exc:
            raise ToolInputError(_format_validation_error(self.name, exc)) from None
        return {field: getattr(parsed, field) for field in type(parsed).model_fields}

    @staticmethod
    def render(value: object) -> str:
        """A tool's return value as tool_result text: strings as they are, else JSON."""
        if isinstance(value, str):
            return value
        if value is None:
            return "(no result)"
        return pydantic_core.to_json(value).decode()


@overload
def tool(fn: Callable[P, R], /) -> Tool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool = True,
    guard: Callable[..., Any] | None = None,
    retries: int = 0,
    interval: float = 1.0,
    backoff: float = 2.0,
    max_interval: float = 60.0,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    timeout: float | None = None,
    requires_approval: bool = False,
) -> Callable[[Callable[P, R]], Tool[P, R]]: ...


def tool(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool = True,
    guard: Callable[..., Any] | None = None,
    retries: int = 0,
    interval: float = 1.0,
    backoff: float = 2.0,
    max_interval: float = 60.0,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    timeout: float | None = None,
    requires_approval: bool = False,
) -> Tool[P, R] | Callable[[Callable[P, R]], Tool[P, R]]:
    """Make a typed function a model tool and a durable step (bare or with options).

    Idempotent tools (the default) are at-least-once: cut off by a crash, they run again.
    For effects that must not repeat, pass ``idempotent=False`` and a ``guard(**input)``
    that checks the world and returns the earlier result or :data:`NotDone`.

    ``timeout`` (``async def`` tools) cancels an attempt after that many seconds: the
    model gets the TimeoutError as an ``is_error`` result, after ``retries``.

    ``requires_approval=True``: a call the model asks for runs only once a human approved
    that exact call (tool and arguments, see ``da.request_approval``); a rejection goes back
    to the model as an ``is_error`` result with the human's reason.
    """

    def decorate(func: Callable[P, R]) -> Tool[P, R]:
        return Tool(
            func,
            name=name,
            description=description,
            idempotent=idempotent,
            guard=guard,
            retries=retries,
            interval=interval,
            backoff=backoff,
            max_interval=max_interval,
            retry_on=retry_on,
            timeout=timeout,
            requires_approval=requires_approval,
        )

    return decorate(fn) if fn is not None else decorate
