"""The Qwen-Image policy on tiny, randomly initialised components in the real file format,
loaded through the path real weights take."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from spotlight.config import ModelConfig
from spotlight.models.base import Policy
from spotlight.models.qwen_image.policy import QwenImagePolicy
from spotlight.models.qwen_image.tiny import PROMPT_TEMPLATE, TEMPLATE_DROP, build_tiny_components
from spotlight.models.qwen_image.weights import (
    WeightsError,
    load_components,
    local_folder,
    resolve_dtype,
)
from tests.models.diffusers_checks import (
    check_only_the_adapter_trains,
    check_stored_prompts_spare_the_text_encoders,
    moved_adapter_state,
    save_adapter,
)

PROMPTS = ['a sign that says "59"', "a poster"]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return build_tiny_components(tmp_path_factory.mktemp("qwen") / "tiny")


def _policy(folder, **model) -> QwenImagePolicy:
    config = ModelConfig(policy="qwen-image", weights=str(folder), **model)
    return QwenImagePolicy(load_components(str(folder), torch.float32), config, 16, 32)


def _velocity(policy, seed=0):
    x = torch.randn(2, *policy.tokens_shape, generator=torch.Generator().manual_seed(seed))
    return x, policy.velocity(x, torch.tensor([0.6]), policy.encode(PROMPTS))


def test_the_pipeline_and_the_tiny_tokenizer_agree_on_the_template(tiny_folder):
    from diffusers import QwenImagePipeline
    from transformers import AutoTokenizer

    source = QwenImagePipeline.__init__.__code__.co_consts
    assert PROMPT_TEMPLATE in source and TEMPLATE_DROP in source
    tokenizer = AutoTokenizer.from_pretrained(tiny_folder / "tokenizer")
    prefix = PROMPT_TEMPLATE.split("{}")[0]
    assert len(tokenizer(prefix).input_ids) == TEMPLATE_DROP


def test_saved_components_load_back_to_identical_outputs(tiny_folder, tmp_path):
    policy = _policy(tiny_folder, lora_rank=0)
    assert isinstance(policy, Policy)
    x, v = _velocity(policy)
    again = _policy(tiny_folder, lora_rank=0)
    assert torch.equal(again.velocity(x, torch.tensor([0.6]), again.encode(PROMPTS)), v)
    np.testing.assert_array_equal(policy.decode(x), again.decode(x))
    pixels = policy.decode(x)
    assert pixels.shape == (2, 3, 16, 32) and pixels.dtype == np.float32
    assert 0.0 <= pixels.min() and pixels.max() <= 1.0


def test_prompt_embeddings_match_the_stock_pipeline(tiny_folder):
    from diffusers import QwenImagePipeline

    policy = _policy(tiny_folder)
    pipe = QwenImagePipeline(None, policy.vae, policy.text_encoder, policy.tokenizer,
                             policy.transformer)
    embeds, mask = pipe.encode_prompt(PROMPTS, device="cpu")
    mine = policy.encode(PROMPTS)
    assert torch.equal(mine.mask, mask.long()) and mine.negative is None
    torch.testing.assert_close(mine.embedding, embeds.float())


def test_denoising_with_true_cfg_and_the_model_schedule_matches_the_stock_pipeline(tiny_folder):
    """An ODE pass of our sampler (sampler.schedule 'model', true CFG 4 with the negative prompt
    ' ') lands on the latents QwenImagePipeline produces from the same start."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    from spotlight.config.sections import SamplerConfig
    from spotlight.rl.noise import SampleKey
    from spotlight.rl.sampler import sample

    policy = _policy(tiny_folder, lora_rank=0, true_cfg=4.0)
    start = torch.randn(1, *policy.tokens_shape, generator=torch.Generator().manual_seed(3))
    pipe = QwenImagePipeline(FlowMatchEulerDiscreteScheduler.from_pretrained(
        tiny_folder / "scheduler"), policy.vae, policy.text_encoder, policy.tokenizer,
        policy.transformer)
    theirs = pipe(prompt=PROMPTS[0], negative_prompt=" ", true_cfg_scale=4.0, height=16,
                  width=32, num_inference_steps=3, latents=start.clone(),
                  output_type="latent").images
    config = SamplerConfig(num_steps=3, schedule="model")
    mine = sample(policy, PROMPTS[:1], [SampleKey(0, 0, 0)], config, mode="ode",
                  start_latents=start)
    torch.testing.assert_close(mine.sigmas, pipe.scheduler.sigmas.float())
    assert mine.sigmas[1] != torch.linspace(1, 0, 4)[1]   # the dynamic shift moved it
    torch.testing.assert_close(mine.final, theirs.float(), rtol=1e-4, atol=1e-5)
    plain = sample(_policy(tiny_folder, lora_rank=0), PROMPTS[:1], [SampleKey(0, 0, 0)],
                   config, mode="ode", start_latents=start)
    assert not torch.allclose(plain.final, mine.final)   # guidance changed the result


def test_stored_prompt_embeddings_spare_the_text_encoder(tiny_folder):
    reader = QwenImagePolicy(load_components(str(tiny_folder), torch.float32, text_encoder=False),
                             ModelConfig(policy="qwen-image", weights=str(tiny_folder)), 16, 32)
    x = torch.randn(2, *reader.tokens_shape, generator=torch.Generator().manual_seed(0))
    check_stored_prompts_spare_the_text_encoders(_policy(tiny_folder), reader, x,
                                                 torch.tensor([0.6]), PROMPTS)


def test_lora_trains_only_the_adapter_and_the_reference_stays_the_base(tiny_folder):
    policy = _policy(tiny_folder, lora_rank=4, lora_alpha=4.0)
    x = torch.randn(2, *policy.tokens_shape, generator=torch.Generator().manual_seed(0))
    check_only_the_adapter_trains(policy, x, torch.tensor([0.6]), policy.encode(PROMPTS))


def test_the_checkpoint_is_the_adapter_and_loads_into_a_stock_pipeline(tiny_folder, tmp_path):
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    policy = _policy(tiny_folder, lora_rank=4)
    x = torch.randn(2, *policy.tokens_shape, generator=torch.Generator().manual_seed(0))
    state = moved_adapter_state(policy, _policy(tiny_folder, lora_rank=4), x,
                                torch.tensor([0.6]), PROMPTS)
    weight_name = save_adapter(state, tmp_path)
    c = load_components(str(tiny_folder), torch.float32)
    pipe = QwenImagePipeline(FlowMatchEulerDiscreteScheduler.from_pretrained(
        tiny_folder / "scheduler"), c.vae, c.text_encoder, c.tokenizer, c.transformer)

    def image():
        return pipe(prompt=PROMPTS[0], height=16, width=32, num_inference_steps=2,
                    output_type="np", generator=torch.Generator().manual_seed(0)).images

    before = image()
    pipe.load_lora_weights(str(tmp_path), weight_name=weight_name)
    assert np.abs(image() - before).max() > 1e-3


def test_a_lora_state_of_another_shape_is_refused(tiny_folder):
    state = _policy(tiny_folder, lora_rank=4).state_dict()
    with pytest.raises(KeyError, match="lora_rank"):
        _policy(tiny_folder, lora_rank=4, lora_targets=["to_q"]).load_state_dict(state)


def test_a_lora_target_that_matches_nothing_is_named(tiny_folder):
    with pytest.raises(ValueError, match=r"\['to_qq'\] match no module"):
        _policy(tiny_folder, lora_targets=["to_q", "to_qq"])


def test_a_missing_component_is_named_with_what_was_expected(tiny_folder, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_folder, broken)
    shutil.rmtree(broken / "vae")
    with pytest.raises(WeightsError, match=r"lacks \['vae/config.json'\]"):
        local_folder(str(broken))
    with pytest.raises(WeightsError, match="no such folder"):
        local_folder(str(tmp_path / "nowhere"))


def test_a_resolution_the_vae_cannot_pack_is_refused(tiny_folder):
    config = ModelConfig(policy="qwen-image", weights=str(tiny_folder))
    with pytest.raises(ValueError, match="divisible by 4"):
        QwenImagePolicy(load_components(str(tiny_folder), torch.float32), config, 18, 32)


@pytest.mark.skipif(torch.cuda.is_available(), reason="float16 runs on a GPU")
def test_a_dtype_the_device_cannot_run_is_refused():
    with pytest.raises(WeightsError, match="float16.*needs a GPU"):
        resolve_dtype("float16")
    assert resolve_dtype("auto") is torch.float32


def test_gradient_checkpointing_gives_the_same_adapter_gradients(tiny_folder):
    grads = []
    for checkpointing in (False, True):
        policy = _policy(tiny_folder, lora_rank=4, gradient_checkpointing=checkpointing)
        with torch.no_grad():
            for p in policy.trainable_parameters():
                p.copy_(torch.linspace(-0.1, 0.1, p.numel()).view_as(p))
        policy.train()
        x, v = _velocity(policy)
        v.pow(2).mean().backward()
        # (the last block's text-stream MLP feeds nothing: its adapter gets no gradient)
        grads.append(torch.cat([p.grad.flatten() for p in policy.trainable_parameters()
                                if p.grad is not None]))
    assert policy.transformer.gradient_checkpointing
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1])


def test_an_sp_degree_the_weights_cannot_split_is_refused_before_any_worker(tiny_folder):
    from spotlight.config import ConfigError, RunConfig
    from spotlight.models.base import check_policy

    config = RunConfig().with_values({
        "model.policy": "qwen-image", "model.weights": str(tiny_folder),
        "world.canvas_height": 16, "world.canvas_width": 32, "cluster.gpu_workers": 4,
        "placement.rollout": ["gpu"], "mode": "vanilla"})
    check_policy(config.with_values({"parallel.size_classes": ["16x32:2"]}))   # 2 heads: fine
    with pytest.raises(ConfigError, match="sp_degree 4 does not divide the model's 2 attention"):
        check_policy(config.with_values({"parallel.size_classes": ["16x32:4"]}))
