"""Ulysses sequence parallelism for ``QwenImageTransformer2DModel``, re-configurable per group.

A request's image tokens are split into contiguous shards, one per member of a group; every
per-token layer (patch embedding, modulation, MLPs, norms, output projection) runs on the shard
alone. Only attention needs the whole sequence: around it, an all-to-all swaps the sharding of
the image queries, keys and values from *tokens* to *heads* (each member then holds every
token of ``heads / degree`` heads), the joint text+image attention runs on those heads, and a
second all-to-all swaps back. The text stream is short and replicated on every member: each
takes its heads' slice of the text queries, keys and values, and the text output's heads are
gathered afterwards.

Unlike diffusers' own context parallelism (which needs an accelerator and can be enabled once
per model), :func:`enable` only swaps attention processors, so the same model object serves
one group, then another after a member is lost, then none (:func:`disable`) -- what an elastic
group needs. The communication is ``torch.distributed`` (the executors use NCCL on CUDA and
gloo on the CPU: :func:`spotlight.models.device.collective_backend`); each collective is an
autograd function with its exact adjoint, so gradients flow too: with a loss summed over the
members' shards, the members' parameter gradients sum to the single-process gradient
(:func:`sum_gradients`).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist
from torch.nn import functional as F


class SequenceParallelError(ValueError):
    """An SP degree the model or the request cannot be split by."""


def check_degree(degree: int, *, heads: int | None = None, image_tokens: int | None = None,
                 devices: int | None = None) -> None:
    """Raise a clear error unless ``degree`` divides the attention ``heads`` and the
    ``image_tokens`` and fits the ``devices`` there are (each checked when given)."""
    if degree < 1:
        raise SequenceParallelError(f"sp_degree {degree} must be at least 1")
    if heads is not None and heads % degree:
        raise SequenceParallelError(
            f"sp_degree {degree} does not divide the model's {heads} attention heads: Ulysses "
            "gives each member heads/degree heads; choose a divisor of "
            f"{heads} ({', '.join(str(d) for d in range(1, heads + 1) if heads % d == 0)})")
    if image_tokens is not None and image_tokens % degree:
        raise SequenceParallelError(
            f"sp_degree {degree} does not divide the request's {image_tokens} image tokens: "
            "each member holds an equal shard; choose a resolution or a degree that divide")
    if devices is not None and degree > devices:
        raise SequenceParallelError(f"sp_degree {degree} needs {degree} devices; only {devices} "
                                    "are configured")


def shard_bounds(tokens: int, degree: int, rank: int) -> tuple[int, int]:
    """The contiguous token range ``[start, stop)`` that member ``rank`` holds."""
    size = tokens // degree
    return rank * size, (rank + 1) * size


# --- collectives with their adjoints -------------------------------------------------------
def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    """Split ``x`` along ``scatter_dim`` into one piece per member, send piece j to member j,
    and concatenate what arrives along ``gather_dim`` in member order."""
    world = dist.get_world_size(group)
    pieces = [p.contiguous() for p in x.chunk(world, dim=scatter_dim)]
    received = [torch.empty_like(pieces[0]) for _ in range(world)]
    dist.all_to_all(received, pieces, group=group)
    return torch.cat(received, dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, gather_dim, scatter_dim, ctx.group), None, None, None


class _AllGather(torch.autograd.Function):
    """Concatenate every member's ``x`` along ``dim``; the adjoint sums the gradients of each
    member's piece over the members that used it."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, x.contiguous(), group=group)
        return torch.cat(pieces, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        world = dist.get_world_size(ctx.group)
        pieces = [p.contiguous() for p in grad.chunk(world, dim=ctx.dim)]
        mine = torch.empty_like(pieces[0])
        dist.reduce_scatter(mine, pieces, group=ctx.group)
        return mine, None, None


def seq_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    """(B, tokens/P, H, D) on each member -> (B, tokens, H/P, D)."""
    return _AllToAll.apply(x, 2, 1, group)


def heads_to_seq(x: torch.Tensor, group) -> torch.Tensor:
    """(B, tokens, H/P, D) on each member -> (B, tokens/P, H, D)."""
    return _AllToAll.apply(x, 1, 2, group)


def gather(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    return _AllGather.apply(x, dim, group)


# --- the attention processor ---------------------------------------------------------------
@dataclass
class UlyssesAttnProcessor:
    """Joint text+image attention of one member of an SP group (see the module docstring).
    Computes what ``QwenDoubleStreamAttnProcessor2_0`` computes, on a shard."""

    group: object
    rank: int
    degree: int

    def __call__(self, attn, hidden_states, encoder_hidden_states=None,
                 encoder_hidden_states_mask=None, attention_mask=None, image_rotary_emb=None):
        if encoder_hidden_states is None or attention_mask is not None:
            raise ValueError("UlyssesAttnProcessor takes the text stream and no external mask, "
                             "like QwenDoubleStreamAttnProcessor2_0")
        head_dim = attn.inner_dim // attn.heads
        img = [proj(hidden_states).unflatten(-1, (-1, head_dim))
               for proj in (attn.to_q, attn.to_k, attn.to_v)]
        txt = [proj(encoder_hidden_states).unflatten(-1, (-1, head_dim))
               for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)]
        img, txt = _normed(attn, img, txt)
        if image_rotary_emb is not None:
            img_freqs, txt_freqs = image_rotary_emb
            start, stop = shard_bounds(img_freqs.shape[0], self.degree, self.rank)
            img[:2] = [_rotate(x, img_freqs[start:stop]) for x in img[:2]]
            txt[:2] = [_rotate(x, txt_freqs) for x in txt[:2]]
        heads = img[0].shape[2] // self.degree
        mine = slice(self.rank * heads, (self.rank + 1) * heads)
        img = [seq_to_heads(x, self.group) for x in img]          # every token, my heads
        txt = [x[:, :, mine] for x in txt]
        joint = [torch.cat([t, i], dim=1) for t, i in zip(txt, img)]
        mask = None
        if encoder_hidden_states_mask is not None:
            ones = torch.ones(joint[0].shape[0], img[0].shape[1], dtype=torch.bool,
                              device=joint[0].device)
            mask = torch.cat([encoder_hidden_states_mask.bool(), ones], dim=1)[:, None, None, :]
        out = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in joint),
                                             attn_mask=mask).transpose(1, 2)
        seq_txt = txt[0].shape[1]
        txt_out = gather(out[:, :seq_txt], 2, self.group).flatten(2, 3)   # all heads
        img_out = heads_to_seq(out[:, seq_txt:].contiguous(), self.group).flatten(2, 3)
        img_out = attn.to_out[0](img_out.to(joint[0].dtype).contiguous())
        if len(attn.to_out) > 1:
            img_out = attn.to_out[1](img_out)
        return img_out, attn.to_add_out(txt_out.to(joint[0].dtype).contiguous())


def _normed(attn, img: list, txt: list) -> tuple[list, list]:
    for i, norm in ((0, attn.norm_q), (1, attn.norm_k)):
        if norm is not None:
            img[i] = norm(img[i])
    for i, norm in ((0, attn.norm_added_q), (1, attn.norm_added_k)):
        if norm is not None:
            txt[i] = norm(txt[i])
    return img, txt


def _rotate(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotary embedding with complex frequencies (what diffusers' ``apply_rotary_emb_qwen``
    does with ``use_real=False``)."""
    rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(rotated * freqs.unsqueeze(1)).flatten(3).type_as(x)


# --- the model -----------------------------------------------------------------------------
def enable(transformer, group) -> None:
    """Let ``transformer`` run as this process's member of ``group`` (replacing any earlier
    group): every attention gets a :class:`UlyssesAttnProcessor`."""
    degree, rank = dist.get_world_size(group), dist.get_rank(group)
    check_degree(degree, heads=transformer.config.num_attention_heads)
    transformer.set_attn_processor(UlyssesAttnProcessor(group, rank, degree))


def disable(transformer) -> None:
    """Back to single-process attention."""
    from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0

    transformer.set_attn_processor(QwenDoubleStreamAttnProcessor2_0())


def shard(hidden_states: torch.Tensor, group) -> torch.Tensor:
    """This member's shard of packed image tokens (B, tokens, C)."""
    degree, rank = dist.get_world_size(group), dist.get_rank(group)
    check_degree(degree, image_tokens=hidden_states.shape[1])
    start, stop = shard_bounds(hidden_states.shape[1], degree, rank)
    return hidden_states[:, start:stop]


def forward_shard(transformer, group, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
    """This member's shard of the transformer's output (``enable`` first). For training: a
    loss summed over the members' shards is the whole sequence's loss."""
    return transformer(hidden_states=shard(hidden_states, group), return_dict=False,
                       **kwargs)[0]


@torch.no_grad()
def forward(transformer, group, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
    """The transformer's output for the whole sequence, computed by the group (``enable``
    first) and gathered on every member: for sampling."""
    return gather(forward_shard(transformer, group, hidden_states, **kwargs), 1, group)


@contextmanager
def sequence_parallel(transformer, group) -> Iterator[None]:
    """Within the block, ``transformer`` takes and returns *whole* sequences as before, but
    computes as this process's member of ``group``: its input is cut to the member's shard, its
    output gathered from every member. So code written for one process -- a sampler calling
    ``transformer(hidden_states=...)`` -- runs sequence-parallel unchanged, as long as every
    member runs the same calls in the same order. On exit the model's own attention
    processors are back: other work in the process (training, validation) never sees the
    group."""
    if dist.get_world_size(group) == 1:
        yield
        return
    saved = transformer.attn_processors
    enable(transformer, group)

    def cut(module, args, kwargs):
        return args, {**kwargs, "hidden_states": shard(kwargs["hidden_states"], group)}

    def whole(module, args, kwargs, out):
        if isinstance(out, tuple):
            return (gather(out[0], 1, group), *out[1:])
        out.sample = gather(out.sample, 1, group)
        return out

    hooks = [transformer.register_forward_pre_hook(cut, with_kwargs=True),
             transformer.register_forward_hook(whole, with_kwargs=True)]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
        transformer.set_attn_processor(saved)


def sum_gradients(parameters, group) -> None:
    """Sum each parameter's gradient over the group (each member holds its shard's part)."""
    for p in parameters:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
