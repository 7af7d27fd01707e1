"""Prompt files of the two task families, parsed strictly.

- ``ocr``: plain text, one prompt per line, the target digit string between double quotes,
  as in Flow-GRPO's OCR data: ``a sign that says "407"``.
- ``geneval``: JSONL in GenEval's metadata shape: ``{"tag": "counting",
  "include": [{"class": "3", "count": 2, "color": "red"}], "prompt": "two red 3s"}``;
  a position clause sits on the second object: ``"position": ["left of", 0]``. The digits
  world takes digit classes, its four colours and at most three objects; a real model's prompts
  (``open_vocabulary``) take GenEval's own: any class name, its ten colours, ``exclude``.
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

GENEVAL_COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black",
                  "white")
"""The colours GenEval's colour clauses name (open-vocabulary prompts, for real images)."""
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
    exclude: tuple[ObjectClause, ...] = field(default=())


def ocr_prompt(line: str, where: str = "<prompt>", open_vocabulary: bool = False) -> Prompt:
    """Parse one OCR prompt line; the quoted target must be 1-3 digits (any text with
    ``open_vocabulary``: a real model renders any string)."""
    found = _QUOTED.findall(line)
    if not found:
        raise PromptFileError(f"{where}: no target between double quotes in {line!r}; "
                              'write e.g. a sign that says "407"')
    target = found[0]
    if open_vocabulary:
        if not target.strip():
            raise PromptFileError(f"{where}: the target between the quotes is empty")
    elif not target.isdigit() or not 1 <= len(target) <= MAX_OCR_DIGITS or not target.isascii():
        raise PromptFileError(f"{where}: target {target!r} must be 1-{MAX_OCR_DIGITS} digits "
                              "(0-9); the digits world renders only digit strings")
    return Prompt(text=line.strip(), task="ocr", target=target)


def _clause(entry: object, index: int, n_entries: int, where: str,
            open_vocabulary: bool = False) -> ObjectClause:
    if not isinstance(entry, dict):
        raise PromptFileError(f"{where}: include[{index}] must be an object, got {entry!r}")
    unknown = set(entry) - {"class", "count", "color", "position"}
    if unknown:
        raise PromptFileError(f"{where}: include[{index}] has unknown keys {sorted(unknown)}; "
                              "allowed: class, count, color, position")
    cls = str(entry.get("class", ""))
    if open_vocabulary and not cls.strip():
        raise PromptFileError(f"{where}: include[{index}].class is empty; name the object")
    if not open_vocabulary and (len(cls) != 1 or not cls.isdigit()):
        raise PromptFileError(f"{where}: include[{index}].class = {cls!r} must be one digit "
                              "'0'-'9'")
    count, most = entry.get("count", 1), (16 if open_vocabulary else MAX_COUNT)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= most:
        raise PromptFileError(f"{where}: include[{index}].count = {count!r} must be 1-{most}")
    color, colors = entry.get("color"), (GENEVAL_COLORS if open_vocabulary else tuple(PALETTE))
    if color is not None and color not in colors:
        raise PromptFileError(f"{where}: include[{index}].color = {color!r}; "
                              f"choose one of {sorted(colors)}")
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


def _exclusions(entries: object, where: str) -> tuple[ObjectClause, ...]:
    ok = isinstance(entries, list) and all(
        isinstance(e, dict) and set(e) == {"class", "count"} and isinstance(e["count"], int)
        and e["count"] >= 1 for e in entries)
    if not ok:
        raise PromptFileError(f"{where}: 'exclude' must list objects {{\"class\": name, "
                              "\"count\": n >= 1}")
    return tuple(ObjectClause(cls=str(e["class"]), count=e["count"]) for e in entries)


def geneval_prompt(line: str, where: str = "<prompt>", open_vocabulary: bool = False) -> Prompt:
    """Parse one GenEval metadata JSON line (for the digits world unless ``open_vocabulary``)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise PromptFileError(f"{where}: malformed JSON ({err.msg} at column "
                              f"{err.colno})") from None
    if not isinstance(record, dict) or not {"tag", "include", "prompt"} <= set(record):
        raise PromptFileError(f"{where}: each line needs keys 'tag', 'include' and 'prompt'")
    include = record["include"]
    most = 4 if open_vocabulary else 2
    if not isinstance(include, list) or not 1 <= len(include) <= most:
        raise PromptFileError(f"{where}: 'include' must list 1 to {most} objects")
    clauses = tuple(_clause(e, i, len(include), where, open_vocabulary)
                    for i, e in enumerate(include))
    if "exclude" in record and not open_vocabulary:
        raise PromptFileError(f"{where}: the digits world takes no 'exclude' clauses")
    if not open_vocabulary and sum(c.count for c in clauses) > MAX_COUNT:
        raise PromptFileError(f"{where}: at most {MAX_COUNT} objects in all fit a canvas")
    return Prompt(text=str(record["prompt"]), task="geneval", tag=str(record["tag"]),
                  include=clauses, exclude=_exclusions(record.get("exclude", []), where))


def load_prompts(path: str | Path, task: str, open_vocabulary: bool = False) -> list[Prompt]:
    """Load a prompt file of ``task`` ('ocr' or 'geneval'); any bad line is an error.
    ``open_vocabulary``: GenEval prompts for a real model rather than the digits world."""
    path = Path(path)
    if not path.is_file():
        raise PromptFileError(f"prompt file '{path}' does not exist")
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            where = f"{path}:{number}"
            prompts.append(geneval_prompt(line, where, open_vocabulary) if task == "geneval"
                           else ocr_prompt(line, where, open_vocabulary))
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
    record = {"tag": prompt.tag, "include": include, "prompt": prompt.text}
    if prompt.exclude:
        record["exclude"] = [{"class": c.cls, "count": c.count} for c in prompt.exclude]
    return record


def world_prompts(config, split: str) -> list[Prompt]:
    """The ``train`` or ``val`` prompts of a run config (open vocabulary for a real model)."""
    return load_prompts(getattr(config.world, f"{split}_prompts"), config.world.task,
                        open_vocabulary=config.model.policy != "digits")
