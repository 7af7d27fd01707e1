"""Prompt sets for a real text-to-image model, generated from templates.

The published OCR and GenEval prompt sets cannot be fetched here, so the Qwen-Image recipes
(``configs/qwen-image-*.yaml``) train and validate on prompts written from templates: signs,
labels and screens with short words and numbers (OCR), and GenEval's six tags -- single object,
two objects, counting, colours, position, colour attributes -- over everyday object classes
and GenEval's ten colours. Replace them with your own set for a real run; any file in the same
format works (:mod:`spotlight.models.prompts`).

    python -m spotlight.models.prompt_sets configs/prompts   # writes the four qwen_* files

A fixed seed makes the files reproducible; the validation prompts share no text with the
training prompts.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from spotlight.models.prompts import GENEVAL_COLORS, RELATIONS

SEED = 2026
OCR_TEMPLATES = (
    'a shop sign that reads "{}"', 'a street sign with the words "{}"',
    'a coffee cup with "{}" written on it', 'a neon sign glowing with the text "{}"',
    'a chalkboard menu that says "{}"', 'a book cover titled "{}"',
    'a t-shirt printed with "{}"', 'a billboard showing "{}"',
    'a laptop screen displaying "{}"', 'a birthday cake with "{}" written in icing',
    'a wooden door with a plaque that says "{}"', 'a bus with "{}" on its destination board',
)
OCR_WORDS = (
    "OPEN", "CLOSED", "SALE", "EXIT", "HELLO", "WELCOME", "COFFEE", "BAKERY", "LIBRARY",
    "STOP", "GARDEN", "MARKET", "STATION", "PIZZA", "MUSEUM", "HOTEL", "SUMMER", "WINTER",
    "River Road", "Green Tea", "Good Morning", "Fresh Bread", "Main Street", "Lost and Found",
    "No Parking", "Sunset Cafe", "Book Club", "Platform 9", "Room 204", "Route 66", "Gate B12",
    "Since 1987", "Open 24 Hours", "Happy Birthday", "Keep Calm", "Welcome Home",
)
OBJECTS = (
    "dog", "cat", "horse", "bird", "cow", "sheep", "elephant", "giraffe", "car", "bicycle",
    "bus", "truck", "boat", "airplane", "motorcycle", "train", "bench", "chair", "couch", "bed",
    "clock", "vase", "cup", "bottle", "bowl", "book", "laptop", "umbrella", "backpack",
    "suitcase", "apple", "banana", "orange", "pizza", "cake", "donut", "teddy bear",
    "potted plant", "traffic light", "fire hydrant",
)
NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four"}


def _plural(name: str) -> str:
    return name + ("es" if name.endswith(("s", "sh", "ch")) else "s")


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _noun(count: int, name: str, color: str | None = None) -> str:
    colored = f"{color} " if color else ""
    if count == 1:
        return f"{_article(colored + name)} {colored}{name}"
    return f"{NUMBERS[count]} {colored}{_plural(name)}"


def ocr_prompts(rng: random.Random) -> list[str]:
    """Every template with every word, shuffled: each prompt's target between double quotes."""
    prompts = [t.format(w) for t in OCR_TEMPLATES for w in OCR_WORDS]
    rng.shuffle(prompts)
    return prompts


def geneval_record(tag: str, rng: random.Random) -> dict:
    """One GenEval metadata record of ``tag`` over :data:`OBJECTS` and GenEval's colours."""
    a, b = rng.sample(OBJECTS, 2)
    c1, c2 = rng.sample(GENEVAL_COLORS, 2)
    if tag == "single_object":
        return {"tag": tag, "include": [{"class": a, "count": 1}],
                "prompt": f"a photo of {_noun(1, a)}"}
    if tag == "two_object":
        return {"tag": tag, "include": [{"class": a, "count": 1}, {"class": b, "count": 1}],
                "prompt": f"a photo of {_noun(1, a)} and {_noun(1, b)}"}
    if tag == "counting":
        n = rng.randint(2, 4)
        return {"tag": tag, "include": [{"class": a, "count": n}],
                "exclude": [{"class": a, "count": n + 1}], "prompt": f"a photo of {_noun(n, a)}"}
    if tag == "colors":
        return {"tag": tag, "include": [{"class": a, "count": 1, "color": c1}],
                "prompt": f"a photo of {_noun(1, a, c1)}"}
    if tag == "position":
        relation = rng.choice(RELATIONS)
        return {"tag": tag, "include": [{"class": b, "count": 1},
                                        {"class": a, "count": 1, "position": [relation, 0]}],
                "prompt": f"a photo of {_noun(1, a)} {relation} {_noun(1, b)}"}
    return {"tag": tag, "include": [{"class": a, "count": 1, "color": c1},
                                    {"class": b, "count": 1, "color": c2}],
            "prompt": f"a photo of {_noun(1, a, c1)} and {_noun(1, b, c2)}"}


GENEVAL_TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")


def geneval_prompts(rng: random.Random, count: int) -> list[dict]:
    """Up to ``count`` distinct records, the six tags in turn (a tag whose distinct prompts are
    used up -- 40 single objects -- drops out)."""
    records, seen, tags = [], set(), list(GENEVAL_TAGS)
    while len(records) < count and tags:
        tag = tags[len(records) % len(tags)]
        fresh = next((r for r in (geneval_record(tag, rng) for _ in range(200))
                      if r["prompt"] not in seen), None)
        if fresh is None:
            tags.remove(tag)
            continue
        seen.add(fresh["prompt"])
        records.append(fresh)
    return records


def prompt_files(val_fraction: float = 0.125, geneval_count: int = 512) -> dict[str, str]:
    """The four files' names and contents (train and val of each task, disjoint)."""
    rng = random.Random(SEED)
    ocr = ocr_prompts(rng)
    geneval = [json.dumps(r) for r in geneval_prompts(rng, geneval_count)]
    files = {}
    for name, lines, suffix in (("qwen_ocr", ocr, "txt"), ("qwen_geneval", geneval, "jsonl")):
        cut = int(len(lines) * val_fraction)
        files[f"{name}_val.{suffix}"] = "\n".join(lines[:cut]) + "\n"
        files[f"{name}_train.{suffix}"] = "\n".join(lines[cut:]) + "\n"
    return files


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m spotlight.models.prompt_sets OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name, text in prompt_files().items():
        (out / name).write_text(text)
        print(f"{out / name}: {text.count(chr(10))} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
