"""The README and the guides in docs/ say what is true: every link resolves (a file, and a
heading for an anchor), the README stays a short guide, and every ``spotlight ...`` command they
show parses with the real CLI parser -- a flag, a subcommand, a bench name or a choice that does
not exist fails here, not for a user. The dated entries of docs/results.md record commands as
they ran (some since renamed) and are not checked; its summary table is."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 350
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation and code marks dropped, spaces to
    hyphens."""
    text = re.sub(r"^#+\s*", "", heading).strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def text_of(path: Path) -> str:
    """What is checked of a page: for docs/results.md, what comes before its dated entries."""
    text = path.read_text()
    if path.name == "results.md":
        text = text.split("\n## 20", 1)[0]
    return text


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (a ``# comment`` there is no heading, a ``[x](y)``
    no link)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return "\n".join(out)


def anchors(path: Path) -> set[str]:
    return {slug(line) for line in prose(path.read_text()).splitlines() if line.startswith("#")}


def links() -> list[tuple[Path, str]]:
    return [(path, m.group(2)) for path in GUIDES
            for m in LINK.finditer(re.sub(r"`[^`]*`", "", prose(text_of(path))))]


@pytest.mark.parametrize("page,target", [(p.relative_to(ROOT).as_posix(), t) for p, t in links()
                                         if not re.match(r"[a-z]+:", t)])
def test_every_link_resolves(page, target):
    file, _, anchor = target.partition("#")
    where = (ROOT / page).parent / file if file else ROOT / page
    assert where.exists(), f"{page}: {target} -> {where} does not exist"
    if anchor:
        assert anchor in anchors(where), f"{page}: no heading #{anchor} in {where.name}"


def test_the_readme_is_a_short_guide():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; depth goes to docs/"
    assert lines[2:5] == ["```bash", lines[3], lines[4]] and lines[3].startswith("make demo") \
        and lines[4].startswith("make test"), "the README opens with make demo and make test"


def commands() -> list[tuple[str, str, bool]]:
    """Every ``spotlight ...`` command line in the guides, and whether it is a whole command:
    lines of code blocks (a ``$ `` prompt and a trailing ``# comment`` dropped) are; inline code
    spans may name a command or an option in passing (`spotlight run --resume`)."""
    found = []
    for path in GUIDES:
        fenced = False
        for line in re.sub(r"\\\n\s*", " ", text_of(path)).splitlines():   # continuations
            if FENCE.match(line.strip()):
                fenced = not fenced
                continue
            if fenced or line.startswith("    "):
                command = re.sub(r"^\$ ", "", line.strip())
                if command.startswith("spotlight "):
                    found.append((path.name, re.sub(r"\s+#.*$", "", command), True))
            else:
                found += [(path.name, span, False)
                          for span in re.findall(r"`(spotlight [^`]+)`", line)]
    return found


PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")   # RUN_URL, PATH, K: the reader fills it in


def variants(command: str) -> list[list[str]]:
    """The command lines ``command`` stands for: ``[--opt X]`` included, each ``a|b`` choice
    on its own, a trailing ``...`` dropped."""
    tokens = shlex.split(command.replace("[", "").replace("]", ""))[1:]
    tokens = [t for t in tokens if t not in ("...", "…")]
    lines = [[]]
    for token in tokens:
        choices = token.split("|") if "|" in token and "=" not in token else [token]
        lines = [line + [choice] for line in lines for choice in choices]
    return lines


def subparser(parser, name: str):
    return next(a for a in parser._actions if a.dest == "command").choices.get(name)


def filled(parser, argv: list[str]) -> list[str]:
    """``argv`` with each placeholder replaced by a value its option's type takes (a bench
    NAME by a bench's name): a real value is checked as it is."""
    sub = subparser(parser, argv[0]) if argv else None
    if sub is None:
        return argv
    out = list(argv)
    for i, token in enumerate(argv):
        if not PLACEHOLDER.match(token) or i == 0:
            continue
        action = sub._option_string_actions.get(argv[i - 1])
        if action is None:   # a positional: the bench's name, or any string
            positional = [a for a in sub._actions if not a.option_strings]
            if positional and positional[0].choices:
                out[i] = list(positional[0].choices)[0]
        elif action.choices:
            out[i] = list(action.choices)[0]
        elif action.type is int:
            out[i] = "1"
        elif action.type is not None:
            out[i] = "0.5"
    return out


def mentions(parser, argv: list[str]) -> bool:
    """An inline mention: a subcommand that exists and options it has, nothing else."""
    sub = subparser(parser, argv[0]) if argv else None
    return sub is not None and all(
        t in sub._option_string_actions if t.startswith("-") else PLACEHOLDER.match(t)
        for t in argv[1:])


def test_the_guides_show_commands():
    assert len([c for c in commands() if c[2]]) >= 20


@pytest.mark.parametrize("page,command,whole", commands())
def test_every_command_in_the_guides_parses(page, command, whole):
    from pipelines.bench.registry import OPTIONS, SPECS
    from pipelines.front.cli import build_parser

    parser = build_parser()
    for argv in variants(command):
        try:
            args = parser.parse_args(filled(parser, argv))
        except SystemExit:
            if not whole and mentions(parser, argv):
                continue
            pytest.fail(f"{page}: `{command}` does not parse ({' '.join(argv)})")
        if args.command == "bench":   # and each option applies to the bench it is given
            given = [t.split("=")[0] for t in argv if t.startswith("--") and t in OPTIONS]
            wrong = [flag for flag in given if flag not in SPECS[args.name].options]
            assert not wrong, f"{page}: `{command}`: bench {args.name} takes no {wrong}"
