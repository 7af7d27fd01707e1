"""The transformers detector and CLIP colour classifier behind 'geneval-image', on tiny random
instances of real classes saved with save_pretrained and loaded through the reward's own path
(scores are meaningless; the loading, batching and plumbing are what is proven)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from spotlight.config import RewardConfig
from spotlight.models.prompts import ObjectClause, Prompt
from spotlight.rewards.geneval_image import GENEVAL_COLORS, Box
from spotlight.rewards.vision import ClipColorClassifier, GenevalImageReward, TransformersDetector
from spotlight.staging import StagingError

CLASSES = {0: "dog", 1: "cat", 2: "bench"}


@pytest.fixture(scope="module")
def detector_folder(tmp_path_factory):
    from transformers import YolosConfig, YolosForObjectDetection, YolosImageProcessor

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("detector")
    config = YolosConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, image_size=[64, 64], patch_size=16,
                         num_detection_tokens=6, id2label=CLASSES,
                         label2id={v: k for k, v in CLASSES.items()})
    YolosForObjectDetection(config).save_pretrained(folder)
    YolosImageProcessor(size={"shortest_edge": 64, "longest_edge": 64}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import (
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        CLIPProcessor,
        PreTrainedTokenizerFast,
    )

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("clip")
    words = Tokenizer(models.WordLevel(unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.train_from_iterator([" ".join(("a photo of", *GENEVAL_COLORS, *CLASSES.values()))],
                              trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", bos_token="<s>",
                                        eos_token="</s>", pad_token="</s>", model_max_length=16)
    ids = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
               bos_token_id=tokenizer.bos_token_id)
    config = CLIPConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=16,
                         **ids),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, image_size=32, patch_size=8),
        projection_dim=8)
    CLIPModel(config).save_pretrained(folder)
    CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32},
                                                     crop_size={"height": 32, "width": 32}),
                  tokenizer=tokenizer).save_pretrained(folder)
    return folder


def _images(n=5, h=32, w=48):
    return np.random.default_rng(0).random((n, 3, h, w)).astype(np.float32)


def test_the_detector_loads_and_batches_like_one_image_at_a_time(detector_folder):
    images = _images()
    batched = TransformersDetector(str(detector_folder), threshold=0.0, batch_size=2)
    single = TransformersDetector(f"file://{detector_folder}", threshold=0.0, batch_size=1)
    found = batched.detect(images)
    assert len(found) == len(images) and all(found)
    assert {b.label for boxes in found for b in boxes} <= set(CLASSES.values())
    again = single.detect(images)
    for mine, theirs in zip(found, again):
        assert [b.label for b in mine] == [b.label for b in theirs]
        np.testing.assert_allclose([b.xyxy for b in mine], [b.xyxy for b in theirs], atol=1e-3)


def test_a_detector_folder_without_its_processor_is_named(detector_folder, tmp_path):
    import shutil

    shutil.copytree(detector_folder, tmp_path / "det")
    (tmp_path / "det" / "preprocessor_config.json").unlink()
    with pytest.raises(StagingError, match=r"lacks \['preprocessor_config.json or "
                                           r"processor_config.json'\]"):
        TransformersDetector(str(tmp_path / "det"))


def test_the_colour_classifier_names_one_geneval_colour_per_object(clip_folder):
    image = _images(1)[0]
    boxes = [Box("dog", 0.9, (2, 3, 20, 30)), Box("dog", 0.8, (40, 0, 60, 40))]  # 2nd leaves it
    names = ClipColorClassifier(str(clip_folder)).classify(image, boxes, "dog")
    assert len(names) == 2 and set(names) <= set(GENEVAL_COLORS)
    assert ClipColorClassifier(str(clip_folder)).classify(image, [], "dog") == []


def test_the_reward_scores_geneval_prompts_through_both_models(detector_folder, clip_folder):
    config = RewardConfig(name="geneval-image", detector=str(detector_folder),
                          color_classifier=str(clip_folder))
    reward = GenevalImageReward(config)
    prompts = [Prompt("a photo of a red dog", "geneval", tag="colors",
                      include=(ObjectClause("dog", 1, "red"),))] * 2 + \
              [Prompt("a photo of a cat", "geneval", tag="single_object",
                      include=(ObjectClause("cat"),))]
    values = reward(_images(3), prompts)
    assert values.shape == (3,) and ((0 <= values) & (values <= 1)).all()
    with pytest.raises(ValueError, match="needs reward.detector"):
        GenevalImageReward(RewardConfig(name="geneval-image"))
