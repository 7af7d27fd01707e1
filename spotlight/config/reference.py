"""The configuration reference (``docs/configuration.md``), generated from the typed configs.

``python -m spotlight.config.reference > docs/configuration.md`` rewrites it; a test fails when
the file is stale or a field has no documentation.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Iterator

from spotlight.config import RunConfig
from spotlight.config.base import type_name

HEADER = """# Configuration reference

Generated from `spotlight/config/` by \
`python -m spotlight.config.reference > docs/configuration.md`;
do not edit by hand. A run is one YAML file (see `configs/digits.yaml`); any value can also be set
with `--set section.key=value`. Every value is checked before anything runs: an unknown key names
the nearest valid one, a bad value names its allowed range. Paths in a config file are relative to
that file; paths given with `--set` to the working folder; each named file must exist and parse
before a run store is created.
"""


def field_rows(cls: type, prefix: str = "") -> Iterator[tuple[str, str, Any, str, str]]:
    """(dotted key, type, default, allowed, help) of every field, sections depth first."""
    hints = typing.get_type_hints(cls)
    defaults = cls()
    for f in dataclasses.fields(cls):
        if f.name == "source":
            continue
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            yield from field_rows(hint, f"{prefix}{f.name}.")
            continue
        meta = f.metadata
        allowed = ""
        if meta.get("choices"):
            allowed = " \\| ".join(f"`{c}`" for c in meta["choices"])
        elif meta.get("range"):
            low, high = meta["range"]
            allowed = f"[{_number(low)}, {_number(high)}]"
        elif meta.get("path"):
            allowed = "a file that exists" if meta["path"] == "exists" else "a path"
        yield (prefix + f.name, type_name(hint), getattr(defaults, f.name), allowed,
               meta.get("help", ""))


def sections(cls: type = RunConfig) -> Iterator[tuple[str, type]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield f.name, hints[f.name]


def _number(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _cell(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value).replace("True", "true").replace(
        "False", "false")
    return f"`{text}`" if text else "``"


def markdown() -> str:
    """The whole reference as Markdown."""
    out = [HEADER]
    top = [row for row in field_rows(RunConfig) if "." not in row[0]]
    groups = [("(top level)", RunConfig.__doc__ or "", top)]
    for name, cls in sections():
        groups.append((name, cls.__doc__ or "", list(field_rows(cls, f"{name}."))))
    for title, doc, rows in groups:
        out.append(f"\n## `{title}`\n\n{' '.join(doc.split())}\n")
        out.append("| key | type | default | allowed | meaning |\n|---|---|---|---|---|")
        for key, kind, default, allowed, help_text in rows:
            out.append(f"| `{key}` | {kind} | {_cell(default)} | {allowed} | "
                       f"{' '.join(help_text.split())} |")
    return "\n".join(out) + "\n"


def undocumented() -> list[str]:
    """Dotted keys whose field has no help text."""
    return [key for key, _, _, _, help_text in field_rows(RunConfig) if not help_text.strip()]


if __name__ == "__main__":
    print(markdown(), end="")
