"""The project's own modules import each other without circles, lazy imports included.

A circle (a imports b, b imports a, even inside a function) means neither module can be read or
tested without the other; shared helpers belong in a module of their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("jobs", "worker", "kernels")


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Project modules `name` imports anywhere in its body (module level, functions, TYPE_CHECKING)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    deps: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                if f"{base}.{alias.name}" in mods:
                    deps.add(f"{base}.{alias.name}")
                elif base in mods:
                    deps.add(base)
        elif isinstance(node, ast.Import):
            deps.update(alias.name for alias in node.names if alias.name in mods)
    deps.discard(name)
    # a package's __init__ importing its own submodules is how packages work, not a circle
    return {d for d in deps if not name.startswith(d + ".")}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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


def test_no_import_circles() -> None:
    mods = _modules()
    graph = {name: _imports(name, path, mods) for name, path in mods.items()}
    assert _cycles(graph) == []


def test_the_checker_sees_a_lazy_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_jobs_imports_neither_torch_nor_worker_at_module_level() -> None:
    """Every module of jobs/ imported (the CLI included): torch, worker/ and kernels/ stay unloaded;
    commands that run work in process import them inside the command. The test oracles of the results
    (openai's types, pandas, duckdb: dev extras only) are never imported by jobs/ at all."""
    import subprocess
    import sys

    code = (
        "import importlib, pkgutil, sys, jobs\n"
        "for m in pkgutil.walk_packages(jobs.__path__, 'jobs.'):\n"
        "    importlib.import_module(m.name)\n"
        "forbidden = ('torch', 'openai', 'pandas', 'duckdb')\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in forbidden or n.startswith(('worker', 'kernels')))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
