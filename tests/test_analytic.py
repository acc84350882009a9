"""Analytic parameter and FLOP counts (lit_attn.analytic) against the real model."""

import dataclasses

import pytest
import torch
from lightning.fabric.utilities.throughput import measure_flops

from lit_attn import GPTConfig, Transformer
from lit_attn.analytic import (
    attention_flops_per_sequence,
    attention_flops_per_token,
    cache_values_per_token,
    gpt_params,
    gpt_train_flops_per_token,
    nanogpt_layout_differences,
    nanogpt_params,
)
from lit_attn.attention.heads import PRESETS


@pytest.mark.parametrize("vocab,d,layers,heads,ctx", [
    (65, 32, 1, 4, 16), (100, 64, 3, 2, 8), (257, 48, 2, 6, 32), (11, 16, 4, 1, 64),
])
def test_nanogpt_formula_equals_model_minus_position_embeddings(vocab, d, layers, heads, ctx):
    # The defaults of GPTConfig are the layout nanoGPT's formula describes (learned positions,
    # LayerNorm, GELU 4x, biases, tied head, final norm); it leaves out only the d*T positions.
    config = GPTConfig(vocab_size=vocab, n_layer=layers, n_embd=d, n_head=heads, block_size=ctx)
    assert nanogpt_layout_differences(config) == []
    total = sum(p.numel() for p in Transformer(config).parameters())
    assert nanogpt_params(ctx, vocab, d, heads, layers) == total - ctx * d


def test_nanogpt_formula_gpt2_small():
    # nanoGPT reports 123.65M (non-embedding) for GPT-2 small.
    assert nanogpt_params(1024, 50257, 768, 12, 12) == 123_653_376


def test_nanogpt_layout_differences_are_named():
    config = GPTConfig(vocab_size=10, attention="gqa", n_head=8, norm="rmsnorm", ffn="swiglu", tie_embeddings=False)
    diffs = nanogpt_layout_differences(config)
    assert any("gqa" in d for d in diffs) and "norm rmsnorm" in diffs and "untied head" in diffs
    assert any(d.startswith("ffn swiglu") for d in diffs)
    # GQA with as many key/value heads as heads is MHA: the formula applies.
    assert nanogpt_layout_differences(dataclasses.replace(config, n_kv_heads=8, norm="layernorm", ffn="gelu",
                                                          tie_embeddings=True)) == []


def test_head_overrides_and_qkv_bias_are_counted():
    config = GPTConfig(vocab_size=20, attention="sqa", n_layer=1, n_embd=64, n_head=8, n_query_heads=2, n_kv_heads=1,
                       qkv_bias=False, block_size=8)
    assert gpt_params(config)["total"] == sum(p.numel() for p in Transformer(config).parameters())


@pytest.mark.parametrize("attention", [*PRESETS, "noq", "qsa", "qsa_fixed"])
def test_attention_flop_terms_scale_with_context(attention):
    for ctx in (16, 64, 256):
        config = GPTConfig(vocab_size=10, attention=attention, n_embd=64, n_head=8, block_size=ctx)
        seq, seq2 = (attention_flops_per_sequence(config, c) for c in (ctx, 2 * ctx))
        assert seq2.quadratic == 4 * seq.quadratic  # O(T^2) per sequence
        assert seq2.linear == 2 * seq.linear  # O(T) per sequence
        tok, tok2 = (attention_flops_per_token(config, c) for c in (ctx, 2 * ctx))
        assert tok2.quadratic == 2 * tok.quadratic and tok2.linear == tok.linear


def test_sparse_query_attention_shrinks_the_quadratic_term():
    # Score FLOPs scale with Hq/H, whatever Hkv is.
    def quadratic(name):
        config = GPTConfig(vocab_size=10, attention=name, n_embd=256, n_head=16)
        return attention_flops_per_token(config, 1024).quadratic

    assert quadratic("gqa") == quadratic("mha")
    assert quadratic("sqa") * 2 == quadratic("mha")
    assert quadratic("xsqa") * 4 == quadratic("mha")


def test_cache_values_follow_the_key_value_heads():
    def cache(name, **kw):
        return cache_values_per_token(GPTConfig(vocab_size=10, attention=name, n_layer=2, n_embd=64, n_head=8, **kw))

    assert cache("mha") == 2 * 2 * 8 * 8  # layers x (k, v) x heads x head size
    assert cache("gqa") * 4 == cache("mha") and cache("mqa") * 8 == cache("mha")
    assert cache("sqa") == cache("gqa")  # fewer query heads keep as many key/value heads
    assert cache("noq") == cache("mha")
    assert cache("qsa") == 2 * 8 * (1 + 8)  # layers x heads x (one key scalar + d value readouts)


@pytest.mark.parametrize("attention,layout", [
    ("mha", {}), ("gqa", dict(ffn="swiglu", pos="rope", norm="rmsnorm")), ("xsmqa", dict(tie_embeddings=False)),
    ("sqa", dict(bias=False)), ("noq", {}), ("mha", dict(ffn="identity")), ("mha", dict(ffn="none")),
])
def test_analytic_training_flops_equal_measure_flops(attention, layout):
    # The analytic count is the fallback for MFU; it must agree with what FlopCounterMode sees.
    config = GPTConfig(vocab_size=50, attention=attention, n_layer=2, n_embd=64, n_head=8, block_size=32, **layout)
    with torch.device("meta"):
        model = Transformer(config)
        x = torch.zeros(3, 32, dtype=torch.long)
    measured = measure_flops(model, lambda: model(x), loss_fn=torch.Tensor.sum)
    assert measured == 3 * 32 * gpt_train_flops_per_token(config)


def test_unknown_attention_is_a_precise_error():
    with pytest.raises(ValueError, match="unknown attention 'bogus'; choose one of: .*mha"):
        GPTConfig(vocab_size=10, attention="bogus")
