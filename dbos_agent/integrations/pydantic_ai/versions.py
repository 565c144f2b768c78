"""Which Pydantic AI releases the integration is built and tested against.

The integration implements Pydantic AI's durable-execution backend interface
(``pydantic_ai.durable_exec``), which moves between minor releases: operation ids are
added, private wire shapes change. Step names and recorded payloads are compatibility
data, so an untested release is refused when the integration is imported, with both
versions named, instead of failing half-way through a workflow that cannot be replayed.
"""

from __future__ import annotations

import re
from importlib import metadata

from ...errors import UnsupportedPydanticAIVersionError

__all__ = ["SUPPORTED", "UnsupportedPydanticAIVersionError", "check_version", "installed_version"]

#: The ``pydantic-ai-slim`` releases this integration supports (the ``[pydantic-ai]`` extra).
SUPPORTED = ">=2.78,<2.79"

#: The same range as (major, minor) bounds: lowest supported, first unsupported.
_LOWEST, _BEYOND = (2, 78), (2, 79)

#: The distribution that carries ``pydantic_ai`` (``pydantic-ai`` depends on it).
DISTRIBUTION = "pydantic-ai-slim"


def check_version(installed: str) -> None:
    """Raise :class:`UnsupportedPydanticAIVersionError` unless ``installed`` is supported."""
    match = re.match(r"^(\d+)\.(\d+)(?:\.|$|[a-z])", installed.strip())
    version = (int(match.group(1)), int(match.group(2))) if match else None
    if version is None or not _LOWEST <= version < _BEYOND:
        raise UnsupportedPydanticAIVersionError(
            f"dbos_agent.integrations.pydantic_ai supports {DISTRIBUTION}{SUPPORTED}, but "
            f"{installed!r} is installed: install a supported release "
            f"(pip install 'dbos-agent[pydantic-ai]')"
        )


def installed_version() -> str:
    """The installed ``pydantic-ai-slim`` version ("not installed" when it is absent)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "not installed"
