"""Reward ocr-text: PP-OCR (rapidocr, the models of its wheel) reading PIL-rendered strings."""
from __future__ import annotations

import socket

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from spotlight.config import RewardConfig
from spotlight.models.prompts import Prompt
from spotlight.rewards import build_reward
from spotlight.rewards.text_ocr import RapidOcrEngine, TextOcrReward


def rendered(text: str, width: int = 256, height: int = 64) -> np.ndarray:
    """Black text on white as (3, H, W) float32 in [0, 1], like a decoded image."""
    image = Image.new("RGB", (width, height), "white")
    ImageDraw.Draw(image).text((10, 10), text, fill="black", font=ImageFont.load_default(size=36))
    return (np.asarray(image, np.float32) / 255.0).transpose(2, 0, 1)


def prompt(target: str) -> Prompt:
    return Prompt(text=f'a sign that says "{target}"', task="ocr", target=target)


@pytest.fixture(scope="module")
def engine():
    return RapidOcrEngine()


@pytest.fixture(scope="module")
def reward(engine):
    return TextOcrReward(RewardConfig(name="ocr-text"), engine=engine)


def test_the_engine_loads_and_reads_without_the_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the OCR engine tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    assert RapidOcrEngine().read(rendered("875")) == "875"


def test_exact_text_scores_one(reward):
    assert reward(np.stack([rendered("875"), rendered("HELLO 42")]),
                  [prompt("875"), prompt("hello42")]).tolist() == [1.0, 1.0]


def test_one_wrong_character_costs_one_over_the_length(reward):
    assert reward(rendered("8751")[None], [prompt("8752")]).tolist() == [0.75]


def test_a_blank_image_scores_zero(reward):
    blank = np.ones((1, 3, 64, 256), np.float32)
    assert reward(blank, [prompt("875")]).tolist() == [0.0]


def test_the_reward_is_registered_and_refuses_other_prompt_families():
    built = build_reward(RewardConfig(name="ocr-text"))
    assert isinstance(built, TextOcrReward) and built.engine.name == "rapidocr"
    with pytest.raises(ValueError, match="scores 'ocr' prompts"):
        built(rendered("1")[None], [Prompt(text="two 3s", task="geneval", target=None)])
