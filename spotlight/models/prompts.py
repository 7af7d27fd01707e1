"""Prompt files of the two task families, parsed strictly.

- ``ocr``: plain text, one prompt per line, the target digit string between double quotes,
  as in Flow-GRPO's OCR data: ``a sign that says "407"``.
- ``geneval``: JSONL in GenEval's metadata shape:
  ``{"tag": "counting", "include": [{"class": "3", "count": 2, "color": "red"}], "prompt": "two red 3s"}``;
  a position clause sits on the second object: ``"position": ["left of", 0]``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

PALETTE: dict[str, tuple[float, float, float]] = {
    "red": (1.0, 0.1, 0.1),
    "green": (0.1, 1.0, 0.1),
    "blue": (0.2, 0.35, 1.0),
    "yellow": (1.0, 1.0, 0.1),
}
"""Object colours of the geneval world (RGB in [0, 1]); OCR ink is white."""

RELATIONS = ("left of", "right of", "above", "below")
MAX_OCR_DIGITS = 3
MAX_COUNT = 3
_QUOTED = re.compile(r'"([^"]*)"')


class PromptFileError(ValueError):
    """A prompt file has a bad line; the message names the file and line number."""


@dataclass(frozen=True)
class ObjectClause:
    """One GenEval ``include`` entry: a digit class, how many, optional colour and position."""

    cls: str
    count: int = 1
    color: str | None = None
    position: tuple[str, int] | None = None


@dataclass(frozen=True)
class Prompt:
    """A prompt of either family. ``target`` is set for ocr, ``include`` for geneval."""

    text: str
    task: str
    target: str | None = None
    tag: str | None = None
    include: tuple[ObjectClause, ...] = field(default=())


def ocr_prompt(line: str, where: str = "<prompt>") -> Prompt:
    """Parse one OCR prompt line; the quoted target must be 1-3 digits."""
    found = _QUOTED.findall(line)
    if not found:
        raise PromptFileError(f"{where}: no target between double quotes in {line!r}; "
                              'write e.g. a sign that says "407"')
    target = found[0]
    if not target.isdigit() or not 1 <= len(target) <= MAX_OCR_DIGITS or not target.isascii():
        raise PromptFileError(f"{where}: target {target!r} must be 1-{MAX_OCR_DIGITS} digits (0-9); "
                              "the digits world renders only digit strings")
    return Prompt(text=line.strip(), task="ocr", target=target)


def _clause(entry: object, index: int, n_entries: int, where: str) -> ObjectClause:
    if not isinstance(entry, dict):
        raise PromptFileError(f"{where}: include[{index}] must be an object, got {entry!r}")
    unknown = set(entry) - {"class", "count", "color", "position"}
    if unknown:
        raise PromptFileError(f"{where}: include[{index}] has unknown keys {sorted(unknown)}; "
                              "allowed: class, count, color, position")
    cls = str(entry.get("class", ""))
    if len(cls) != 1 or not cls.isdigit():
        raise PromptFileError(f"{where}: include[{index}].class = {cls!r} must be one digit '0'-'9'")
    count = entry.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COUNT:
        raise PromptFileError(f"{where}: include[{index}].count = {count!r} must be 1-{MAX_COUNT}")
    color = entry.get("color")
    if color is not None and color not in PALETTE:
        raise PromptFileError(f"{where}: include[{index}].color = {color!r}; "
                              f"choose one of {sorted(PALETTE)}")
    position = entry.get("position")
    if position is not None:
        ok = (isinstance(position, list) and len(position) == 2 and position[0] in RELATIONS
              and isinstance(position[1], int) and 0 <= position[1] < n_entries
              and position[1] != index)
        if not ok:
            raise PromptFileError(f"{where}: include[{index}].position = {position!r} must be "
                                  f"[relation, other_index] with relation in {list(RELATIONS)}")
        position = (position[0], position[1])
    return ObjectClause(cls=cls, count=count, color=color, position=position)


def geneval_prompt(line: str, where: str = "<prompt>") -> Prompt:
    """Parse one GenEval metadata JSON line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise PromptFileError(f"{where}: malformed JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(record, dict) or not {"tag", "include", "prompt"} <= set(record):
        raise PromptFileError(f"{where}: each line needs keys 'tag', 'include' and 'prompt'")
    include = record["include"]
    if not isinstance(include, list) or not 1 <= len(include) <= 2:
        raise PromptFileError(f"{where}: 'include' must list 1 or 2 objects")
    clauses = tuple(_clause(e, i, len(include), where) for i, e in enumerate(include))
    if sum(c.count for c in clauses) > MAX_COUNT:
        raise PromptFileError(f"{where}: at most {MAX_COUNT} objects in all fit a canvas")
    return Prompt(text=str(record["prompt"]), task="geneval", tag=str(record["tag"]),
                  include=clauses)


def load_prompts(path: str | Path, task: str) -> list[Prompt]:
    """Load a prompt file of ``task`` ('ocr' or 'geneval'); any bad line is an error."""
    path = Path(path)
    if not path.is_file():
        raise PromptFileError(f"prompt file '{path}' does not exist")
    parse = {"ocr": ocr_prompt, "geneval": geneval_prompt}[task]
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            prompts.append(parse(line, f"{path}:{number}"))
    if not prompts:
        raise PromptFileError(f"prompt file '{path}' holds no prompts")
    return prompts


def geneval_record(prompt: Prompt) -> dict:
    """The GenEval metadata dict of a geneval prompt (inverse of ``geneval_prompt``)."""
    include = []
    for c in prompt.include:
        entry: dict = {"class": c.cls, "count": c.count}
        if c.color:
            entry["color"] = c.color
        if c.position:
            entry["position"] = list(c.position)
        include.append(entry)
    return {"tag": prompt.tag, "include": include, "prompt": prompt.text}
