"""No import cycle anywhere in dbos_agent, type-only imports included: every module can be
read from the modules below it (import-linter's layers say which; this catches a circle
between modules that no contract orders)."""

from __future__ import annotations

import grimp


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def imported_by(module: str) -> list[str]:
        return sorted(graph.find_modules_directly_imported_by(module))

    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(imported_by(root)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_of_dbos_agent_imports_itself_in_a_circle() -> None:
    graph = grimp.build_graph("dbos_agent", exclude_type_checking_imports=False)
    assert _cycles(graph) == []


def test_a_circle_is_found() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(module)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.x")
    graph.add_import(importer="a.z", imported="a.x")
    assert _cycles(graph) == [["a.x", "a.y"]]


def test_the_package_root_reaches_the_engine_only_through_its_api() -> None:
    """import-linter's forbidden contract names the subpackages; the package's own
    ``__init__`` is checked here (a contract on ``dbos_agent`` would cover everything)."""
    graph = grimp.build_graph("dbos_agent", exclude_type_checking_imports=False)
    reached = {
        module
        for module in graph.find_modules_directly_imported_by("dbos_agent")
        if module.startswith("dbos_agent._engine.runtime")
    }
    assert reached == set()
