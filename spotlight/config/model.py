"""The ``model`` section: which registered policy the workers build, and its settings.

The digits policy reads the architecture fields (a tiny transformer it pretrains); the diffusers
policies (``qwen-image``, ``sd3.5``) read their architecture from ``model.weights`` and the
adapter, dtype, size and guidance fields. Field values feed cache keys (the digits base model's),
so a default changes only with a reason (see :mod:`spotlight.models.pretrain`).
"""

from __future__ import annotations

from dataclasses import dataclass

from spotlight.config.base import ConfigError, spec
from spotlight.config.placement import DevicePlacement

# The policies that load their components from model.weights (diffusers' layout).
WEIGHTS_POLICIES = ("qwen-image", "sd3.5")


@dataclass(kw_only=True, frozen=True)
class ModelConfig(DevicePlacement):
    """The policy: a tiny QwenImageTransformer2DModel plus a word-level prompt encoder."""

    policy: str = spec(
        "digits",
        "Registered policy the workers build (spotlight.models.base: "
        "POLICIES); 'digits' is the embedded world's.",
    )
    num_layers: int = spec(4, "Transformer blocks.", range=(1, 64))
    num_attention_heads: int = spec(2, "Attention heads.", range=(1, 64))
    attention_head_dim: int = spec(
        32, "Width of one head; must be divisible by 8 (RoPE axes).", range=(8, 256)
    )
    text_dim: int = spec(
        64, "Prompt-encoder width (the transformer's joint_attention_dim).", range=(8, 4096)
    )
    text_layers: int = spec(2, "Prompt-encoder transformer layers.", range=(0, 12))
    prediction: str = spec(
        "sample",
        "What the transformer outputs: 'sample' (clean canvas, converted to velocity) or "
        "'velocity'.",
        choices=("sample", "velocity"),
    )
    max_prompt_tokens: int = spec(
        24, "Prompt tokens kept after word/digit tokenisation.", range=(4, 256)
    )
    weights: str = spec(
        "",
        "Weights of policy 'qwen-image' or 'sd3.5' in diffusers' layout: a folder, an "
        "object-storage URL, a Hugging Face Hub id (Qwen/Qwen-Image, "
        "stabilityai/stable-diffusion-3.5-medium; @<revision> pins one), or 'tiny' (tiny "
        "random, built offline).",
    )
    lora_rank: int = spec(
        16,
        "LoRA rank on the transformer (policies 'qwen-image', 'sd3.5'); 0 trains every "
        "transformer weight instead.",
        range=(0, 1024),
    )
    lora_alpha: float = spec(
        16.0, "LoRA alpha: the adapter's output is scaled by alpha / rank.", range=(0.0, 4096.0)
    )
    lora_targets: list[str] = spec(
        [
            "to_q",
            "to_k",
            "to_v",
            "to_out.0",
            "add_q_proj",
            "add_k_proj",
            "add_v_proj",
            "to_add_out",
            "img_mlp.net.0.proj",
            "img_mlp.net.2",
            "txt_mlp.net.0.proj",
            "txt_mlp.net.2",
        ],
        "Transformer modules that get a LoRA adapter (names or name suffixes). The default is "
        "Qwen-Image's joint-attention projections and image/text MLPs; policy 'sd3.5' left at "
        "it takes Flow-GRPO's SD3.5 targets instead (the joint-attention projections, "
        "attn.to_q ... attn.to_add_out).",
    )
    dtype: str = spec(
        "auto",
        "Weights dtype (policies 'qwen-image', 'sd3.5'): 'auto' = bfloat16 on GPU, float32 on CPU.",
        choices=("auto", "float32", "bfloat16", "float16"),
    )
    height: int = spec(
        0,
        "Image height (policies 'qwen-image', 'sd3.5'); 0 = world.canvas_height.",
        range=(0, 4096),
    )
    width: int = spec(
        0, "Image width (policies 'qwen-image', 'sd3.5'); 0 = world.canvas_width.", range=(0, 4096)
    )
    true_cfg: float = spec(
        1.0,
        "Classifier-free guidance scale (policies 'qwen-image', 'sd3.5'): above 1 every step "
        "runs the transformer twice, on the prompt and on model.negative_prompt, and combines "
        "them as the model's diffusers pipeline does.",
        range=(1.0, 20.0),
    )
    negative_prompt: str = spec(" ", "The negative prompt of true CFG (model.true_cfg > 1).")
    gradient_checkpointing: bool = spec(
        False,
        "Recompute each transformer block in the backward pass (policies 'qwen-image', "
        "'sd3.5'): training keeps only the blocks' inputs, for about one more forward per step.",
    )

    def validate(self) -> None:
        if self.policy in WEIGHTS_POLICIES and not self.weights:
            raise ConfigError(
                f"model.weights is empty, but model.policy {self.policy!r} loads its components "
                "from it; set a folder, a URL, a Hub id or 'tiny'"
            )
        if self.attention_head_dim % 8:
            raise ConfigError(
                f"ModelConfig.attention_head_dim = {self.attention_head_dim} must be "
                "divisible by 8 (split across three RoPE axes)"
            )
