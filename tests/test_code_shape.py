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
