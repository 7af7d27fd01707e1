"""The Qwen-Image recipes' prompt files are what the template generator writes, parse as
prompts for a real model, and keep validation apart from training."""
from __future__ import annotations

from pathlib import Path

from spotlight.models.prompt_sets import prompt_files
from spotlight.models.prompts import load_prompts

PROMPTS = Path(__file__).resolve().parents[2] / "configs" / "prompts"


def test_the_shipped_files_are_the_generators_output():
    for name, text in prompt_files().items():
        assert (PROMPTS / name).read_text() == text, \
            f"{name} is stale: python -m spotlight.models.prompt_sets configs/prompts"


def test_they_parse_for_a_real_model_and_validation_is_apart_from_training():
    for task, suffix in (("ocr", "txt"), ("geneval", "jsonl")):
        train, val = (load_prompts(PROMPTS / f"qwen_{task}_{split}.{suffix}", task,
                                   open_vocabulary=True) for split in ("train", "val"))
        assert len(train) >= 300 and len(val) >= 50
        assert not {p.text for p in train} & {p.text for p in val}
    tags = {p.tag for p in load_prompts(PROMPTS / "qwen_geneval_train.jsonl", "geneval",
                                        open_vocabulary=True)}
    assert tags == {"single_object", "two_object", "counting", "colors", "position",
                    "color_attr"}
