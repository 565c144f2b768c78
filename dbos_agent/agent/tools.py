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
from typing import Annotated, Any, Generic, ParamSpec, TypeVar, Unpack, overload

import pydantic
import pydantic_core
from anthropic.types import ToolParam

from .._engine.extending import NotDone, StepDefinition
from .._engine.step import step as engine_step
from ..errors import ToolCallRejected, ToolErrorResult, ToolInputError
from .accounting import TOOL_STEP_PREFIX
from .tool_options import TOOL_OWN, ToolOptions, check_tool_options

__all__ = [
    "NotDone",
    "Tool",
    "ToolCallRejected",
    "ToolErrorResult",
    "ToolInputError",
    "ToolOptions",
    "tool",
]

P = ParamSpec("P")
R = TypeVar("R")

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")


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


def _checked_name(name: str, options: ToolOptions) -> str:
    """``name`` if the Messages API accepts it and ``options`` are all known options."""
    check_tool_options(options, f"tool {name!r}")
    if not _NAME.match(name):
        raise ValueError(f"tool name {name!r} must match {_NAME.pattern}")
    return name


class Tool(Generic[P, R]):
    """A function the model can call, run as a durable step named ``tool:<name>``.

    ``def`` and ``async def`` functions both work. Calling the tool inside a workflow is a
    step (checkpointed, replayed); outside it is a plain call. The options are
    :class:`ToolOptions`: the step's (every option of ``@da.step``: ``idempotent``,
    ``guard``, the retry options, ``retry_policy``, ``timeout``...) are passed to it as
    they are.
    """

    def __init__(self, fn: Callable[P, R], **options: Unpack[ToolOptions]) -> None:
        self.name = _checked_name(options.get("name") or fn.__name__, options)
        doc, arg_docs = _split_docstring(inspect.getdoc(fn) or "")
        description = options.get("description")
        self.description = description if description is not None else doc
        self.input_model = _input_model(fn, self.name, arg_docs)
        self.input_schema: dict[str, Any] = _clean_schema(self.input_model.model_json_schema())
        self._init_step(fn, options)
        functools.update_wrapper(self, fn)

    def _init_step(self, fn: Callable[P, R], options: ToolOptions) -> None:
        """Make ``fn`` this tool's step ``tool:<name>`` with the step's options (the
        part every kind of tool shares, whatever its schema comes from)."""
        self.fn = fn
        #: An ``async def`` tool: calling it returns a coroutine (run it with
        #: ``ToolRegistry.call_async`` / ``call_all_async``, or ``await`` it).
        self.is_async = inspect.iscoroutinefunction(fn)
        #: A human approves each call first (see ToolRegistry and da.request_approval).
        self.requires_approval = bool(options.get("requires_approval", False))
        step_options: dict[str, Any] = {
            key: value for key, value in options.items() if key not in TOOL_OWN
        }
        self._step: Callable[..., R] = engine_step(
            name=TOOL_STEP_PREFIX + self.name, **step_options
        )(fn)
        # what the step made of the options (its defaults for those not given)
        definition: StepDefinition = getattr(self._step, "__dbos_agent_step__")  # noqa: B009
        self.idempotent = definition.idempotent
        self.guard = definition.guard

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
def tool(**options: Unpack[ToolOptions]) -> Callable[[Callable[P, R]], Tool[P, R]]: ...


def tool(
    fn: Callable[P, R] | None = None, /, **options: Unpack[ToolOptions]
) -> Tool[P, R] | Callable[[Callable[P, R]], Tool[P, R]]:
    """Make a typed function a model tool and a durable step (bare, or with the options of
    :class:`ToolOptions`).

    Idempotent tools (the default) are at-least-once: cut off by a crash, they run again.
    For effects that must not repeat, pass ``idempotent=False`` and a ``guard(**input)``
    that checks the world and returns the earlier result or :data:`NotDone`.
    """

    def decorate(func: Callable[P, R]) -> Tool[P, R]:
        return Tool(func, **options)

    return decorate(fn) if fn is not None else decorate
