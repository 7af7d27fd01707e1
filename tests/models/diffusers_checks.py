"""What every diffusers policy must do (``qwen-image``, ``sd3.5``), checked the same way for
each: prompt embeddings read from a store spare the text encoders; with a LoRA adapter only the
adapter trains and the KL reference stays the base model; the trainable state is the adapter
alone, in diffusers' layout, and a fresh policy loads it back to the same velocities; saved as a
file, it is what a stock pipeline's ``load_lora_weights`` reads."""

from __future__ import annotations

from pathlib import Path

import torch

WEIGHT_NAME = "weights.safetensors"  # a checkpoint's file name in the run store


def check_only_the_adapter_trains(policy, x: torch.Tensor, sigma: torch.Tensor, text) -> None:
    """Three SGD steps move the velocity; the frozen weights and the reference do not move."""
    trainable = policy.trainable_parameters()
    names = {id(p): n for n, p in policy.transformer.named_parameters()}
    assert trainable and all("lora_" in names[id(p)] for p in trainable)
    frozen = {n: p.clone() for n, p in policy.transformer.named_parameters() if "lora_" not in n}
    base = policy.velocity(x, sigma, text)
    reference = policy.reference()
    optimizer = torch.optim.SGD(trainable, lr=0.5)
    for _ in range(3):
        optimizer.zero_grad()
        policy.velocity(x, sigma, text).pow(2).mean().backward()
        optimizer.step()
    assert not torch.allclose(policy.velocity(x, sigma, text), base)
    assert torch.equal(reference.velocity(x, sigma, text), base)
    for n, p in policy.transformer.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n


def moved_adapter_state(policy, fresh, x: torch.Tensor, sigma: torch.Tensor, prompts) -> dict:
    """``policy``'s adapter moved off the identity: its trainable state, keyed
    ``transformer.<module>.lora_*``, which ``fresh`` (a policy of the same config) loads to the
    same velocity."""
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.05)
    state = policy.state_dict()
    assert state and all(k.startswith("transformer.") and ".lora_" in k for k in state)
    fresh.load_state_dict(state)
    expected = policy.velocity(x, sigma, policy.encode(prompts))
    assert torch.equal(fresh.velocity(x, sigma, fresh.encode(prompts)), expected)
    return state


def save_adapter(state: dict, folder: Path) -> str:
    """``state`` as the file a checkpoint holds, in ``folder``; its name, for
    ``load_lora_weights(folder, weight_name=...)``."""
    from safetensors.torch import save_file

    save_file({k: t.contiguous() for k, t in state.items()}, str(folder / WEIGHT_NAME))
    return WEIGHT_NAME


def check_stored_prompts_spare_the_text_encoders(
    writer, reader, x: torch.Tensor, sigma: torch.Tensor, prompts
) -> None:
    """``writer`` saves each prompt's embedding as it computes one; ``reader`` (built without
    text encoders) takes the writer's state, reads them back and gives the same velocity,
    never loading a text encoder."""
    store: dict = {}
    writer.use_prompt_store(store.get, store.__setitem__)
    v = writer.velocity(x, sigma, writer.encode(prompts))
    assert writer.text_encoder_loaded and set(store) == set(prompts)
    reader.load_state_dict(writer.state_dict())
    reader.use_prompt_store(store.get)
    assert torch.equal(reader.velocity(x, sigma, reader.encode(prompts)), v)
    assert not reader.text_encoder_loaded
