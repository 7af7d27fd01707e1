"""``spotlight report RUN_URL --html PATH``: one self-contained HTML page of a run, from its store.

The page holds reward and validation curves, the stages of every worker over time with
preemptions marked, τ and the planner's choices, the cost ledger, validation image grids and
the run's config (:mod:`pipelines.front.html_sections` builds them). It fetches nothing: its
style, its script and its pictures (base64 PNGs) are inline, so it opens offline and can be
mailed or attached as it is. A running run is fine to report: the page shows its committed
iterations.

On load the page checks itself -- every section has a body, every picture decodes -- and
says so in ``<html data-check="ok">`` (or ``"failed"`` with what failed in
``data-problems``): a headless browser's ``--dump-dom`` reads the verdict.
"""
from __future__ import annotations

import argparse
from html import escape
from pathlib import Path
from typing import Any, Sequence

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1d232a;
       background: #f6f7f9; }
header { background: #14324a; color: #fff; padding: 14px 24px; }
header h1 { margin: 0; font-size: 20px; }
header .url { font-family: ui-monospace, monospace; font-size: 13px; opacity: 0.85; }
nav { position: sticky; top: 0; background: #fff; border-bottom: 1px solid #dde1e6;
      padding: 6px 24px; z-index: 1; }
nav a { margin-right: 14px; color: #14324a; text-decoration: none; font-size: 14px; }
main { padding: 8px 24px 40px; }
section { background: #fff; border: 1px solid #dde1e6; border-radius: 6px; margin: 16px 0;
          padding: 4px 16px 14px; }
section h2 { font-size: 17px; border-bottom: 1px solid #eef0f3; padding-bottom: 6px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 8px 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eef0f3; }
.charts figure img { width: 560px; }
figcaption { font-size: 12px; color: #5a6570; }
table { border-collapse: collapse; font-size: 12px; margin: 10px 0; }
th, td { border: 1px solid #e3e6ea; padding: 3px 7px; text-align: right; }
th { background: #f0f2f5; }
table.facts td { text-align: left; }
table.facts thead { display: none; }
pre { background: #f4f5f7; padding: 8px; font-size: 12px; overflow-x: auto; max-height: 420px; }
.note { color: #5a6570; font-style: italic; }
details summary { cursor: pointer; font-size: 13px; margin: 6px 0; }
"""

# The page's check of itself (see the module docstring). It runs after every picture loaded.
CHECK = """
window.addEventListener("load", function () {
  var root = document.documentElement, problems = [];
  var expected = (root.getAttribute("data-sections") || "").split(" ");
  expected.forEach(function (id) {
    var body = document.querySelector("section#" + id + " .section-body");
    if (!body || !body.textContent.trim() && !body.querySelector("img")) {
      problems.push("section " + id + " is empty or missing");
    }
  });
  Array.prototype.forEach.call(document.images, function (img) {
    if (!img.complete || img.naturalWidth === 0) { problems.push("picture " + img.alt); }
  });
  root.setAttribute("data-problems", problems.join("; "));
  root.setAttribute("data-height", String(root.scrollHeight));
  root.setAttribute("data-check", problems.length ? "failed" : "ok");
});
"""


def render_page(title: str, url: str, sections: Sequence[Any]) -> str:
    """The whole page: ``sections`` (with ``id``, ``title``, ``body`` HTML) in order."""
    nav = "".join(f'<a href="#{escape(s.id)}">{escape(s.title)}</a>' for s in sections)
    body = "".join(f'<section id="{escape(s.id)}"><h2>{escape(s.title)}</h2>'
                   f'<div class="section-body">{s.body}</div></section>' for s in sections)
    ids = " ".join(s.id for s in sections)
    return (f'<!DOCTYPE html>\n<html lang="en" data-sections="{escape(ids)}" '
            f'data-check="pending">\n<head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{STYLE}</style></head>\n<body>"
            f'<header><h1>{escape(title)}</h1><div class="url">{escape(url)}</div></header>'
            f"<nav>{nav}</nav><main>{body}</main><script>{CHECK}</script></body></html>\n")


def write_report(run: Any, path: str | Path, *, endpoint_url: str | None = None) -> Path:
    """Write the report of the run at ``run`` (a URL, a StorageConfig, a RunStore or a
    RunView) to ``path``; returns the path. Reads the store only."""
    # why lazy: storage and matplotlib load when a report is written, not with the CLI parser
    from pipelines.front.html_sections import RunView, report_sections

    view = run if isinstance(run, RunView) else RunView.open(run, endpoint_url=endpoint_url)
    if "config" not in view.run_info() and view.completed_iterations() == 0:
        raise ValueError(f"{view.url} holds a run store but no run: nothing was recorded there "
                         "by a Session (no config, no iteration). Check the URL; `spotlight "
                         "audit URL` shows what the store holds")
    page = render_page("Spotlight run report", view.url, report_sections(view))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)   # a reader never sees half a page
    return path


def run(args: argparse.Namespace) -> int:
    path = write_report(args.run_url, args.html, endpoint_url=args.endpoint_url)
    size = path.stat().st_size
    print(f"report: {path} ({size / 1024:.0f} KiB, self-contained; open it in a browser)")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_url", help="run URL: a path, file://PATH or s3://BUCKET/PREFIX")
    p.add_argument("--html", required=True, metavar="PATH",
                   help="where to write the page (one file: styles and pictures inline)")
    p.add_argument("--endpoint-url", default=None,
                   help="S3 endpoint (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL); "
                        "credentials come from the standard AWS environment variables")
    p.set_defaults(func=run)
