"""``model.device`` reaches every module and every tensor of a step.

On the CPU the test device is ``meta``: tensors with shapes and no data. A module left on the
host, a host tensor mixed into a step, or a read-back inside the denoising loop (``.item()``,
``.cpu()``, ``float(tensor)``) all fail there, so a loop that completes on ``meta`` has none.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from spotlight.config import PROJECT_ROOT, ConfigError, load_config
from spotlight.models.base import build_policy
from spotlight.models.device import DeviceError, resolve_device, tensors_off
from spotlight.models.qwen_image.policy import placement_dtype
from spotlight.rl.noise import SampleKey
from spotlight.rl.sampler import sample, transition_distribution
from spotlight.rl.sde import gaussian_log_prob

TINY = PROJECT_ROOT / "configs" / "qwen-image-tiny.yaml"
META = torch.device("meta")


@pytest.fixture(scope="module")
def meta_policy():
    config = load_config(TINY, {"model.device": "meta"})
    policy = build_policy(config)
    width = policy.transformer.config.joint_attention_dim
    policy.use_prompt_store(lambda prompt: np.ones((len(prompt), width), np.float32))
    return config, policy


def test_the_configured_device_reaches_every_module_and_tensor(meta_policy):
    config, policy = meta_policy
    assert policy.device == META
    assert tensors_off(policy.transformer, META) == []   # the adapter and RoPE tables too
    assert tensors_off(policy.vae, META) == []
    assert tensors_off(policy.text_encoder, META) == []  # placed when it is loaded
    assert any("lora_" in n for n, _ in policy.transformer.named_parameters())
    assert policy.reference().device == META
    text = policy.encode(["a b", "a sign"])
    assert text.embedding.device == META and text.mask.device == META
    assert text.negative[0].device == META and text.negative[1] is None   # no padding: no mask


def test_the_denoising_loop_stays_on_the_device_and_never_reads_it_back(meta_policy):
    config, policy = meta_policy
    keys = [SampleKey(0, 1, seed) for seed in range(3)]
    traj = sample(policy, ["a b", "a b", "c"], keys, config.sampler, mode="sde")
    assert traj.latents.device == META and traj.log_probs.device == META
    assert traj.latents.shape == (3, config.sampler.num_steps + 1, *policy.tokens_shape)
    ode = sample(policy, ["a b"], keys[:1], config.sampler, mode="ode",
                 start_step=1, start_latents=torch.zeros(1, *policy.tokens_shape))
    assert ode.final.device == META


def test_a_training_step_moves_a_stored_trajectory_to_the_device(meta_policy):
    config, policy = meta_policy
    stored = torch.zeros(2, config.sampler.num_steps + 1, *policy.tokens_shape)   # host
    latents = stored.to(META)
    with torch.enable_grad():
        dist = transition_distribution(policy, latents, 1, torch.linspace(1, 0, 5),
                                       policy.encode(["a", "b"]), config.sampler)
        log_prob = gaussian_log_prob(latents[:, 2], dist)
    assert dist.mean.device == META and log_prob.device == META and log_prob.requires_grad


def test_auto_is_the_cpu_without_a_gpu_and_a_missing_gpu_is_named():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(DeviceError, match=r"model.device = 'cuda', but this worker has no "
                                          r"CUDA device"):
        resolve_device("cuda")
    assert placement_dtype("auto", torch.device("cuda")) is torch.bfloat16
    assert placement_dtype("auto", torch.device("cpu")) is torch.float32
    assert placement_dtype("float32", torch.device("cuda")) is torch.float32


def test_a_device_name_that_is_no_device_is_refused_when_the_config_is_read():
    with pytest.raises(ConfigError, match=r"ModelConfig.device = 'gpu' is not a device; "
                                          r"expected 'auto', 'cpu', 'cuda' or 'cuda:N'"):
        load_config(TINY, {"model.device": "gpu"})
    assert load_config(TINY, {"model.device": "cuda:1"}).model.device == "cuda:1"
