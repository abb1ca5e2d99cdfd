"""The house plan, checked on the code: the import graph has no cycle, and each layer imports only what lies below it.

Layers (docs/design.md, "The house plan"): the root utilities (``distill.config``, ``device``, ``logs``, ``hub``);
``distill.method`` (the distillation method: it knows no task); ``distill.tasks`` (the task interface at the bottom,
one module per task type); ``teachers``, ``students`` and ``augment`` (building blocks of a job); ``distill.publish``
(what ships and is measured) and ``distill.job`` (the stages and their orchestration) at the top. The graph is read
from the source with an AST walk, every import counted, inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("distill", "teachers", "students", "augment")
# Module prefixes a layer may not import (beside any cycle).
FORBIDDEN = {
    "distill.method": ("distill.tasks", "distill.job", "distill.publish", "teachers", "students", "augment"),
    "distill.tasks": ("distill.job", "distill.publish", "teachers", "students", "augment"),
    "distill.publish": ("distill.job",),
    "teachers": ("distill.job", "distill.publish"),
    "students": ("distill.job", "distill.publish"),
    "augment": ("distill.job", "distill.publish"),
    # the lowest layer: no arrow runs up from it (its names are checked against the registries by the job)
    "distill.config": ("distill.method", "distill.tasks", "distill.job", "distill.publish", "teachers", "students",
                       "augment"),
    "distill.device": ("distill.",),
    "distill.logs": ("distill.",),
    "distill.hub": ("distill.",),
}
TASK_INTERFACE = "distill.tasks.base"


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the packages: dotted name -> file (a package by its ``__init__``)."""
    found = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project's modules it imports (``from a.b import c`` counts as ``a.b.c`` when that is a module,
    else ``a.b``), every import statement counted wherever it stands."""
    known = modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [resolve(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [resolve(f"{node.module}.{alias.name}") or resolve(node.module) for alias in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t is not None and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def violations(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for every import a layer may not make (:data:`FORBIDDEN`), and every project import
    of the task interface (it imports nothing of the project)."""
    found = []
    for importer, targets in sorted(graph.items()):
        for layer, banned in FORBIDDEN.items():
            if importer == layer or importer.startswith(layer + "."):
                found += [f"{importer} -> {t}" for t in sorted(targets) if any(t == b.rstrip(".") or t.startswith(
                    b if b.endswith(".") else b + ".") for b in banned)]
        if importer == TASK_INTERFACE:
            found += [f"{importer} -> {t}" for t in sorted(targets)]
    return found


def test_the_import_graph_has_no_cycle():
    assert cycles(import_graph()) == []


def test_each_layer_imports_only_what_lies_below_it():
    assert violations(import_graph()) == []


def test_the_checks_catch_a_cycle_and_a_job_import_in_the_method(tmp_path):
    """The checks above on a planted house: a method module importing the job, and two modules importing each
    other."""
    for package, files in {"distill": {"__init__.py": "", "config.py": ""},
                           "distill/method": {"__init__.py": "", "objective.py": "from distill.job.pipeline import x\n"},
                           "distill/job": {"__init__.py": "", "pipeline.py": "import distill.job.stages\n",
                                           "stages.py": "def f():\n    from distill.job import pipeline\n"},
                           "teachers": {"__init__.py": ""}, "students": {"__init__.py": ""},
                           "augment": {"__init__.py": ""}}.items():
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (tmp_path / package / name).write_text(text)
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["distill.job.pipeline", "distill.job.stages"]]
    assert violations(graph) == ["distill.method.objective -> distill.job.pipeline"]


@pytest.mark.parametrize("layer", ["method", "tasks", "job", "publish"])
def test_every_layer_is_a_folder_of_its_own(layer):
    assert (ROOT / "distill" / layer / "__init__.py").is_file()
    assert not [p.name for p in (ROOT / "distill").glob("*.py")
                if p.stem not in ("__init__", "config", "device", "logs", "hub")]
