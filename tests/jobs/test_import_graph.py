"""The project's own modules import each other without circles, and its parts only in the directions
the design allows, lazy imports included (an import inside a function or under TYPE_CHECKING counts).

A circle (a imports b, b imports a, even inside a function) means neither module can be read or
tested without the other; shared helpers belong in a module of their own. The directions:

    freight_cli  the composition root: may import every part (worker/ only inside commands)
    jobs/        control plane: never worker/, kernels/ or torch (a laptop submits without torch)
    contracts/   the rules both planes share: none of jobs/, worker/, kernels/, torch
    worker/engine/  a plain library: never jobs/ or celery
    kernels/     computes, holds no policy: nothing of the project
    nothing but freight_cli imports freight_cli
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("contracts", "freight_cli", "jobs", "kernels", "worker")


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _import_targets(name: str, path: Path) -> Iterator[tuple[str, str | None]]:
    """(module, member) of every import in module `name`'s body (module level, functions,
    TYPE_CHECKING), relative imports resolved: `from a import b` gives ("a", "b"), `import a.b`
    gives ("a.b", None)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield from ((base, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)


def _imported_names(name: str, path: Path) -> set[str]:
    """Every module name `name` imports anywhere in its body; `from a import b` gives both a and a.b."""
    names: set[str] = set()
    for module, member in _import_targets(name, path):
        names.add(module)
        if member is not None:
            names.add(f"{module}.{member}")
    return names


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Project modules `name` imports anywhere in its body (module level, functions, TYPE_CHECKING)."""
    deps: set[str] = set()
    for module, member in _import_targets(name, path):
        if member is not None and f"{module}.{member}" in mods:
            deps.add(f"{module}.{member}")
        elif module in mods:
            deps.add(module)
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
    """Every module of jobs/, contracts/ and the CLI imported: torch, worker/ and kernels/ stay
    unloaded; CLI commands that run work in process import them inside the command. The test oracles
    of the results (openai's types, pandas, duckdb: dev extras only) are never imported at all."""
    import subprocess
    import sys

    code = (
        "import importlib, pkgutil, sys, contracts, freight_cli, jobs\n"
        "for p in (contracts, freight_cli, jobs):\n"
        "    for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "forbidden = ('torch', 'openai', 'pandas', 'duckdb')\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in forbidden or n.startswith(('worker', 'kernels')))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def _crossings(importer: str, forbidden: tuple[str, ...]) -> list[str]:
    """`module -> import` for every import, lazy ones included, from a module under `importer` (a
    package or package.subpackage) of a module under one of `forbidden` (project or third party)."""
    found = []
    for name, path in sorted(_modules().items()):
        if name != importer and not name.startswith(importer + "."):
            continue
        for imported in sorted(_imported_names(name, path)):
            if any(imported == f or imported.startswith(f + ".") for f in forbidden):
                found.append(f"{name} -> {imported}")
    return found


def test_jobs_imports_nothing_of_the_data_plane() -> None:
    assert _crossings("jobs", ("worker", "kernels", "torch", "freight_cli")) == []


def test_contracts_import_neither_plane_nor_torch() -> None:
    assert _crossings("contracts", ("jobs", "worker", "kernels", "torch", "freight_cli")) == []


def test_the_engine_knows_nothing_of_jobs_or_celery() -> None:
    assert _crossings("worker.engine", ("jobs", "celery", "kombu", "freight_cli")) == []


def test_kernels_import_nothing_of_the_project() -> None:
    assert _crossings("kernels", ("jobs", "worker", "contracts", "freight_cli")) == []


def test_kernels_hold_no_speculation_policy() -> None:
    """The draft chain's early-stop rule (ChainStop) is the speculator's policy; the kernel takes its
    table as plain arrays."""
    defined = [
        f"{path.relative_to(ROOT)}: {node.name}"
        for path in sorted((ROOT / "kernels").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name == "ChainStop"
    ]
    assert defined == []


def test_only_the_cli_imports_the_cli() -> None:
    for package in ("contracts", "jobs", "kernels", "worker"):
        assert _crossings(package, ("freight_cli",)) == []


def test_the_rule_checker_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import torch.nn\n"
        "def f():\n    from worker.engine import Engine\n    from . import sibling\n"
    )
    assert _imported_names("pkg.mod", tmp_path / "mod.py") == {
        "typing", "typing.TYPE_CHECKING", "torch.nn", "worker.engine", "worker.engine.Engine", "pkg", "pkg.sibling",
    }
