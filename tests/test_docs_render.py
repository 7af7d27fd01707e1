"""The README and the results summary render as a reader sees them (tests/render_guides.py):
every Markdown table becomes a table, every heading a heading, the report picture loads, and
no Markdown syntax is left showing in the page's text."""
from __future__ import annotations

import re

import pytest

from tests.observe.test_html_report import render
from tests.render_guides import guide_page, guide_text


def markdown_tables(text: str) -> int:
    return len(re.findall(r"^\|[-| :]+\|$", text, flags=re.MULTILINE))


@pytest.mark.parametrize("name", ["README.md", "results-summary"])
def test_the_guide_renders_in_chromium(name, tmp_path):
    text = guide_text(name)
    dom = render(guide_page(name, tmp_path), tmp_path / "profile").dom
    assert dom.count("<table>") == markdown_tables(text) >= 1
    headings = [h.lstrip("# ") for h in re.findall(r"^#{1,3} .+$", text, flags=re.MULTILINE)]
    assert len(re.findall(r"<h[123]>", dom)) == len(headings)
    visible = re.sub(r"<(pre|code)>.*?</\1>", "", dom, flags=re.DOTALL)
    assert "|---" not in visible and "](" not in visible and "**" not in visible
    if name == "README.md":
        assert 'src="docs/report-screenshot.png"' in dom
