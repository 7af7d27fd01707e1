"""The code stays readable at a glance: no function over 60 lines, no module over 500."""
from __future__ import annotations

import ast

import pytest

from spotlight.config import PROJECT_ROOT

PACKAGES = ("pipelines", "spotlight", "storage")
SOURCES = sorted(p for pkg in PACKAGES for p in (PROJECT_ROOT / pkg).rglob("*.py"))


def test_the_packages_have_sources():
    assert len(SOURCES) > 40


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_modules_and_functions_stay_short(path):
    text = path.read_text()
    assert len(text.splitlines()) <= 500, f"{path} has {len(text.splitlines())} lines"
    long = [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > 60]
    assert not long, f"{path}: functions over 60 lines: {long}"


CLUSTER_CLASSES = {"LocalCluster", "SpecCluster", "EmbeddedCluster"}
CLUSTER_HELPER = PROJECT_ROOT / "pipelines" / "cluster" / "connect.py"


def _constructs_a_cluster(tree: ast.AST) -> list[int]:
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    return [call.lineno for call in calls
            if (isinstance(call.func, ast.Name) and call.func.id in CLUSTER_CLASSES)
            or (isinstance(call.func, ast.Attribute) and call.func.attr in CLUSTER_CLASSES)]


def test_every_cluster_is_started_by_the_one_helper():
    """start_embedded gives a cluster's workers the project's set-up (without it they cannot
    import `storage` outside pytest) and sends Dask's messages to the run's log; a module that
    builds its own LocalCluster or SpecCluster gets neither."""
    assert _constructs_a_cluster(ast.parse(CLUSTER_HELPER.read_text())), \
        "the helper itself no longer builds the cluster: update CLUSTER_HELPER"
    others = {str(p.relative_to(PROJECT_ROOT)): lines for p in SOURCES if p != CLUSTER_HELPER
              for lines in [_constructs_a_cluster(ast.parse(p.read_text()))] if lines}
    assert not others, (f"modules that build their own Dask cluster (lines): {others}; start it "
                        "with pipelines.cluster.start_embedded instead")


def _module(path) -> str:
    parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in SOURCES}


def _imported(path) -> set[str]:
    """The project modules ``path`` imports anywhere in it, in functions too."""
    name, found = _module(path), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:   # relative: from its package
            package = name.split(".")[:len(name.split(".")) - node.level +
                                       (path.name == "__init__.py")]
            names = [".".join(package + ([node.module] if node.module else []))]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for target in names:
            while target and target not in MODULES:   # a name inside a module: that module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def test_no_import_cycle_even_counting_imports_inside_functions():
    """An import inside a function hides a cycle from Python until that function runs; the
    layers (storage <- spotlight <- pipelines) hold only if no module reaches itself."""
    graph = {name: _imported(path) for name, path in MODULES.items()}
    cycles, done = [], set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            cycles.append(trail[trail.index(name):] + [name])
            return
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, trail + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles[:5])


LAZY_ALLOWED = {PROJECT_ROOT / "pipelines/front/cli.py", PROJECT_ROOT / "spotlight/__init__.py"}
MOST_LAZY = 14


def _lazy_project_imports(path) -> list[int]:
    """Line numbers of the imports of the project's own modules inside functions of ``path``."""
    tree = ast.parse(path.read_text())
    lines = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.level or (
                        node.module and node.module.split(".")[0] in PACKAGES)):
                    lines.add(node.lineno)
                elif isinstance(node, ast.Import) and any(
                        a.name.split(".")[0] in PACKAGES for a in node.names):
                    lines.add(node.lineno)
    return sorted(lines)


def _has_reason(text: list[str], lineno: int) -> bool:
    """A comment on the import's line, or above the run of imports it belongs to."""
    i = lineno - 1
    if "#" in text[i]:
        return True
    while i > 0 and text[i - 1].strip().startswith(("from ", "import ", "#")):
        i -= 1
        if text[i].strip().startswith("#") or "#" in text[i]:
            return True
    return False


def test_imports_inside_functions_are_few_and_say_why():
    """A module-level import is where a reader looks for what a module needs; one inside a
    function is kept only where it buys start-up time or keeps a heavy dependency optional,
    and then says so."""
    lazy = [(path, n) for path in SOURCES if path not in LAZY_ALLOWED
            for n in _lazy_project_imports(path)]
    assert len(lazy) <= MOST_LAZY, [f"{p.relative_to(PROJECT_ROOT)}:{n}" for p, n in lazy]
    silent = [f"{p.relative_to(PROJECT_ROOT)}:{n}" for p, n in lazy
              if not _has_reason(p.read_text().split("\n"), n)]
    assert not silent, f"imports inside functions without a reason: {silent}"
