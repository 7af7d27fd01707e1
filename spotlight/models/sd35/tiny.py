"""Tiny Stable Diffusion 3.5 components in the real file format, built offline.

``build_tiny_components(folder)`` constructs randomly initialised ``SD3Transformer2DModel`` (with
SD3.5's dual attention in its first block and RMS-normed queries and keys), ``AutoencoderKL``
(16 latent channels, SD3.5's scaling and shift factors), two ``CLIPTextModelWithProjection`` and
a ``T5EncoderModel`` from small configs, trains their tokenizers with the ``tokenizers`` library
(byte-level BPE for the CLIPs, unigram for T5, as the real ones are), and saves them all as a
``StableDiffusion3Pipeline`` folder -- ``model_index.json`` and one subfolder per component --
which the stock pipeline's ``from_pretrained`` loads. The policy then loads them through the
same path real weights take. Nothing is downloaded.

    python -m spotlight.models.sd35.tiny OUT_FOLDER

The widths follow SD3.5's wiring: the CLIP hidden states, concatenated, are zero-padded to T5's
width, which is the transformer's ``joint_attention_dim``; the two CLIP projections,
concatenated, are its ``pooled_projection_dim``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from spotlight.models.diffusers_parts import tiny_corpus

CLIP_WIDTHS = (8, 16)  # CLIP-L's and OpenCLIP-G's hidden and projection widths (768, 1280 real)
T5_WIDTH = 32  # T5's d_model = the transformer's joint_attention_dim (4096 real)
CLIP_TOKENS = 77  # CLIP's context: the pipeline pads each CLIP prompt to it
Z_DIM = 16  # latent channels, as the real VAE
SHIFT = 3.0  # SD3.5's FlowMatchEulerDiscreteScheduler shift
TINY_SEED = 0
# CLIP's own text split: special tokens, English contractions, letters, single digits, the rest.
CLIP_SPLIT = (
    r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|"""
    r"""[^\s\p{L}\p{N}]+"""
)


def build_clip_tokenizer(corpus: list[str]):
    """A byte-level BPE ``CLIPTokenizer`` learnt on ``corpus`` with CLIP's normaliser and word
    split; every byte, word-final or not, is in its vocabulary (nothing is unknown), and the
    special tokens take the last ids, as in the real vocabulary."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import CLIPTokenizer

    tok = Tokenizer(models.BPE(continuing_subword_prefix="", end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(CLIP_SPLIT), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=1024,
            initial_alphabet=alphabet,
            end_of_word_suffix="</w>",
            show_progress=False,
        ),
    )
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    for symbol in [c + "</w>" for c in alphabet] + ["<|startoftext|>", "<|endoftext|>"]:
        vocab.setdefault(symbol, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=CLIP_TOKENS)


def build_t5_tokenizer(corpus: list[str]):
    """A unigram ``T5TokenizerFast`` learnt on ``corpus``: <pad> 0, </s> 1, <unk> 2, as T5's."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import T5TokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(prepend_scheme="always")]
    )
    trainer = trainers.UnigramTrainer(
        vocab_size=1024,
        special_tokens=["<pad>", "</s>", "<unk>"],
        unk_token="<unk>",
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    vocab = [tuple(piece) for piece in json.loads(tok.to_str())["model"]["vocab"]]
    return T5TokenizerFast(vocab=vocab, extra_ids=0, model_max_length=512)


def build_clip_encoder(tokenizer, width: int):
    """A two-layer CLIP text encoder with a projection (the pipeline reads its second-to-last
    hidden state and its projected pooled output)."""
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=width,
        intermediate_size=2 * width,
        projection_dim=width,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=CLIP_TOKENS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,  # pooled at the first end-of-text token
        pad_token_id=tokenizer.pad_token_id,
    )
    return CLIPTextModelWithProjection(config).eval()


def build_t5_encoder(tokenizer):
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=T5_WIDTH,
        d_kv=8,
        d_ff=2 * T5_WIDTH,
        num_layers=1,
        num_heads=4,
        feed_forward_proj="gated-gelu",  # T5 v1.1, as SD3.5's T5-XXL
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    return T5EncoderModel(config).eval()


def build_transformer():
    """Two joint blocks, the first with SD3.5's second (image-only) attention."""
    from diffusers import SD3Transformer2DModel

    heads, head_dim = 2, 8
    return SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=Z_DIM,
        out_channels=Z_DIM,
        num_layers=2,
        attention_head_dim=head_dim,
        num_attention_heads=heads,
        joint_attention_dim=T5_WIDTH,
        caption_projection_dim=heads * head_dim,
        pooled_projection_dim=sum(CLIP_WIDTHS),
        pos_embed_max_size=32,
        dual_attention_layers=(0,),
        qk_norm="rms_norm",
    )


def build_vae():
    """One spatial downsampling (the real VAE has three): 32x32 pixels -> 16x16 latents."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(16, 32),
        layers_per_block=1,
        latent_channels=Z_DIM,
        norm_num_groups=8,
        sample_size=32,
        scaling_factor=1.5305,  # SD3.5's: latents are (z - shift) x scale
        shift_factor=0.0609,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


def build_tiny_components(folder: str | Path) -> Path:
    """Write tiny random SD3.5 components to ``folder`` as ``StableDiffusion3Pipeline`` saves
    them (its ``model_index.json`` included)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a bar per component saved otherwise
    folder = Path(folder)
    torch.manual_seed(TINY_SEED)
    corpus = tiny_corpus()
    clip = [build_clip_tokenizer(corpus) for _ in CLIP_WIDTHS]
    t5 = build_t5_tokenizer(corpus)
    pipe = StableDiffusion3Pipeline(
        transformer=build_transformer(),
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=SHIFT),
        vae=build_vae(),
        text_encoder=build_clip_encoder(clip[0], CLIP_WIDTHS[0]),
        tokenizer=clip[0],
        text_encoder_2=build_clip_encoder(clip[1], CLIP_WIDTHS[1]),
        tokenizer_2=clip[1],
        text_encoder_3=build_t5_encoder(t5),
        tokenizer_3=t5,
    )
    pipe.save_pretrained(folder)
    return folder


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m spotlight.models.sd35.tiny OUT_FOLDER")
    print(build_tiny_components(sys.argv[1]))
