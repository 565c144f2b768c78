"""The web interface: a JSON API over HTTP and a dashboard (``dbos-agent serve``).

Needs the ``web`` extra (``pip install 'dbos-agent[web]'``: FastAPI and uvicorn); the CLI
imports only :mod:`.serve` until the server is asked for, so it works without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .api import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
