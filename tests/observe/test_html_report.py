"""``spotlight report RUN --html PATH`` of a real tiny run, read from a file store and from S3
(moto on loopback), rendered in headless Chromium (Debian's ``chromium``; CI installs it).

The browser check can fail: Chromium logs every console message of the page (an uncaught
error included) to stderr as a ``CONSOLE`` line, and the page checks itself on load (every
section has a body, every picture decodes) into ``<html data-check>``, which ``--dump-dom``
shows. ``test_the_browser_check_catches_*`` show both catching a broken page.
"""
from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from pipelines.front.html_report import render_page, write_report
from pipelines.front.html_sections import SECTION_IDS, Section
from pipelines.front.session import Session
from pipelines.front.timeline import plot_timeline
from pipelines.observe.run_view import RunView
from spotlight import main
from spotlight.config import load_config
from storage import RunStore
from tests.pipelines.conftest import write_tiny_world
from tests.storage.conftest import BUCKET, TEST_KEY, TEST_SECRET, _s3_environment, moto_s3  # noqa: F401 - fixtures used here

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]\s*(.*)")


# --- the browser ------------------------------------------------------------------------------
@dataclasses.dataclass
class Rendered:
    attributes: dict[str, str]   # of <html> after the page's own check ran
    console: list[str]           # every console message of the page (errors, logs, warnings)
    dom: str


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} not found: install Debian's chromium package (apt-get install "
                    "chromium; .ci/run does it)")
    # No network: a name that resolves to nothing, so a page that fetches shows a broken picture.
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND",
                           "--window-size=1280,900", *args],
                          capture_output=True, text=True, timeout=120)


def render(page: Path, profile: Path) -> Rendered:
    done = chromium("--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri(),
                    profile=profile)
    assert done.returncode == 0, done.stderr[-2000:]
    tag = re.search(r"<html([^>]*)>", done.stdout)
    assert tag, f"no <html> in the DOM Chromium dumped: {done.stdout[:500]!r}"
    attributes = dict(re.findall(r'([\w-]+)="([^"]*)"', tag.group(1)))
    return Rendered(attributes, [m.group(1) for m in map(CONSOLE.search,
                                                         done.stderr.splitlines()) if m],
                    done.stdout)


def screenshot(page: Path, png: Path, height: int, profile: Path) -> Path:
    done = chromium("--hide-scrollbars", f"--window-size=1280,{min(height, 12000)}",
                    f"--screenshot={png}", page.as_uri(), profile=profile)
    assert done.returncode == 0 and png.is_file(), done.stderr[-2000:]
    return png


def assert_renders_clean(page: Path, profile: Path) -> Rendered:
    """Every section rendered with a body, every picture decoded, no console message."""
    shown = render(page, profile)
    assert shown.console == [], f"console messages: {shown.console}"
    assert shown.attributes.get("data-check") == "ok", shown.attributes
    assert shown.attributes["data-sections"].split() == list(SECTION_IDS)
    for section in SECTION_IDS:
        assert f'<section id="{section}">' in shown.dom
    return shown


def assert_self_contained(html: str) -> None:
    """Nothing to fetch: every src and href is inline data or a link within the page."""
    refs = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert refs and all(r.startswith(("data:image/png;base64,", "#")) for r in refs), \
        [r[:60] for r in refs if not r.startswith(("data:", "#"))]
    assert "url(" not in html and "@import" not in html


# --- one real tiny run, reported while it runs and after ----------------------------------------
@dataclasses.dataclass
class TinyRun:
    url: str
    folder: Path
    mid_run_page: Path
    kill_at: float


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> TinyRun:
    """Two iterations on the embedded cluster, on a file store; a report written from inside
    the run (when iteration 1 starts training), and one preemption event (an injector kill
    of the spot worker mid-run, as the injector records it)."""
    folder = tmp_path_factory.mktemp("report-run")
    path = write_tiny_world(folder)
    url, mid = str(folder / "run"), folder / "mid-run.html"
    seen: dict = {}

    def on_event(kind: str, info: dict) -> None:
        if kind == "stage_start" and info.get("iteration") == 1 and \
                info.get("stage") == "train" and not seen:
            try:
                seen["page"] = write_report(url, mid)
            except Exception as err:  # noqa: BLE001 - the test reports it, the run goes on
                seen["error"] = err

    with Session.from_config(load_config(path), store=url, on_event=on_event) as session:
        session.run(2)
        assert session.val_curve() == RunView(session.store).val_curve()   # one reader
    assert "error" not in seen, seen.get("error")
    view = RunView.open(url)
    tasks = view.tasks()
    assert {t["worker"] for t in tasks} >= {"gpu-0", "spot-0"}, "the run used no spot worker"
    kill_at = (min(t["start"] for t in tasks) + max(t["end"] for t in tasks)) / 2
    view.store.write_events("injected-by-test", [
        {"kind": "injector", "what": "kill", "at": kill_at, "worker": "spot-0", "pid": 1}])
    return TinyRun(url, folder, mid, kill_at)


def test_the_report_of_a_finished_run_renders_every_section_in_chromium(tiny_run, tmp_path,
                                                                         capsys):
    page = tmp_path / "out" / "report.html"
    assert main(["report", tiny_run.url, "--html", str(page)]) == 0
    assert capsys.readouterr().out.startswith(f"report: {page} (")
    html = page.read_text()
    assert_self_contained(html)
    assert "finished: 2 of 2 iterations committed" in html
    # The timeline marks the kill on the spot worker's lane and lists it.
    assert re.search(r"<td>spot-0</td><td>kill</td><td>injector/kill</td>", html)
    # Validation grids of the base model and of both iterations' weights; the stored config.
    assert [f"weights version {v}:" in html for v in (0, 1, 2)] == [True] * 3
    assert "prompts_per_iteration: 2" in html and "name: ocr-dense" in html
    shown = assert_renders_clean(page, tmp_path / "profile")
    assert shown.dom.count("<img ") >= 1 + 2 + 2 + 1 + 3   # curves, timeline, τ/plan, cost, grids
    png = screenshot(page, tmp_path / "report.png", int(shown.attributes["data-height"]),
                     tmp_path / "profile")
    with Image.open(png) as image:
        assert image.width == 1280 and image.height > 2000
        colours = image.convert("RGB").resize((64, 256)).getcolors(64 * 256)
    assert colours is not None and len(colours) > 50, "the screenshot is (nearly) blank"


def test_a_report_written_while_the_run_runs_shows_its_committed_iterations(tiny_run, tmp_path):
    html = tiny_run.mid_run_page.read_text()
    assert "running or stopped: 1 of 2 iterations committed; iteration 1 has recorded" in html
    assert "weights version 1:" in html and "weights version 2:" not in html
    assert_self_contained(html)
    assert_renders_clean(tiny_run.mid_run_page, tmp_path / "profile")


def test_the_report_reads_a_run_on_s3(tiny_run, moto_s3, tmp_path, monkeypatch, capsys):  # noqa: F811
    import s3fs

    prefix = f"{BUCKET}/reports/{tmp_path.name}"
    fs = s3fs.S3FileSystem(key=TEST_KEY, secret=TEST_SECRET,
                           client_kwargs={"endpoint_url": moto_s3.endpoint})
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    fs.put(str(Path(tiny_run.url)) + "/", prefix, recursive=True)   # the run, object for object
    for key, value in {"AWS_ACCESS_KEY_ID": TEST_KEY, "AWS_SECRET_ACCESS_KEY": TEST_SECRET,
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    page = tmp_path / "s3.html"
    assert main(["report", f"s3://{prefix}", "--html", str(page),
                 "--endpoint-url", moto_s3.endpoint]) == 0, capsys.readouterr().err
    html = page.read_text()
    assert f"s3://{prefix}" in html and "finished: 2 of 2 iterations committed" in html
    assert "weights version 2:" in html and "<td>spot-0</td><td>kill</td>" in html
    assert_renders_clean(page, tmp_path / "profile")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_s3.endpoint)   # the standard variable works too
    assert main(["report", f"s3://{prefix}", "--html", str(tmp_path / "env.html")]) == 0


def test_a_url_without_a_run_is_a_clear_error(tmp_path, capsys):
    missing = tmp_path / "nothing-here"
    assert main(["report", str(missing), "--html", str(tmp_path / "r.html")]) == 3
    assert "no Spotlight run" in capsys.readouterr().err
    assert not missing.exists() and not (tmp_path / "r.html").exists()
    empty = RunStore.open(f"file://{tmp_path}/empty")   # a store nothing ran in
    assert main(["report", empty.url, "--html", str(tmp_path / "r.html")]) == 2
    assert "holds a run store but no run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", empty.url])   # --html is required
    assert "--html" in capsys.readouterr().err


# --- the check itself can fail ------------------------------------------------------------------
def _page(tmp_path: Path, extra: str) -> Path:
    sections = [Section(s, s, "<p>content</p>") for s in SECTION_IDS]
    sections[1] = dataclasses.replace(sections[1], body="<p>content</p>" + extra)
    path = tmp_path / "broken.html"
    path.write_text(render_page("t", "file:///x", sections))
    return path


def test_the_browser_check_catches_a_script_error(tmp_path):
    assert render(_page(tmp_path, ""), tmp_path / "p").console == []   # the clean page passes
    shown = render(_page(tmp_path, "<script>reportNotDefined();</script>"), tmp_path / "p")
    assert any("Uncaught ReferenceError: reportNotDefined" in line for line in shown.console)
    shown = render(_page(tmp_path, "<script>console.error('bad');</script>"), tmp_path / "p")
    assert any(line.startswith('"bad", source: ') for line in shown.console), shown.console


def test_the_browser_check_catches_an_empty_section_and_a_fetched_picture(tmp_path):
    remote = '<img src="https://example.invalid/x.png" alt="remote">'
    shown = render(_page(tmp_path, remote), tmp_path / "p")
    assert shown.attributes["data-check"] == "failed"
    assert shown.attributes["data-problems"] == "picture remote"
    with pytest.raises(AssertionError):
        assert_self_contained(_page(tmp_path, remote).read_text())
    sections = [Section(s, s, "<p>content</p>") for s in SECTION_IDS[:-1]]
    sections.append(Section("config", "Config", "  "))
    (tmp_path / "empty.html").write_text(render_page("t", "file:///x", sections))
    shown = render(tmp_path / "empty.html", tmp_path / "p")
    assert shown.attributes["data-check"] == "failed"
    assert shown.attributes["data-problems"] == "section config is empty or missing"


def test_the_timeline_marks_preemptions_on_their_lanes(tmp_path):
    tasks = [{"worker": "gpu-0", "stage": "train", "start": 0.0, "end": 2.0, "iteration": 0},
             {"worker": "spot-0", "stage": "explore", "start": 0.5, "end": 1.5, "iteration": 1}]
    plain = Image.open(plot_timeline(tasks, tmp_path / "plain.png"))
    marked = Image.open(plot_timeline(tasks, tmp_path / "marked.png", marks=[
        {"worker": "spot-0", "at": 1.5, "mark": "kill"},
        {"worker": "spot-1", "at": 1.0, "mark": "notice"}]))   # no task: a lane of its own
    assert marked.height > plain.height   # the third lane
    same_lanes = Image.open(plot_timeline(tasks, tmp_path / "one.png", marks=[
        {"worker": "spot-0", "at": 1.5, "mark": "kill"}]))
    assert same_lanes.size == plain.size and same_lanes.tobytes() != plain.tobytes()
