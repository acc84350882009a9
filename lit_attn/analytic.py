"""Analytic parameter, FLOP and decoding-cache counts of a GPT, as pure functions of its GPTConfig.

The attention's share comes from its registry entry (every registered attention describes
itself), layer by layer (`GPTConfig.layers`: a layer pattern gives layers different attentions, and the
model's counts are the sums of its layers'); the rest (embeddings, FFN, norms, head) from the config.

FLOP conventions (the same as torch's FlopCounterMode, which
`lightning.fabric.utilities.throughput.measure_flops` uses):
- one multiply-accumulate is 2 FLOPs;
- only matrix multiplications count: biases, norms, activations, RoPE,
  softmax, embedding lookups and the loss are left out;
- the score matrix is counted in full (T x T per query head), as a dense kernel
  computes it; a causal flash kernel skips about half of it;
- a training step costs 3x the forward pass (the backward pass computes the
  gradients of both the input and the weights of every matmul: 2x forward).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lit_attn.attention.registry import FlopSplit
from lit_attn.config import NO_MLP, GPTConfig

__all__ = ["FlopSplit", "attention_flops_per_sequence", "attention_flops_per_token", "attention_params",
           "cache_values_per_sequence", "cache_values_per_token", "decode_lengths", "decode_state_kind",
           "gpt_params", "gpt_train_flops_per_token", "layer_flops_per_token", "layer_params",
           "nanogpt_layout_differences", "nanogpt_params"]


def _uniform(config: GPTConfig, what: str) -> None:
    if config.layer_pattern is not None:
        raise ValueError(f"the layers of a model with a layer_pattern differ: count {what} per layer "
                         f"(lit_attn.analytic.layer_{what})")


def attention_params(config: GPTConfig) -> int:
    """Parameters of one attention layer (of a model without a layer pattern; see `layer_params`)."""
    _uniform(config, "params")
    return config.spec.params(**config.attention_args())


def layer_params(config: GPTConfig) -> list[int]:
    """Parameters of each layer's attention."""
    return _per_layer(config, lambda layer: layer.spec.params(**layer.attention_args()))


def attention_flops_per_token(config: GPTConfig, context: int | None = None) -> FlopSplit:
    """Forward FLOPs of one attention layer per token, for a sequence of `context` tokens (default block_size), of
    a model without a layer pattern (see `layer_flops_per_token`).

    The linear term per token is constant and the quadratic one grows with T (up to a window, where there is
    one), so per sequence (x T) they grow as T and T^2.
    """
    _uniform(config, "flops_per_token")
    return config.spec.flops(context=config.block_size if context is None else context, **config.attention_args())


def layer_flops_per_token(config: GPTConfig, context: int | None = None) -> list[FlopSplit]:
    """Forward FLOPs per token of each layer's attention at `context` (default block_size)."""
    context = config.block_size if context is None else context
    return _per_layer(config, lambda layer: layer.spec.flops(context=context, **layer.attention_args()))


def _per_layer(config: GPTConfig, count: Any) -> list[Any]:
    """count(layer config) for every layer, computed once per kind of layer."""
    layers = config.layers
    kinds = {id(layer): layer for layer in layers}
    counts = {key: count(layer) for key, layer in kinds.items()}
    return [counts[id(layer)] for layer in layers]


def _summed(config: GPTConfig, count: Any) -> Any:
    """The sum of count(layer config) over the layers, computed once per kind of layer (a model of many layers is
    not listed layer by layer)."""
    return sum(count(layer) * n for layer, n in config.layer_kinds())


def attention_flops_per_sequence(config: GPTConfig, context: int | None = None) -> FlopSplit:
    """Forward FLOPs of one attention layer over one sequence of `context` tokens (T x per token)."""
    context = config.block_size if context is None else context
    return attention_flops_per_token(config, context).scale(context)


def cache_values_per_token(config: GPTConfig) -> int | None:
    """Values a decoding cache keeps per past token, over all layers (x bytes per value for its size): those
    of the first token; None for an attention that declares no decoding state (its decoding recomputes the
    prefix)."""
    return cache_values_per_sequence(config, 1)


def cache_values_per_sequence(config: GPTConfig, length: int) -> int | None:
    """Values the decoding states of all layers hold for one sequence of `length` tokens; None as above (if any
    layer declares none: the model then decodes uncached)."""
    kinds = [(layer.spec.state(**layer.attention_args()), n) for layer, n in config.layer_kinds()]
    return None if any(layout is None for layout, _ in kinds) else sum(layout.values(length) * n for layout, n in kinds)


def decode_lengths(block_size: int) -> tuple[int, int, int]:
    """The prompt lengths `lit-attn bench-decode` measures by default, T/8, T/2 and T for a context of T tokens:
    the lengths at which the cost card reports decode state sizes too."""
    return max(1, block_size // 8), max(1, block_size // 2), block_size


def decode_state_kind(config: GPTConfig, length: int | None = None) -> str | None:
    """How one sequence's decoding state grows up to `length` tokens (default block_size), read from the layouts'
    values: "per token" (every past token adds the same values: K/V), "window" (it stops growing before `length`
    after growing per token: a window of past tokens), "fixed" (the same values at any length: a recurrent state),
    "mixed" (still growing, but a part of it does not: fixed or windowed layers); None for an attention that declares
    no decoding state."""
    T = max(2, config.block_size if length is None else length)
    first, last, before = (cache_values_per_sequence(config, n) for n in (1, T, T - 1))
    if first is None:
        return None
    if last == before:
        return "fixed" if last == first else "window"
    return "per token" if last == T * first else "mixed"


def _ffn_weights(config: GPTConfig) -> int:
    """Weights of one FFN: in (x2 for SwiGLU's gate and up projections) and out projections (0 without an MLP)."""
    return config.n_embd * config.ffn_width * (2 if config.ffn == "swiglu" else 1) + config.ffn_width * config.n_embd


def gpt_params(config: GPTConfig) -> dict[str, int]:
    """Parameters of GPT per component (embeddings, attention, ffn, norms, head) and their total.

    A tied LM head shares the token embedding, which is counted once, under
    embeddings; `head` is then 0.
    """
    c = config
    in_width = c.ffn_width * (2 if c.ffn == "swiglu" else 1)
    ffn_layer = _ffn_weights(c) + ((in_width + c.n_embd) if c.bias and c.ffn not in NO_MLP else 0)
    norm_size = c.n_embd * (2 if c.norm == "layernorm" and c.bias else 1)  # RMSNorm has a gain only
    block_norms = 1 if c.ffn == "none" else 2  # ffn none has no second branch, nor its norm
    counts = {
        "embeddings": c.vocab_size * c.n_embd + (c.block_size * c.n_embd if c.pos == "learned" else 0),
        "attention": _summed(c, lambda layer: layer.spec.params(**layer.attention_args())),
        "ffn": c.n_layer * ffn_layer,
        "norms": (block_norms * c.n_layer + (1 if c.final_norm else 0)) * norm_size,
        "head": 0 if c.tie_embeddings else c.vocab_size * c.n_embd + (c.vocab_size if c.bias else 0),
    }
    counts["total"] = sum(counts.values())
    return counts


def gpt_train_flops_per_token(config: GPTConfig, context: int | None = None) -> int:
    """Training (forward + backward) FLOPs per token at `context` (default block_size).

    3 x forward, forward = sum over layers of (attention linear + quadratic) + n_layer x 2 x FFN weights + 2 x d x V
    (head).
    """
    context = config.block_size if context is None else context
    attn = _summed(config, lambda layer: layer.spec.flops(context=context, **layer.attention_args()).total)
    forward = attn + config.n_layer * 2 * _ffn_weights(config) + 2 * config.n_embd * config.vocab_size
    return 3 * forward


def nanogpt_params(seq_len: int, vocab_size: int, d_model: int, num_heads: int, num_layers: int) -> int:
    """nanoGPT's scaling-law parameter count (`gpt_params` in its scaling_laws.ipynb), term for term.

    It assumes the GPT-2 layout: learned positions, LayerNorm with bias, GELU MLP
    of width 4*d, biases on every linear layer, MHA, a final LayerNorm and an LM
    head tied to the token embedding. It includes the blocks, the final norm and
    the head's d*V matrix (no bias). It computes but does not include the
    embeddings (d*V + d*T): since the head matrix *is* the token embedding, that
    leaves out only the position embedding, so it equals nanoGPT's
    `get_num_params(non_embedding=True)`: the model's total minus d*T.
    num_heads does not enter the count (heads split d, they add no parameters),
    and seq_len enters only the excluded position embedding: the count does not
    grow with the context; the O(T^2) growth is in FLOPs (attention_flops_*).
    """
    ffw_size = 4 * d_model
    attention = 3 * d_model**2 + 3 * d_model
    attproj = d_model**2 + d_model
    ffw = d_model * ffw_size + ffw_size
    ffwproj = ffw_size * d_model + d_model
    layernorms = 2 * 2 * d_model
    ln_f = 2 * d_model
    dense = d_model * vocab_size
    return num_layers * (attention + attproj + ffw + ffwproj + layernorms) + ln_f + dense


def nanogpt_layout_differences(config: GPTConfig) -> list[str]:
    """How a GPT's settings differ from the layout nanoGPT's formula describes ([] = it applies exactly)."""
    c = config
    mha = dataclasses.replace(c, attention="mha", attention_options=None, layer_pattern=None, local_window=None,
                              n_query_heads=None, n_kv_heads=None)
    same_attention = (layer_params(c), layer_flops_per_token(c)) == (layer_params(mha), layer_flops_per_token(mha))
    checks = (
        (same_attention, f"attention {c.attention}{' with a layer_pattern' if c.layer_pattern else ''} "
                         "(the formula assumes MHA)"),
        (c.norm == "layernorm", f"norm {c.norm}"),
        (c.pos == "learned", f"pos {c.pos}"),
        (c.ffn == "gelu" and c.ffn_width == 4 * c.n_embd,
         f"ffn {c.ffn}" + ("" if c.ffn in NO_MLP else f" width {c.ffn_width}")),
        (c.bias and (c.qkv_bias is None or c.qkv_bias), "no biases" if not c.bias else "no q/k/v bias"),
        (c.tie_embeddings, "untied head"),
        (c.final_norm, "no final norm"),
    )
    return [message for ok, message in checks if not ok]
