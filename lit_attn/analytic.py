"""Analytic parameter and FLOP counts of `lit_attn.GPT`, as pure functions of its settings.

Every function takes the model's constructor arguments by name, so
`gpt_params(**model.hparams)` works; training-only settings (lr, dropout, ...)
are accepted and ignored.

FLOP conventions (the same as torch's FlopCounterMode, which
`lightning.fabric.utilities.throughput.measure_flops` uses):
- one multiply-accumulate is 2 FLOPs;
- only matrix multiplications count: biases, norms, activations, RoPE,
  softmax, embedding lookups and the loss are left out;
- the score matrix is counted in full (T x T per query head), as a dense kernel
  computes it; a causal flash kernel skips about half of it;
- a training step costs 3x the forward pass (the backward pass computes the
  gradients of both the input and the weights of every matmul: 2x forward).

Attention names without a formula here (anything registered later) give None.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from .attention.grouped import PRESETS, resolve_heads

GROUPED = tuple(PRESETS)  # mha, gqa, mqa, sqa, ssqa, xsqa, xsmqa: one module, different head counts
QUANTUM = ("qsa", "qsa_fixed")
KNOWN = (*GROUPED, "noq", *QUANTUM)


class FlopSplit(NamedTuple):
    """Attention FLOPs split by how they grow with the context length T."""

    linear: int  # q/k/v/output projections: per token independent of T
    quadratic: int  # scores and the weighted sum of values: per token proportional to T

    @property
    def total(self) -> int:
        return self.linear + self.quadratic

    def scale(self, factor: int) -> FlopSplit:
        return FlopSplit(self.linear * factor, self.quadratic * factor)


def ffn_hidden_size(n_embd: int, ffn: str = "gelu", ffn_hidden: int | None = None) -> int:
    """The FFN width GPT uses: explicit, else 4*n_embd (gelu) or 8/3*n_embd rounded up to 64 (swiglu)."""
    if ffn_hidden is not None:
        return ffn_hidden
    return 4 * n_embd if ffn == "gelu" else 64 * math.ceil(8 * n_embd / 3 / 64)


def attention_heads(
    attention: str, n_embd: int, n_head: int, n_query_heads: int | None = None, n_kv_heads: int | None = None
) -> tuple[int, int] | None:
    """(query heads, key/value heads) that the attention really uses; None for unknown names."""
    name = attention.lower()
    if name in GROUPED:
        return resolve_heads(name, n_embd, n_head, n_query_heads, n_kv_heads)
    if name == "noq":
        return n_head, resolve_heads("mha", n_embd, n_head, None, n_kv_heads)[1]
    if name in QUANTUM:
        return n_head, n_head
    return None


def attention_params(
    attention: str,
    n_embd: int,
    n_head: int,
    n_query_heads: int | None = None,
    n_kv_heads: int | None = None,
    block_size: int = 1,
    bias: bool = True,
    qkv_bias: bool | None = None,
    attention_options: dict[str, Any] | None = None,
) -> int | None:
    """Parameters of one attention layer; None for names without a formula.

    grouped (mha ... xsmqa): d*(Hq + 2*Hkv)*hs [+ (Hq + 2*Hkv)*hs] + Hq*hs*d [+ d]
    noq:                     d*2*Hkv*hs [+ 2*Hkv*hs] + d*d [+ d]          (no query projection)
    qsa / qsa_fixed:         9*n*H*R*(T or 1) + d*d [+ d], n = ceil(log2 hs) qubits, R repetitions
    Brackets: present with qkv_bias (q/k/v) or bias (output projection); hs = d / H.
    """
    name = attention.lower()
    heads = attention_heads(name, n_embd, n_head, n_query_heads, n_kv_heads)
    if heads is None:
        return None
    hq, hkv = heads
    hs = n_embd // n_head
    qkv_bias = bias if qkv_bias is None else qkv_bias
    out_bias = n_embd if bias else 0
    if name in GROUPED:
        width = (hq + 2 * hkv) * hs
        return n_embd * width + (width if qkv_bias else 0) + hq * hs * n_embd + out_bias
    if name == "noq":
        width = 2 * hkv * hs
        return n_embd * width + (width if qkv_bias else 0) + n_embd * n_embd + out_bias
    # Quantum: 3 circuits (q, k, v) x 3 rotations (RX, RY, RY) x n qubits, per head and repetition.
    repetitions = int((attention_options or {}).get("repetitions", 1))
    positions = block_size if name == "qsa" else 1
    circuits = 9 * math.ceil(math.log2(hs)) * n_head * repetitions * positions
    return circuits + n_embd * n_embd + out_bias


def attention_flops_per_token(
    attention: str,
    n_embd: int,
    n_head: int,
    context: int,
    n_query_heads: int | None = None,
    n_kv_heads: int | None = None,
) -> FlopSplit | None:
    """Forward FLOPs of one attention layer per token, for a sequence of `context` tokens.

    grouped: linear 2*d*(Hq + 2*Hkv)*hs + 2*Hq*hs*d, quadratic 4*Hq*hs*T (Q K^T and A V);
    noq: the same with no query projection (linear 2*d*2*Hkv*hs + 2*d*d, Hq = H).
    The linear term per token is constant and the quadratic one grows with T, so per
    sequence (x T) they grow as T and T^2. None for qsa (its cost is dominated by
    building circuit observables, not by matmuls with the tokens) and unknown names.
    """
    name = attention.lower()
    if name not in GROUPED and name != "noq":
        return None
    hq, hkv = attention_heads(name, n_embd, n_head, n_query_heads, n_kv_heads)  # type: ignore[misc]
    hs = n_embd // n_head
    q_proj = 0 if name == "noq" else n_embd * hq * hs  # noq uses the input itself as the query
    weights = q_proj + n_embd * 2 * hkv * hs + hq * hs * n_embd
    return FlopSplit(linear=2 * weights, quadratic=4 * hq * hs * context)


def attention_flops_per_sequence(
    attention: str,
    n_embd: int,
    n_head: int,
    context: int,
    n_query_heads: int | None = None,
    n_kv_heads: int | None = None,
) -> FlopSplit | None:
    """Forward FLOPs of one attention layer over one sequence of `context` tokens (T x per token)."""
    per_token = attention_flops_per_token(attention, n_embd, n_head, context, n_query_heads, n_kv_heads)
    return None if per_token is None else per_token.scale(context)


def gpt_params(
    vocab_size: int,
    attention: str = "mha",
    n_layer: int = 4,
    n_embd: int = 128,
    n_head: int = 8,
    n_query_heads: int | None = None,
    n_kv_heads: int | None = None,
    block_size: int = 128,
    norm: str = "layernorm",
    pos: str = "learned",
    ffn: str = "gelu",
    ffn_hidden: int | None = None,
    bias: bool = True,
    qkv_bias: bool | None = None,
    tie_embeddings: bool = True,
    final_norm: bool = True,
    attention_options: dict[str, Any] | None = None,
    **_training: Any,
) -> dict[str, int] | None:
    """Parameters of GPT per component (embeddings, attention, ffn, norms, head) and their total.

    A tied LM head shares the token embedding, which is counted once, under
    embeddings; `head` is then 0. None if the attention has no formula.
    """
    attn = attention_params(
        attention, n_embd, n_head, n_query_heads, n_kv_heads, block_size, bias, qkv_bias, attention_options
    )
    if attn is None:
        return None
    hidden = ffn_hidden_size(n_embd, ffn, ffn_hidden)
    in_width = hidden * (2 if ffn == "swiglu" else 1)  # SwiGLU's gate and up projections
    ffn_layer = n_embd * in_width + hidden * n_embd + ((in_width + n_embd) if bias else 0)
    norm_size = n_embd * (2 if norm == "layernorm" and bias else 1)  # RMSNorm has a gain only
    counts = {
        "embeddings": vocab_size * n_embd + (block_size * n_embd if pos == "learned" else 0),
        "attention": n_layer * attn,
        "ffn": n_layer * ffn_layer,
        "norms": (2 * n_layer + (1 if final_norm else 0)) * norm_size,
        "head": 0 if tie_embeddings else vocab_size * n_embd + (vocab_size if bias else 0),
    }
    counts["total"] = sum(counts.values())
    return counts


def gpt_train_flops_per_token(
    vocab_size: int,
    attention: str = "mha",
    n_layer: int = 4,
    n_embd: int = 128,
    n_head: int = 8,
    n_query_heads: int | None = None,
    n_kv_heads: int | None = None,
    block_size: int = 128,
    ffn: str = "gelu",
    ffn_hidden: int | None = None,
    context: int | None = None,
    **_layout: Any,
) -> int | None:
    """Training (forward + backward) FLOPs per token at `context` (default block_size); None if unknown.

    3 x forward, forward = n_layer x (attention linear + quadratic + 2 x FFN weights) + 2 x d x V (head).
    """
    context = block_size if context is None else context
    attn = attention_flops_per_token(attention, n_embd, n_head, context, n_query_heads, n_kv_heads)
    if attn is None:
        return None
    hidden = ffn_hidden_size(n_embd, ffn, ffn_hidden)
    ffn_weights = n_embd * hidden * (2 if ffn == "swiglu" else 1) + hidden * n_embd
    forward = n_layer * (attn.total + 2 * ffn_weights) + 2 * n_embd * vocab_size
    return 3 * forward


def seed001_gpt_params(seq_len: int, vocab_size: int, d_model: int, num_heads: int, num_layers: int) -> int:
    """Seed 001's `gpt_params` (nanoGPT's scaling_laws.ipynb), term for term.

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


def seed001_layout_differences(
    attention: str = "mha",
    n_embd: int = 128,
    n_head: int = 8,
    n_query_heads: int | None = None,
    n_kv_heads: int | None = None,
    norm: str = "layernorm",
    pos: str = "learned",
    ffn: str = "gelu",
    ffn_hidden: int | None = None,
    bias: bool = True,
    qkv_bias: bool | None = None,
    tie_embeddings: bool = True,
    final_norm: bool = True,
    **_other: Any,
) -> list[str]:
    """How a GPT's settings differ from the layout seed 001's formula describes ([] = it applies exactly)."""
    diffs = []
    heads = attention_heads(attention, n_embd, n_head, n_query_heads, n_kv_heads)
    if attention.lower() not in GROUPED or heads != (n_head, n_head):
        diffs.append(f"attention {attention} (the formula assumes MHA)")
    width = ffn_hidden_size(n_embd, ffn, ffn_hidden)
    checks = (
        (norm == "layernorm", f"norm {norm}"),
        (pos == "learned", f"pos {pos}"),
        (ffn == "gelu" and width == 4 * n_embd, f"ffn {ffn} width {width}"),
        (bias and (qkv_bias is None or qkv_bias), "no biases" if not bias else "no q/k/v bias"),
        (tie_embeddings, "untied head"),
        (final_norm, "no final norm"),
    )
    diffs += [message for ok, message in checks if not ok]
    return diffs
