"""OCR engine 'transformers': a vision-language model (a tiny random LLaVA: CLIP vision tower,
Llama text model, saved with save_pretrained) loaded and run through the engine's own path.
Its text is noise; what is proven is loading, prompting with the chat template, left-padded
batched generation, and that a batch reads like one image at a time."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from spotlight.config import RewardConfig
from spotlight.models.prompts import Prompt
from spotlight.rewards import build_reward
from spotlight.rewards.text_ocr import TextOcrReward, TransformersOcrEngine

TEMPLATE = ("{% for m in messages %}{{ m['role'] | upper }} : {% for c in m['content'] %}"
            "{% if c['type'] == 'image' %}<image> {% else %}{{ c['text'] }} {% endif %}"
            "{% endfor %}{% endfor %}{% if add_generation_prompt %}ASSISTANT : {% endif %}")


@pytest.fixture(scope="module")
def vlm_folder(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import (
        CLIPImageProcessor,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("vlm")
    words = Tokenizer(models.WordLevel(unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.train_from_iterator(["USER ASSISTANT : Read all the text in the image . HELLO 0 1 2 3 4"],
                              trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>",
                                                                        "<image>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", bos_token="<s>",
                                        eos_token="</s>", pad_token="</s>", model_max_length=256,
                                        extra_special_tokens={"image_token": "<image>"})
    config = LlavaConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=16, intermediate_size=32,
                           num_hidden_layers=2, num_attention_heads=2, image_size=28,
                           patch_size=14),
        text_config=dict(model_type="llama", vocab_size=len(tokenizer), hidden_size=32,
                         intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=256,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_layer=-1)
    LlavaForConditionalGeneration(config).save_pretrained(folder)
    LlavaProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 28},
                                                      crop_size={"height": 28, "width": 28}),
                   tokenizer=tokenizer, patch_size=14, vision_feature_select_strategy="default",
                   num_additional_image_tokens=1, chat_template=TEMPLATE).save_pretrained(folder)
    return folder


def test_a_batch_reads_like_one_image_at_a_time(vlm_folder):
    images = np.random.default_rng(0).random((3, 3, 32, 64)).astype(np.float32)
    engine = TransformersOcrEngine(str(vlm_folder), max_new_tokens=4, batch_size=2)
    assert engine.prompt == "USER : <image> Read all the text in the image. ASSISTANT : "
    batch = engine.read_batch(images)
    assert len(batch) == 3 and all(isinstance(t, str) and t for t in batch)
    assert batch == [engine.read(image) for image in images]


def test_the_reward_reads_through_the_configured_engine(vlm_folder):
    config = RewardConfig(name="ocr-text", ocr_engine="transformers", ocr_model=str(vlm_folder))
    reward = build_reward(config)
    assert isinstance(reward, TextOcrReward) and reward.engine.name == "transformers"
    prompts = [Prompt('a sign that says "HELLO"', "ocr", target="HELLO")] * 2
    values = reward(np.zeros((2, 3, 32, 64), np.float32), prompts)
    assert values.shape == (2,) and ((0 <= values) & (values <= 1)).all()
    with pytest.raises(ValueError, match="needs reward.ocr_model"):
        build_reward(RewardConfig(name="ocr-text", ocr_engine="transformers"))
