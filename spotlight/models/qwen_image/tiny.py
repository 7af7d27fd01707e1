"""Tiny Qwen-Image components in the real file format, built offline.

``build_tiny_components(folder)`` constructs a randomly initialised
``QwenImageTransformer2DModel``, ``AutoencoderKLQwenImage`` and
``Qwen2_5_VLForConditionalGeneration`` from small configs, trains a word-level tokenizer with
the ``tokenizers`` library, writes the ``FlowMatchEulerDiscreteScheduler`` config, and saves
them all with ``save_pretrained`` in the layout of a Qwen-Image weights folder (one subfolder
per component beside ``model_index.json``). The policy then loads them through the same path
real weights take. Nothing is downloaded.

    python -m spotlight.models.qwen_image.tiny OUT_FOLDER

``QwenImagePipeline`` encodes a prompt inside a fixed chat template and drops the template's
first 34 tokens from the text encoder's output; the tokenizer here splits words, punctuation,
single digits and newlines, which makes that prefix exactly 34 tokens too (checked on build).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from spotlight.models.diffusers_parts import tiny_corpus
from spotlight.models.qwen_image.template import PROMPT_TEMPLATE, TEMPLATE_DROP

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
TEXT_HIDDEN = 32          # the text encoder's width = the transformer's joint_attention_dim
Z_DIM = 16                # latent channels, as the real VAE
TINY_SEED = 0


def tokenizer_corpus() -> list[str]:
    """Text the tiny tokenizer learns its vocabulary from: the template and shipped prompts."""
    return [PROMPT_TEMPLATE.format(""), *tiny_corpus()]


def build_tokenizer(corpus: list[str]):
    """A word-level fast tokenizer whose template prefix is :data:`TEMPLATE_DROP` tokens."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r" +"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"\n"), behavior="isolated"),
        pre_tokenizers.Punctuation("isolated"),
        pre_tokenizers.Digits(individual_digits=True)])
    trainer = trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS, vocab_size=8192,
                                        min_frequency=1)
    tok.train_from_iterator(corpus, trainer)
    prefix = PROMPT_TEMPLATE.split("{}")[0]
    if len(tok.encode(prefix).ids) != TEMPLATE_DROP:
        raise RuntimeError(f"the tiny tokenizer splits the prompt template's prefix into "
                           f"{len(tok.encode(prefix).ids)} tokens; QwenImagePipeline drops "
                           f"{TEMPLATE_DROP}")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>",
                                   unk_token="<unk>", eos_token="<|im_end|>",
                                   model_max_length=1024 + TEMPLATE_DROP)


def build_text_encoder(tokenizer):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    vocab_size = len(tokenizer)
    heads, kv_heads = 2, 1
    half_head = TEXT_HIDDEN // heads // 2
    text = dict(vocab_size=vocab_size, hidden_size=TEXT_HIDDEN, intermediate_size=64,
                num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=kv_heads,
                max_position_embeddings=2048, rms_norm_eps=1e-6,
                rope_scaling={"type": "mrope", "rope_type": "default",
                              "mrope_section": [2, (half_head - 2) // 2,
                                                half_head - 2 - (half_head - 2) // 2]})
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                  out_hidden_size=TEXT_HIDDEN, fullatt_block_indexes=[0], patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=112)
    ids = dict(bos_token_id=None, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
               pad_token_id=tokenizer.pad_token_id)
    config = Qwen2_5_VLConfig(text_config={**text, **ids}, vision_config=vision,
                              vocab_size=vocab_size, hidden_size=TEXT_HIDDEN, **ids)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def build_transformer():
    from diffusers import QwenImageTransformer2DModel

    head = 16
    return QwenImageTransformer2DModel(
        patch_size=2, in_channels=Z_DIM * 4, out_channels=Z_DIM, num_layers=1,
        attention_head_dim=head, num_attention_heads=2, joint_attention_dim=TEXT_HIDDEN,
        axes_dims_rope=(4, 6, 6))


def build_vae():
    from diffusers import AutoencoderKLQwenImage

    # One spatial downsampling (the real VAE has three): 32x32 pixels -> 16x16 latents.
    return AutoencoderKLQwenImage(base_dim=16, z_dim=Z_DIM, dim_mult=[1, 2], num_res_blocks=1,
                                  attn_scales=[], temperal_downsample=[False], dropout=0.0,
                                  latents_mean=[0.0] * Z_DIM, latents_std=[1.0] * Z_DIM)


def build_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    # Qwen-Image's scheduler settings: resolution-dependent (dynamic) exponential shift.
    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.5,
        max_shift=0.9, base_image_seq_len=256, max_image_seq_len=8192,
        time_shift_type="exponential")


def build_tiny_components(folder: str | Path) -> Path:
    """Write tiny random Qwen-Image components to ``folder`` (``save_pretrained`` layout)."""
    folder = Path(folder)
    torch.manual_seed(TINY_SEED)
    tokenizer = build_tokenizer(tokenizer_corpus())
    parts = {"tokenizer": tokenizer, "text_encoder": build_text_encoder(tokenizer),
             "transformer": build_transformer(), "vae": build_vae(),
             "scheduler": build_scheduler()}
    for name, part in parts.items():
        part.save_pretrained(folder / name)
    index = {"_class_name": "QwenImagePipeline", "_diffusers_version": _version("diffusers"),
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"],
             "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
             "transformer": ["diffusers", "QwenImageTransformer2DModel"],
             "vae": ["diffusers", "AutoencoderKLQwenImage"]}
    (folder / "model_index.json").write_text(json.dumps(index, indent=2))
    return folder


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m spotlight.models.qwen_image.tiny OUT_FOLDER")
    print(build_tiny_components(sys.argv[1]))
