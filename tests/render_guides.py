"""The README and the results summary as a reader's browser shows them: Markdown rendered to
HTML (CommonMark with tables, as GitHub renders them) and opened in headless Chromium.

    python -m tests.render_guides docs/img   # screenshots: readme.png, results-summary.png
"""
from __future__ import annotations

import html
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STYLE = """body{font:16px/1.5 -apple-system,'Segoe UI',Helvetica,Arial,sans-serif;max-width:980px;
margin:24px auto;padding:0 32px;color:#1f2328}table{border-collapse:collapse;margin:12px 0}
th,td{border:1px solid #d1d9e0;padding:6px 12px;vertical-align:top}th{background:#f6f8fa}
code{background:#eff1f3;padding:.1em .3em;border-radius:4px;font-size:85%}
pre{background:#f6f8fa;padding:16px;overflow:auto}pre code{background:none}
h1,h2{border-bottom:1px solid #d1d9e0;padding-bottom:.3em}img{max-width:100%}"""


def guide_text(name: str) -> str:
    """The Markdown of a guide: ``README.md``, or ``results-summary`` (docs/results.md up to
    its first dated entry)."""
    if name == "results-summary":
        return (ROOT / "docs" / "results.md").read_text().split("\n## 20", 1)[0]
    return (ROOT / name).read_text()


def guide_page(name: str, folder: Path) -> Path:
    """An HTML page of guide ``name`` in ``folder``; relative links resolve from the page's
    own folder in the repository."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(guide_text(name))
    base = (ROOT / "docs").as_uri() + "/" if name == "results-summary" else ROOT.as_uri() + "/"
    page = folder / f"{Path(name).stem}.html"
    page.write_text(f'<!doctype html><html><head><meta charset="utf-8"><base href="{base}">'
                    f"<title>{html.escape(name)}</title><style>{STYLE}</style></head>"
                    f"<body>{body}</body></html>")
    return page


def main(argv: list[str]) -> int:
    from tests.observe.test_html_report import screenshot

    out = Path(argv[0] if argv else "docs/img")
    with tempfile.TemporaryDirectory() as tmp:
        for name, png, height in (("README.md", "readme.png", 3000),
                                  ("results-summary", "results-summary.png", 1800)):
            shot = screenshot(guide_page(name, Path(tmp)), out / png, height,
                              Path(tmp) / "profile")
            print(shot)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
