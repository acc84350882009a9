"""Sliding-window causal attention and learned attention sinks, for the softmax families (grouped.py, noq.py).

Window W: the query at position i attends to the positions i-W+1..i (itself included), on SDPA with a boolean
band mask, or SDPA's own causal mask when W >= T. Decoding keeps the last W positions in a ring buffer (slot =
position mod W), so a sequence's cache stops growing at W tokens; the keys are rotated at their absolute
positions before they are stored, so RoPE sees the true positions.

Sinks: one learned logit per query head joins every row's softmax as a key without a value (as gpt-oss), so a
head can put weight on "nothing" instead of on the tokens in its window; the cache stays a plain ring of W
tokens. With sinks the scores are computed as a plain softmax (SDPA has no sink input).

The algorithm's work is min(T, W) keys per query. A dense masked SDPA computes all T: on the meta device, where
the model measures FLOPs, `windowed_reference` (the same function, each query over its own W keys) runs instead,
so the measured FLOPs are the algorithm's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .state import KVCache

__all__ = ["band_mask", "check_window", "sink_attention", "windowed_attention", "windowed_reference"]


def check_window(window: int | None) -> int | None:
    """`window` if it is None or an integer >= 2, else ValueError saying what it must be."""
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 2):
        raise ValueError(f"the attention option window (--model.attention_options) must be an integer >= 2 (the "
                         "positions each query attends to, its own included; 1 would be the token alone) or null "
                         f"for full causal attention, got {window!r}")
    return window


def band_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """(T, n) bool: key position j is visible from query position i if i-W < j <= i (j <= i without a window)."""
    distance = q_pos[:, None] - k_pos[None, :]
    return (distance >= 0) if window is None else (distance >= 0) & (distance < window)


def sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                   sinks: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """q (B, Hq, T, hs), k and v (B, Hkv, n, hs), mask (T, n) bool or None (all visible), sinks (Hq,) ->
    (B, Hq, T, hs): softmax over the visible scores and the head's sink logit, the sink's weight dropped."""
    g = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    scores = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5  # (B, Hq, T, n)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    weights = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
    return F.dropout(weights, dropout_p) @ v


def windowed_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                       sinks: torch.Tensor | None, dropout_p: float) -> torch.Tensor:
    """Windowed causal attention over positions 0..T-1 with each query's own `window` keys gathered: the
    algorithm's work and no more (its FLOPs are what the model counts). q (B, Hq, T, hs), k, v (B, Hkv, T, hs)
    -> (B, Hq, T, hs)."""
    B, hq, T, hs = q.shape
    hkv = k.size(1)
    # Key w of query i is position i - window + 1 + w; the first window-1 are padding for the early queries.
    pad = (0, 0, window - 1, 0)
    k_win = F.pad(k, pad).unfold(2, window, 1)  # (B, Hkv, T, hs, W)
    v_win = F.pad(v, pad).unfold(2, window, 1)
    q = q.view(B, hkv, hq // hkv, T, hs)
    scores = torch.einsum("bhgtd,bhtdw->bhgtw", q, k_win) * hs**-0.5  # (B, Hkv, g, T, W)
    position = torch.arange(T, device=q.device)
    visible = position[:, None] - window + 1 + torch.arange(window, device=q.device) >= 0  # (T, W)
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink = sinks.to(scores.dtype).view(1, hkv, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
    else:
        weights = scores.softmax(-1)
    y = torch.einsum("bhgtw,bhtdw->bhgtd", F.dropout(weights, dropout_p), v_win)  # (B, Hkv, g, T, hs)
    return y.reshape(B, hq, T, hs)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
            sinks: torch.Tensor | None, dropout_p: float) -> torch.Tensor:
    """SDPA, or the softmax with sinks (a causal mask made explicit)."""
    if sinks is not None:
        if is_causal:
            position = torch.arange(q.size(2), device=q.device)
            mask = band_mask(position, position, None)
        return sink_attention(q, k, v, mask, sinks, dropout_p)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                                          enable_gqa=q.size(1) != k.size(1))


def windowed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None,
                       sinks: torch.Tensor | None, dropout_p: float, cache: KVCache | None,
                       single_query: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """q (B, Hq, T, hs), k and v (B, T, Hkv, hs), rotated at their positions -> (B, Hq, T, hs): causal attention
    over the last `window` positions (all without one), with learned `sinks` (Hq,) if given.

    Without `cache` the T tokens are positions 0..T-1. With one ({"k", "v"}: (B, S, Hkv, hs) rings, S = the
    window or the cache's length if shorter) the tokens sit at `cache.positions`, following those already in it,
    and their keys and values go to the slots positions mod S. `single_query(q, k, v)`, if given, attends one
    query over all of k and v on a CPU decoding step (kernels.single_query_attention).
    """
    T = q.size(2)
    if cache is None or cache.length == T:  # the whole sequence so far: its own keys alone
        if cache is not None:
            _store(cache, k, v, window)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, Hkv, T, hs)
        if window is None or window >= T:
            return _attend(q, k, v, None, True, sinks, dropout_p)
        if q.device.type == "meta":
            return windowed_reference(q, k, v, window, sinks, dropout_p)
        position = torch.arange(T, device=q.device)
        return _attend(q, k, v, band_mask(position, position, window), False, sinks, dropout_p)
    ring_k, ring_v, positions = cache["k"], cache["v"], cache.positions
    slots = ring_k.size(1)
    if T == 1 and cache.length is not None:
        # One token: after it is stored, the filled slots hold exactly the positions its window sees.
        _store(cache, k, v, window)
        n = min(cache.length, slots)
        k, v = ring_k[:, :n].to(q.dtype).transpose(1, 2), ring_v[:, :n].to(q.dtype).transpose(1, 2)
        if single_query is not None and sinks is None and q.device.type == "cpu" and dropout_p == 0.0:
            return single_query(q, k, v)
        return _attend(q, k, v, None, False, sinks, dropout_p)
    # Several tokens (or a traced step): the ring as it was, then the new tokens, each slot at the last position
    # it received (negative: never written), masked per query; stored afterwards, as they may overwrite its window.
    last = positions[:1] - 1  # the last position already in the ring
    held = last - torch.remainder(last - torch.arange(slots, device=q.device), slots)  # (S,)
    k_all = torch.cat([ring_k.to(q.dtype), k], 1).transpose(1, 2)  # (B, Hkv, S + T, hs)
    v_all = torch.cat([ring_v.to(q.dtype), v], 1).transpose(1, 2)
    mask = band_mask(positions, torch.cat([held, positions]), window)
    mask[:, :slots] &= held >= 0
    y = _attend(q, k_all, v_all, mask, False, sinks, dropout_p)
    _store(cache, k, v, window)
    return y


def _store(cache: KVCache, k: torch.Tensor, v: torch.Tensor, window: int | None) -> None:
    """Write the new tokens' keys and values (B, T, Hkv, hs) at slots positions mod S (the last S of them only:
    earlier ones would be overwritten within the same write). A cache shorter than the window is no ring: a
    position past its end is refused (index_copy_ raises), not wrapped over positions the window still sees."""
    ring_k, ring_v = cache["k"], cache["v"]
    slots = ring_k.size(1)
    positions, k, v = cache.positions[-slots:], k[:, -slots:], v[:, -slots:]
    index = positions if window is None or slots < window else torch.remainder(positions, slots)
    ring_k.index_copy_(1, index, k.to(ring_k.dtype))
    ring_v.index_copy_(1, index, v.to(ring_v.dtype))
