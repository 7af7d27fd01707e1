"""The SD3.5 policy on tiny, randomly initialised components in the real file format: the stock
``StableDiffusion3Pipeline`` loads the folder, and the policy's prompt embeddings, denoising and
adapter agree with it; its checks name what is wrong before any worker starts; the published
SD3.5-Medium configuration is sized on the meta device."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from spotlight.config import PROJECT_ROOT, ConfigError, ModelConfig, RunConfig, load_config
from spotlight.models.base import Policy, check_policy, model_size
from spotlight.models.diffusers_parts import WeightsError, resolve_dtype
from spotlight.models.sd35.policy import (
    LORA_TARGETS,
    SD35Policy,
    pack_prompt,
    to_rows,
    to_spatial,
    unpack_prompt,
)
from spotlight.models.sd35.weights import load_components, local_folder
from tests.models.diffusers_checks import (
    check_only_the_adapter_trains,
    check_stored_prompts_spare_the_text_encoders,
    moved_adapter_state,
    save_adapter,
)

PROMPTS = ['a sign that says "59"', "a poster"]
SIGMA = torch.tensor([0.6])


@pytest.fixture(scope="module")
def tiny_folder():
    return local_folder("tiny")  # built once into the session's private cache


def _policy(folder, height=16, width=32, **model) -> SD35Policy:
    config = ModelConfig(policy="sd3.5", weights=str(folder), **model)
    return SD35Policy(load_components(str(folder), torch.float32), config, height, width)


def _pipeline(folder):
    from diffusers import StableDiffusion3Pipeline

    pipe = StableDiffusion3Pipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def stock_output(pipe, output_type="np", height=32, width=32):
    """Two steps of the stock pipeline from a fixed seed, with its default guidance."""
    generator = torch.Generator().manual_seed(0)
    return pipe(PROMPTS[0], height=height, width=width, num_inference_steps=2,
                output_type=output_type, generator=generator).images  # fmt: skip


def _velocity(policy, seed=0):
    x = torch.randn(2, *policy.tokens_shape, generator=torch.Generator().manual_seed(seed))
    return x, policy.velocity(x, SIGMA, policy.encode(PROMPTS))


def test_the_stock_pipeline_loads_the_tiny_folder_and_denoises_with_it(tiny_folder):
    pipe = _pipeline(tiny_folder)
    transformer = pipe.transformer.config
    assert list(transformer.dual_attention_layers) == [0] and transformer.qk_norm == "rms_norm"
    assert transformer.in_channels == pipe.vae.config.latent_channels == 16
    assert pipe.scheduler.config.shift == 3.0
    images = stock_output(pipe)
    assert images.shape == (1, 32, 32, 3) and np.isfinite(images).all()
    assert images.std() > 0  # the random weights draw something, not a constant


def test_prompt_embeddings_match_the_stock_pipeline(tiny_folder):
    pipe = _pipeline(tiny_folder)
    embeds, _, pooled, _ = pipe.encode_prompt(
        PROMPTS, None, None, device="cpu", do_classifier_free_guidance=False
    )
    mine = _policy(tiny_folder).encode(PROMPTS)
    assert embeds.shape[1] == 77 + 256 and mine.negative is None
    torch.testing.assert_close(mine.embedding, embeds.float())
    torch.testing.assert_close(mine.pooled, pooled.float())


def test_a_prompt_packs_into_one_array_and_back():
    rng = np.random.default_rng(0)
    for width, pooled_dim in ((32, 24), (4, 10)):  # the pooled vector in one row, or three
        embedding = rng.standard_normal((5, width)).astype(np.float32)
        pooled = rng.standard_normal(pooled_dim).astype(np.float32)
        packed = pack_prompt(embedding, pooled)
        assert packed.shape == (5 + -(-pooled_dim // width), width)
        back, back_pooled = unpack_prompt(torch.from_numpy(packed), pooled_dim)
        np.testing.assert_array_equal(back.numpy(), embedding)
        np.testing.assert_array_equal(back_pooled.numpy(), pooled)


def test_latents_travel_as_rows_of_channels():
    x = torch.arange(2 * 16 * 3 * 4, dtype=torch.float32).view(2, 16, 3, 4)
    rows = to_rows(x)
    assert rows.shape == (2, 12, 16) and torch.equal(rows[1, 5], x[1, :, 1, 1])
    assert torch.equal(to_spatial(rows, (3, 4)), x)


def test_velocity_shape_dtype_and_components_that_load_back_identical(tiny_folder):
    policy = _policy(tiny_folder, lora_rank=0)
    assert isinstance(policy, Policy) and policy.tokens_shape == (8 * 16, 16)
    x, v = _velocity(policy)
    assert v.shape == x.shape and v.dtype == torch.float32 and v.abs().sum() > 0
    again = _policy(tiny_folder, lora_rank=0)
    assert torch.equal(again.velocity(x, SIGMA, again.encode(PROMPTS)), v)
    pixels = policy.decode(x)
    assert pixels.shape == (2, 3, 16, 32) and pixels.dtype == np.float32
    assert 0.0 <= pixels.min() and pixels.max() <= 1.0
    np.testing.assert_array_equal(pixels, again.decode(x))


def test_denoising_with_cfg_and_the_model_schedule_matches_the_stock_pipeline(tiny_folder):
    """An ODE pass of our sampler (sampler.schedule 'model', CFG 4.5 on the negative prompt "")
    lands on the latents StableDiffusion3Pipeline produces from the same start, and its decode
    on the pipeline's image."""
    from spotlight.config.sections import SamplerConfig
    from spotlight.rl.noise import SampleKey
    from spotlight.rl.sampler import sample

    policy = _policy(tiny_folder, 32, 32, lora_rank=0, true_cfg=4.5, negative_prompt="")
    start = torch.randn(1, *policy.tokens_shape, generator=torch.Generator().manual_seed(3))
    pipe = _pipeline(tiny_folder)
    run = dict(
        prompt=PROMPTS[0],
        negative_prompt="",
        guidance_scale=4.5,
        height=32,
        width=32,
        num_inference_steps=3,
        latents=to_spatial(start, policy.latent_hw).clone(),
    )
    theirs = pipe(**run, output_type="latent").images
    config = SamplerConfig(num_steps=3, schedule="model")
    mine = sample(
        policy, PROMPTS[:1], [SampleKey(0, 0, 0)], config, mode="ode", start_latents=start
    )
    torch.testing.assert_close(mine.sigmas, pipe.scheduler.sigmas.float())
    assert mine.sigmas[1] > torch.linspace(1, 0, 4)[1]  # SD3.5's shift 3 moved it
    torch.testing.assert_close(
        to_spatial(mine.final, policy.latent_hw), theirs.float(), rtol=1e-4, atol=1e-5
    )
    image = pipe(**run, output_type="np").images
    np.testing.assert_allclose(policy.decode(mine.final)[0].transpose(1, 2, 0), image[0], atol=1e-4)
    plain = sample(
        _policy(tiny_folder, 32, 32, lora_rank=0),
        PROMPTS[:1],
        [SampleKey(0, 0, 0)],
        config,
        mode="ode",
        start_latents=start,
    )
    assert not torch.allclose(plain.final, mine.final)  # guidance changed the result


def test_stored_prompt_embeddings_spare_the_text_encoders(tiny_folder):
    config = ModelConfig(policy="sd3.5", weights=str(tiny_folder))
    components = load_components(str(tiny_folder), torch.float32, text_encoders=False)
    reader = SD35Policy(components, config, 16, 32)
    x = torch.randn(2, *reader.tokens_shape, generator=torch.Generator().manual_seed(0))
    check_stored_prompts_spare_the_text_encoders(_policy(tiny_folder), reader, x, SIGMA, PROMPTS)


def test_lora_trains_only_the_adapter_and_the_reference_stays_the_base(tiny_folder):
    policy = _policy(tiny_folder, lora_rank=4, lora_alpha=4.0)
    # the config's default targets are Qwen-Image's; SD3.5 takes its own (Flow-GRPO's)
    adapted = {n.split(".lora_")[0] for n, _ in policy.transformer.named_parameters()
               if ".lora_" in n}  # fmt: skip
    assert {a.split(".", 2)[2] for a in adapted} == set(LORA_TARGETS)
    x, _ = _velocity(policy)
    check_only_the_adapter_trains(policy, x, SIGMA, policy.encode(PROMPTS))


def test_the_adapter_is_the_checkpoint_and_loads_into_a_stock_pipeline(tiny_folder, tmp_path):
    policy = _policy(tiny_folder, lora_rank=4)
    x, _ = _velocity(policy)
    state = moved_adapter_state(policy, _policy(tiny_folder, lora_rank=4), x, SIGMA, PROMPTS)
    pipe = _pipeline(tiny_folder)
    before = stock_output(pipe)
    pipe.load_lora_weights(str(tmp_path), weight_name=save_adapter(state, tmp_path))
    assert np.abs(stock_output(pipe) - before).max() > 1e-3


def test_a_lora_state_of_another_shape_is_refused(tiny_folder):
    state = _policy(tiny_folder, lora_rank=4).state_dict()
    with pytest.raises(KeyError, match="lora_rank"):
        _policy(tiny_folder, lora_rank=4, lora_targets=["attn.to_q"]).load_state_dict(state)


def _run_config(folder, **values) -> RunConfig:
    return RunConfig().with_values(
        {
            "model.policy": "sd3.5",
            "model.weights": str(folder),
            "world.canvas_height": 16,
            "world.canvas_width": 32,
            **values,
        }
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"world.canvas_height": 18},
            r"18x32 cannot be packed: SD3.5 needs height and width "
            r"divisible by 4 \(VAE downsampling 2 x 2x2 patches\)",
        ),
        ({"model.height": 144, "model.width": 144}, "at most 32 patches a side, so 128 pixels"),
        (
            {"model.lora_targets": ["attn.to_q", "img_mlp.net.2"]},
            r"\['img_mlp.net.2'\] match no module of the transformer; .* 'attn.to_q'",
        ),
    ],
)
def test_bad_model_input_is_named_before_any_worker_starts(tiny_folder, change, message):
    check_policy(_run_config(tiny_folder))  # the tiny config itself passes
    with pytest.raises(ValueError, match=message):
        check_policy(_run_config(tiny_folder, **change))


def test_a_config_without_weights_is_refused():
    with pytest.raises(ConfigError, match="model.weights is empty, but model.policy 'sd3.5'"):
        ModelConfig(policy="sd3.5")


def test_a_missing_component_is_named_with_what_was_expected(tiny_folder, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_folder, broken)
    shutil.rmtree(broken / "text_encoder_3")
    with pytest.raises(
        WeightsError,
        match=r"lacks \['text_encoder_3/config.json'\]; a Stable "
        r"Diffusion 3.5 weights folder holds",
    ):
        check_policy(_run_config(broken))
    with pytest.raises(WeightsError, match="no such folder; expected a Stable Diffusion 3.5"):
        local_folder(str(tmp_path / "nowhere"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="float16 runs on a GPU")
def test_a_dtype_the_device_cannot_run_is_refused(tiny_folder):
    with pytest.raises(WeightsError, match="float16.*needs a GPU"):
        check_policy(_run_config(tiny_folder, **{"model.dtype": "float16"}))
    assert resolve_dtype("auto") is torch.float32


def test_sequence_parallel_rollouts_are_refused_for_sd35(tiny_folder):
    config = _run_config(
        tiny_folder,
        **{
            "cluster.gpu_workers": 2,
            "placement.rollout": ["gpu"],
            "parallel.size_classes": ["16x32:2"],
        },
    )
    with pytest.raises(
        ConfigError,
        match="sp_degree 2, but sequence parallelism splits Qwen-Image's attention only",
    ):
        check_policy(config)


def _published_transformer_estimate(c: dict) -> float:
    """SD3.5-Medium's transformer parameters by hand from its config: per joint block the two
    streams' attention projections (4 d² each), MLPs (8 d² each) and modulations (6 d² each);
    a dual-attention block adds its second attention (4 d²) and 3 d² of modulation; the last
    block's text stream has no output projection, no MLP and a 2 d² modulation; plus the
    embedders of the text, pooled text, timestep and patches and the output layers. (The fixed
    sin-cos position table, pos_embed_max_size² x d = 0.23 B, is a buffer, not a parameter:
    it is why the published figure is 2.5 B.)"""
    d, layers, dual = (
        c["num_attention_heads"] * c["attention_head_dim"],
        c["num_layers"],
        len(c["dual_attention_layers"]),
    )
    patch = c["patch_size"] ** 2
    blocks = layers * 36 * d * d + dual * 7 * d * d - (4 + 8 + 4) * d * d
    embedders = (
        c["joint_attention_dim"] * d
        + (c["pooled_projection_dim"] + d) * d
        + (256 + d) * d
        + c["in_channels"] * patch * d
    )
    return blocks + embedders + 2 * d * d + d * patch * c["out_channels"]


def test_the_published_sd35_medium_is_sized_from_its_config():
    from spotlight.models.sd35.sizing import SD35_MEDIUM_TRANSFORMER

    config = load_config(PROJECT_ROOT / "configs" / "sd35-medium-ocr.yaml")
    size = model_size(config)  # a Hub id: the published configs, nothing fetched
    estimate = _published_transformer_estimate(SD35_MEDIUM_TRANSFORMER)
    position_table = SD35_MEDIUM_TRANSFORMER["pos_embed_max_size"] ** 2 * 1536
    assert estimate + position_table == pytest.approx(2.5e9, rel=0.02)  # as published
    assert size.transformer == pytest.approx(estimate, rel=0.02)
    # CLIP-L 124 M + OpenCLIP bigG 695 M + T5-XXL encoder 4.76 B
    assert size.text_encoder == pytest.approx(5.58e9, rel=0.01)
    assert size.hidden == 1536 and size.layers == 24
    assert size.image_tokens == (512 // 16) ** 2 and size.text_tokens == 77 + 256
    # LoRA r32 on 8 projections of 1536 x 1536 in 24 blocks (the last one's text stream has no
    # output projection): r x (in + out) each
    assert size.trainable == 32 * 2 * 1536 * (8 * 24 - 1)
    assert size.weight_bytes == 2  # bfloat16 on the GPU workers it sizes
