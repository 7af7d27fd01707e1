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


CLUSTER_CLASSES = {"LocalCluster", "SpecCluster"}
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
