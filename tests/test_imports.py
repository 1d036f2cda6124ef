"""No import cycles between kllint's modules.

The layers themselves are contracts in ``pyproject.toml`` (``lint-imports``
in CI); this test looks for cycles anywhere, inside a layer included."""

from __future__ import annotations

import pytest

# Known, and being untangled separately.
ALLOWED = {frozenset({"kllint.harness.estimators", "kllint.harness.training"})}


def cycles() -> list[set[str]]:
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("kllint", exclude_type_checking_imports=True)
    modules = sorted(graph.modules)
    imports = {m: graph.find_modules_directly_imported_by(m) & graph.modules for m in modules}
    # Tarjan's strongly connected components.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in imports[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(component)

    for module in modules:
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles() -> None:
    found = [c for c in cycles() if frozenset(c) not in ALLOWED]
    assert not found, found
