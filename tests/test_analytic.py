"""Analytic parameter and FLOP counts (lit_attn.analytic) against the real model."""

import itertools

import pytest
import torch
from lightning.fabric.utilities.throughput import measure_flops

from callbacks.params import count_parameters
from lit_attn import GPT, attention_names
from lit_attn.analytic import (
    GROUPED,
    attention_flops_per_sequence,
    attention_flops_per_token,
    attention_params,
    gpt_params,
    gpt_train_flops_per_token,
    seed001_gpt_params,
    seed001_layout_differences,
)


@pytest.mark.parametrize("vocab,d,layers,heads,ctx", [
    (65, 32, 1, 4, 16), (100, 64, 3, 2, 8), (257, 48, 2, 6, 32), (11, 16, 4, 1, 64),
])
def test_seed001_formula_equals_model_minus_position_embeddings(vocab, d, layers, heads, ctx):
    # The defaults of GPT are the layout seed 001 describes (learned positions, LayerNorm,
    # GELU 4x, biases, tied head, final norm); the formula leaves out only the d*T positions.
    model = GPT(vocab_size=vocab, n_layer=layers, n_embd=d, n_head=heads, block_size=ctx)
    assert seed001_layout_differences(**model.hparams) == []
    total = sum(p.numel() for p in model.parameters())
    assert seed001_gpt_params(ctx, vocab, d, heads, layers) == total - ctx * d


def test_seed001_formula_gpt2_small():
    # nanoGPT reports 123.65M (non-embedding) for GPT-2 small.
    assert seed001_gpt_params(1024, 50257, 768, 12, 12) == 123_653_376


def test_seed001_layout_differences_are_named():
    diffs = seed001_layout_differences(attention="gqa", n_head=8, norm="rmsnorm", ffn="swiglu", tie_embeddings=False)
    assert any("gqa" in d for d in diffs) and "norm rmsnorm" in diffs and "untied head" in diffs
    assert any(d.startswith("ffn swiglu") for d in diffs)


LAYOUTS = [
    dict(norm=n, pos=p, ffn=f, bias=b, tie_embeddings=t, final_norm=fn)
    for n, p, f, b, t, fn in itertools.product(
        ["layernorm", "rmsnorm"], ["learned", "rope"], ["gelu", "swiglu"], [True, False], [True, False], [True, False]
    )
]


@pytest.mark.parametrize("attention", attention_names())
def test_component_counts_match_model_for_every_layout(attention):
    for layout in LAYOUTS:
        if attention.startswith("qsa") and layout["pos"] == "rope":
            continue  # rope is ignored by qsa; nothing new to count
        model = GPT(vocab_size=37, attention=attention, n_layer=2, n_embd=32, n_head=4, block_size=16, **layout)
        measured = count_parameters(model)
        analytic = gpt_params(**model.hparams)
        assert analytic is not None, attention
        for key in ("embeddings", "attention", "ffn", "norms", "head", "total"):
            assert measured[key] == analytic[key], (attention, layout, key)
        assert measured["other"] == 0
        parts = ("embeddings", "attention", "ffn", "norms", "head", "other")
        assert sum(measured[k] for k in parts) == measured["total"]
        per_layer = attention_params(attention, 32, 4, block_size=16, bias=layout["bias"])
        assert all(sum(p.numel() for p in b.attn.parameters()) == per_layer for b in model.blocks)


def test_head_overrides_and_qkv_bias_are_counted():
    model = GPT(vocab_size=20, attention="sqa", n_layer=1, n_embd=64, n_head=8, n_query_heads=2, n_kv_heads=1,
                qkv_bias=False, block_size=8)
    assert gpt_params(**model.hparams)["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("attention", [*GROUPED, "noq"])
def test_attention_flop_terms_scale_with_context(attention):
    for ctx in (16, 64, 256):
        seq, seq2 = (attention_flops_per_sequence(attention, 64, 8, c) for c in (ctx, 2 * ctx))
        assert seq2.quadratic == 4 * seq.quadratic  # O(T^2) per sequence
        assert seq2.linear == 2 * seq.linear  # O(T) per sequence
        tok, tok2 = (attention_flops_per_token(attention, 64, 8, c) for c in (ctx, 2 * ctx))
        assert tok2.quadratic == 2 * tok.quadratic and tok2.linear == tok.linear


def test_sparse_query_attention_shrinks_the_quadratic_term():
    # Seed 002: score FLOPs scale with Hq/H, whatever Hkv is.
    mha = attention_flops_per_token("mha", 256, 16, 1024)
    assert attention_flops_per_token("gqa", 256, 16, 1024).quadratic == mha.quadratic
    assert attention_flops_per_token("sqa", 256, 16, 1024).quadratic * 2 == mha.quadratic
    assert attention_flops_per_token("xsqa", 256, 16, 1024).quadratic * 4 == mha.quadratic


@pytest.mark.parametrize("attention,layout", [
    ("mha", {}), ("gqa", dict(ffn="swiglu", pos="rope", norm="rmsnorm")), ("xsmqa", dict(tie_embeddings=False)),
    ("sqa", dict(bias=False)), ("noq", {}),
])
def test_analytic_training_flops_equal_measure_flops(attention, layout):
    # The analytic count is the fallback for MFU; it must agree with what FlopCounterMode sees.
    with torch.device("meta"):
        model = GPT(vocab_size=50, attention=attention, n_layer=2, n_embd=64, n_head=8, block_size=32, **layout)
        x = torch.zeros(3, 32, dtype=torch.long)
    measured = measure_flops(model, lambda: model(x), loss_fn=torch.Tensor.sum)
    assert measured == 3 * 32 * gpt_train_flops_per_token(**model.hparams)


def test_unknown_attention_has_no_formula():
    assert attention_params("bogus", 32, 4) is None
    assert attention_flops_per_token("qsa", 32, 4, 16) is None
    assert gpt_params(vocab_size=10, attention="bogus") is None
    assert gpt_train_flops_per_token(vocab_size=10, attention="qsa") is None
