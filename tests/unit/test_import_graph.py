"""The jobs/ and efficiency/ packages import each other without cycles, counting imports inside functions too
(a function-level import that closes a cycle hides the cycle; it does not remove it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("jobs", "efficiency")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            if "migrations" in rel.parts:
                continue
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            found[".".join(parts)] = path
    return found


def _targets(node: ast.AST, modules: dict[str, Path]) -> set[str]:
    out: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name in modules:
                out.add(alias.name)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        for alias in node.names:
            # `from jobs import artifacts` names jobs.intake.artifacts; `from jobs.x import f` names jobs.x.
            sub = f"{node.module}.{alias.name}"
            if sub in modules:
                out.add(sub)
            elif node.module in modules:
                out.add(node.module)
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> modules of jobs/efficiency it imports anywhere in its body (TYPE_CHECKING blocks aside)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        skip: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip.update(id(n) for n in ast.walk(node))
        edges: set[str] = set()
        for node in ast.walk(tree):
            if id(node) not in skip:
                edges |= _targets(node, modules)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_finder_reports_a_cycle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_jobs_and_efficiency_have_no_import_cycles():
    graph = import_graph()
    assert (
        "jobs.tasks" in graph and "jobs.intake.artifacts" in graph["jobs.tasks"]
    )  # the graph sees real edges
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_library_code_queues_tasks_by_name_instead_of_importing_them():
    graph = import_graph()
    importers = sorted(m for m, edges in graph.items() if "jobs.tasks" in edges)
    # Only the app config (to register the tasks in every process) imports the tasks module.
    assert importers == ["jobs.apps"], importers


def test_pages_do_not_import_the_rest_package():
    graph = import_graph()
    pages = {m: edges for m, edges in graph.items() if m.startswith("jobs.views")}
    leaks = sorted((m, e) for m, edges in pages.items() for e in edges if e.startswith("jobs.api"))
    assert leaks == []
