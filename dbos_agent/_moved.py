"""The old import paths of the modules that became private (``dbos_agent.engine`` is now
``dbos_agent._engine``, ``dbos_agent.storage`` ``dbos_agent._storage``, ...): they keep
working for one release, each with a DeprecationWarning naming the new path.

An old name resolves to the very module object of the new one (one set of registries, one
launched engine), through a finder on ``sys.meta_path`` that answers only for old names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence

#: Old module name (or prefix) -> new one; the longest matching prefix wins.
_RENAMED = {
    "dbos_agent.engine": "dbos_agent._engine",
    "dbos_agent.engine.runtime.engine": "dbos_agent._engine.runtime.current",
    "dbos_agent.engine.schedule_operations": "dbos_agent._engine.schedules.operations",
    "dbos_agent.engine.cron": "dbos_agent._engine.schedules.cron",
    "dbos_agent.storage": "dbos_agent._storage",
    "dbos_agent.serialization": "dbos_agent._serialization",
    "dbos_agent.errors_codec": "dbos_agent._errors_codec",
    "dbos_agent.limits": "dbos_agent._limits",
    "dbos_agent.documents": "dbos_agent._documents",
    "dbos_agent.processes": "dbos_agent._processes",
    "dbos_agent.durations": "dbos_agent._durations",
}
#: The scheduler's module, as the README documented it for ``fire_due``.
_OLD_SCHEDULER = "dbos_agent.engine.scheduler"


def new_name(old: str) -> str | None:
    """The module an old name now is, or None when ``old`` is not an old name."""
    prefixes = [p for p in _RENAMED if old == p or old.startswith(p + ".")]
    if not prefixes:
        return None
    prefix = max(prefixes, key=len)
    return _RENAMED[prefix] + old[len(prefix) :]


def _old_scheduler() -> types.ModuleType:
    """``dbos_agent.engine.scheduler``: the scheduler's names, and ``fire_due`` (now in
    ``dbos_agent.testing``)."""
    scheduler = importlib.import_module("dbos_agent._engine.runtime.scheduler")
    passes = importlib.import_module("dbos_agent._engine.passes")
    module = types.ModuleType(_OLD_SCHEDULER, scheduler.__doc__)
    module.__dict__.update(
        {k: v for k, v in vars(scheduler).items() if not k.startswith("__")},
        fire_due=passes.fire_due,
    )
    return module


class _Alias(importlib.abc.Loader):
    """Hands the import system the module as it is under its new name."""

    def __init__(self, module: types.ModuleType) -> None:
        self._module = module
        self._spec = module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self._module

    def exec_module(self, module: types.ModuleType) -> None:
        """The module ran under its new name already; it keeps that name's spec (the
        import system set the old name's on it)."""
        module.__spec__ = self._spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == _OLD_SCHEDULER:
            new, module = "dbos_agent.testing.fire_due", _old_scheduler()
        else:
            renamed = new_name(fullname)
            if renamed is None:
                return None
            new, module = renamed, importlib.import_module(renamed)
        warnings.warn(
            f"{fullname} is private now and moved: {new} (import what you use from "
            "dbos_agent, dbos_agent.errors, dbos_agent.operations or dbos_agent.testing); "
            "the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.machinery.ModuleSpec(
            fullname, _Alias(module), is_package=hasattr(module, "__path__")
        )


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())  # before the path finder: one module each
