"""Attention computations shared by several families: causal softmax attention with its decoding cache, one
query's attention as two matmuls, queries' and keys' norm per head, and full precision under autocast."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from .rope import RotaryEmbedding
from .state import KVCache, RecurrentState
from .window import windowed_attention

QK_NORM_EPS = 1e-5  # the model's RMSNorm epsilon (transformer.make_norm)


def rms_per_head(x: torch.Tensor) -> torch.Tensor:
    """x (..., hs) -> x / sqrt(mean(x^2) + eps) over each head's hs channels: the QK-norm (qk_norm). No learned
    gain, as in nanochat: the attention keeps exactly its parameters and checkpoint keys, only its forward changes."""
    return F.rms_norm(x, (x.size(-1),), eps=QK_NORM_EPS)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_size: int,
                     rope: RotaryEmbedding | None, dropout_p: float, cache: KVCache | None = None,
                     window: int | None = None, sinks: torch.Tensor | None = None,
                     qk_norm: bool = False) -> torch.Tensor:
    """q (B, T, Hq*hs), k and v (B, T, Hkv*hs) -> (B, T, Hq*hs): per-head causal softmax attention.

    With a decoding cache ({"k", "v"}: (B, L, Hkv, hs) buffers, see `kv_cache_layout`) the T
    tokens sit at `cache.positions` (T,), increasing: their keys and values are written there and the
    queries attend over the filled prefix 0..cache.length-1, each up to its own position; a prefill of
    positions 0..T-1 attends over its own keys alone, plainly causal. With a `window` or `sinks` (Hq,) see
    window.windowed_attention (the cache is then a ring of the last `window` positions). With `qk_norm` each
    head's queries and keys are RMS-normalised (rms_per_head) before RoPE, as in modded-nanogpt and nanochat,
    so the cache holds normalised keys.
    """
    B, T, _ = q.shape
    positions = None if cache is None else cache.positions
    q = q.view(B, T, -1, head_size).transpose(1, 2)  # (B, Hq, T, hs)
    k = k.view(B, T, -1, head_size)  # (B, T, Hkv, hs), as the cache holds them
    v = v.view(B, T, -1, head_size)
    if qk_norm:
        q, k = rms_per_head(q), rms_per_head(k)
    if rope is not None:
        q, k = rope(q, positions), rope(k.transpose(1, 2), positions).transpose(1, 2)
    if window is not None or sinks is not None:
        y = windowed_attention(q, k, v, window, sinks, dropout_p, cache, single_query_attention)  # (B, Hq, T, hs)
        return y.transpose(1, 2).reshape(B, T, q.size(1) * head_size)
    mask, is_causal = None, True
    if cache is not None:
        cache["k"].index_copy_(1, positions, k.to(cache["k"].dtype))
        cache["v"].index_copy_(1, positions, v.to(cache["v"].dtype))
        length = cache.length
        if length != T:  # not a prefill: the cached keys and values, up to the last written position
            n = cache["k"].size(1) if length is None else length
            k, v = cache["k"][:, :n].to(q.dtype), cache["v"][:, :n].to(q.dtype)  # (B, n, Hkv, hs)
            is_causal = False
            # One new token at the end of the filled prefix attends to all of it: no mask to build.
            if length is None or T > 1:
                mask = torch.arange(n, device=q.device) <= positions[:, None]  # (T, n): up to each own position
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, Hkv, n, hs)
    if T == 1 and mask is None and not is_causal and q.device.type == "cpu" and dropout_p == 0.0:
        return single_query_attention(q, k, v).view(B, 1, -1)  # (B, Hq, 1, hs) is (B, 1, Hq*hs) in memory
    # enable_gqa lets the kernel index shared K/V heads instead of materialising repeats.
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                                       enable_gqa=q.size(1) != k.size(1))  # (B, Hq, T, hs)
    return y.transpose(1, 2).reshape(B, T, q.size(1) * head_size)


def single_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q (B, Hq, 1, hs) over all of k (B, Hkv, n, hs) and v (B, Hkv, n, dv) -> (B, Hq, 1, dv) contiguous, as
    two matmuls.

    A decoding step on a CPU: SDPA's CPU kernel spends most of a call setting up its query tiles for a single
    query, several times what the two matmuls take (docs/benchmarks.md). The g = Hq/Hkv
    query heads of one key/value head are consecutive, so they are rows of one (g, hs) @ (hs, n) product.
    """
    B, hq, _, hs = q.shape
    hkv = k.size(1)
    scores = q.view(B, hkv, hq // hkv, hs) @ k.transpose(-2, -1) * hs**-0.5  # (B, Hkv, g, n)
    return (scores.softmax(-1) @ v).view(B, hq, 1, v.size(-1))


def no_autocast(device_type: str) -> contextlib.AbstractContextManager:
    """Autocast off on this device type (if it has autocast at all: the meta device used for FLOP counting has not),
    for the computations that need full precision."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def short_causal_conv(conv: nn.Conv1d, x: torch.Tensor, state: RecurrentState | None) -> torch.Tensor:
    """A depthwise `conv` made causal, then SiLU, over the time axis of x (B, T, W) -> (B, T, W): the
    kernel_size - 1 inputs before the first token are zeros, or the decoding state's last inputs ("conv",
    (B, W, kernel_size - 1)), which it then replaces with its own (the recurrent layers' short convolutions)."""
    keep = conv.kernel_size[0] - 1
    u = x.transpose(1, 2)  # (B, W, T)
    if state is None:
        u = F.pad(u, (keep, 0))
    else:
        u = torch.cat([state["conv"].to(u.dtype), u], dim=-1)
        state["conv"].copy_(u[..., u.size(-1) - keep:])
    return F.silu(conv(u)).transpose(1, 2)
