import inspect
import math

import attention_checks as checks
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_attn import GPTConfig, Transformer
from lit_attn.analytic import cache_values_per_sequence
from lit_attn.attention import (
    DecodingState,
    KVLayout,
    attention_names,
    attention_options,
    build_attention,
    get_attention,
    register_attention,
)
from lit_attn.attention.grouped import GroupedAttention
from lit_attn.attention.heads import PRESETS
from lit_attn.attention.registry import unregister_attention
from lit_attn.attention.rope import RotaryEmbedding
from lit_attn.testing import check_attention

COMMON = dict(n_embd=32, n_head=8, block_size=16, dropout=0.0, bias=False, qkv_bias=None, rope=False)


def build(name, **overrides):
    kw = COMMON | {"n_query_heads": None, "n_kv_heads": None} | overrides
    return build_attention(name, **kw).eval()


def naive_attention(q, k, v):
    """Explicit causal softmax attention on (B, H, T, hs) tensors."""
    T = q.size(-2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v


def grouped_reference(attn: GroupedAttention, x: torch.Tensor) -> torch.Tensor:
    """Same computation with K/V heads repeated explicitly for each query head."""
    B, T, C = x.shape
    hq, hkv, hs = attn.n_query_heads, attn.n_kv_heads, attn.head_size
    W = attn.qkv.weight
    q = (x @ W[: hq * hs].T).view(B, T, hq, hs).transpose(1, 2)
    k = (x @ W[hq * hs : (hq + hkv) * hs].T).view(B, T, hkv, hs).transpose(1, 2)
    v = (x @ W[(hq + hkv) * hs :].T).view(B, T, hkv, hs).transpose(1, 2)
    if attn.rope is not None:
        q, k = attn.rope(q), attn.rope(k)
    k = k.repeat_interleave(hq // hkv, dim=1)  # query head i reads kv head i // (hq/hkv)
    v = v.repeat_interleave(hq // hkv, dim=1)
    y = naive_attention(q, k, v).transpose(1, 2).reshape(B, T, hq * hs)
    return attn.out_proj(y)


def test_registry_lists_every_family():
    assert set(attention_names()) >= {"mha", "gqa", "mqa", "sqa", "ssqa", "xsqa", "xsmqa", "noq"}


def test_unknown_attention_lists_known_names():
    with pytest.raises(ValueError, match=r"unknown attention 'bogus'; choose one of: .*mha.*ssqa"):
        build("bogus")


def test_unknown_option_is_rejected():
    assert attention_options("mha") == attention_options("noq") == ["window", "sinks", "gate"]
    with pytest.raises(ValueError, match="got unknown option.*temperature.*its options are: window, sinks, gate"):
        build_attention("mha", {"temperature": 2.0}, **COMMON, n_query_heads=None, n_kv_heads=None)


@pytest.mark.parametrize("name", attention_names())
def test_every_attention_passes_check_attention(name):
    check_attention(name)


@pytest.mark.parametrize("name", attention_names())
def test_full_model_is_causal(name):
    checks.assert_model_causal(name)


@pytest.mark.parametrize("name,pos", [(n, p) for n in attention_names() for p in ("learned", "rope")
                                      if p == "learned" or get_attention(n).rope])
def test_decoding_with_the_cache_equals_the_full_forward(name, pos):
    checks.assert_decoding_matches(name, pos)


@pytest.mark.slow  # 32 layouts each; the quick loop has check_attention and the analytic-vs-measured test
@pytest.mark.parametrize("name", attention_names())
def test_registry_describes_parameters_flops_and_cache(name):
    checks.assert_counts_match(name)
    checks.assert_cache_layout(name)


SIZES = [dict(n_embd=64, n_head=8, block_size=32, bias=True), dict(n_embd=96, n_head=12, block_size=24, qkv_bias=True),
         dict(n_embd=256, n_head=16, block_size=64, n_kv_heads=2)]


@pytest.mark.parametrize("sizes", SIZES, ids=["d64", "d96-qkv-bias", "d256-kv2"])
@pytest.mark.parametrize("name", attention_names())
def test_analytic_costs_equal_the_ones_measured_from_the_module(name, sizes):
    """The families' formulas (heads, parameters, FLOPs split by T) and the meta-device measurement check each other."""
    spec = get_attention(name)
    if "n_kv_heads" in sizes and (name in ("qsa", "qsa_fixed", "mqa", "xsmqa")
                                  or "n_kv_heads" not in inspect.signature(spec.cls).parameters):
        sizes = {k: v for k, v in sizes.items() if k != "n_kv_heads"}  # they fix or take no key/value heads
    args = spec.arguments(None, sizes)
    for context in (sizes["block_size"], sizes["block_size"] // 2 + 1):
        measured = spec.derived(context, **args)
        assert (spec.heads(**args), spec.params(**args), spec.flops(context, **args)) == measured, (name, context)


class CausalMeanAttention(nn.Module):
    """A toy attention: output projection of the running mean of projected values, with a cache of values."""

    def __init__(self, n_embd, bias=False, scale=1.0, **_):
        super().__init__()
        self.v = nn.Linear(n_embd, n_embd, bias=bias)
        self.out_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.scale = scale

    def forward(self, x, state=None):
        v = self.v(x)  # (B, T, C)
        if state is None:
            positions = torch.arange(x.size(1), device=x.device)
        else:
            positions = state.positions
            state["v"].index_copy_(1, positions, v)
            v = state["v"]  # (B, L, C)
        weights = (torch.arange(v.size(1), device=x.device) <= positions[:, None]).to(v.dtype)  # (T, L)
        weights = weights / weights.sum(-1, keepdim=True)  # row i averages positions <= i
        return self.out_proj(self.scale * (weights @ v))  # (B, T, C)

    @classmethod
    def decoding_state(cls, n_embd, **_):
        return KVLayout({"v": (n_embd,)})


@pytest.fixture
def toy_attention():
    register_attention("toy_mean", CausalMeanAttention, rope=False)  # no positions in a running mean
    yield "toy_mean"
    unregister_attention("toy_mean")


def test_a_registered_attention_gets_every_check_and_trains(toy_attention, corpus):
    """One register_attention call, no other edit: the checks, counts, FLOPs, cache, options, a fit."""
    assert toy_attention in attention_names() and attention_options(toy_attention) == ["scale"]
    check_attention(toy_attention, {"scale": 2.0})
    checks.assert_model_causal(toy_attention)
    checks.assert_counts_match(toy_attention)
    checks.assert_cache_layout(toy_attention)
    checks.assert_decoding_matches(toy_attention, pos="learned")
    before, after, model, _ = checks.short_fit(toy_attention, corpus, attention_options={"scale": 2.0})
    assert after < before - 0.5, (before, after)
    assert model.transformer.blocks[0].attn.scale == 2.0


@pytest.mark.parametrize("rope", [False, True])
def test_mha_equals_naive_softmax_attention(rope):
    attn = build("mha", rope=rope)
    assert (attn.n_query_heads, attn.n_kv_heads) == (8, 8)
    x = torch.randn(3, 16, 32)
    torch.testing.assert_close(attn(x), grouped_reference(attn, x))


@pytest.mark.parametrize("name", ["gqa", "mqa", "sqa", "ssqa", "xsqa", "xsmqa"])
def test_grouped_variants_equal_explicit_kv_repeat(name):
    attn = build(name, rope=True)
    x = torch.randn(3, 16, 32)
    torch.testing.assert_close(attn(x), grouped_reference(attn, x))


@pytest.mark.parametrize(
    "name,expected", [("mha", (8, 8)), ("gqa", (8, 2)), ("mqa", (8, 1)), ("sqa", (4, 2)),
                      ("ssqa", (4, 4)), ("xsqa", (2, 2)), ("xsmqa", (2, 1))],
)
def test_presets_follow_the_readme_table(name, expected):
    attn = build(name)
    assert (attn.n_query_heads, attn.n_kv_heads) == expected
    hs = 32 // 8
    assert attn.qkv.out_features == expected[0] * hs + 2 * expected[1] * hs
    assert attn.out_proj.in_features == expected[0] * hs


def test_explicit_head_counts_override_preset():
    attn = build("sqa", n_query_heads=8, n_kv_heads=4)
    assert (attn.n_query_heads, attn.n_kv_heads) == (8, 4)


def test_noq_single_head_equals_attention_with_identity_query():
    noq = build("noq", n_head=1)
    ref = build("mha", n_head=1)
    with torch.no_grad():
        C = 32
        ref.qkv.weight[:C] = torch.eye(C)
        ref.qkv.weight[C:] = noq.kv.weight
        ref.out_proj.weight.copy_(noq.out_proj.weight)
    x = torch.randn(2, 16, C)
    torch.testing.assert_close(noq(x), ref(x))
    n_proj = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n_proj(noq) == 3 * C * C and n_proj(ref) == 4 * C * C  # 3/4 of the projection parameters


def test_noq_multi_head_uses_input_slices_as_queries():
    noq = build("noq", n_head=4, rope=True)
    ref = build("mha", n_head=4, rope=True)
    with torch.no_grad():
        ref.qkv.weight[:32] = torch.eye(32)
        ref.qkv.weight[32:] = noq.kv.weight
        ref.out_proj.weight.copy_(noq.out_proj.weight)
    x = torch.randn(2, 16, 32)
    torch.testing.assert_close(noq(x), ref(x))


def test_noq_rejects_query_head_override():
    with pytest.raises(ValueError, match="n_query_heads must equal n_head"):
        build("noq", n_query_heads=2)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(n_embd=30, n_head=8), r"n_embd=30 is not divisible by n_head=8"),
        (dict(n_query_heads=3), r"n_query_heads=3 must divide n_head=8"),
        (dict(n_query_heads=16), r"n_query_heads=16 must divide n_head=8"),
        (dict(n_query_heads=4, n_kv_heads=8), r"n_query_heads=4 is smaller than n_kv_heads=8"),
        (dict(n_query_heads=4, n_kv_heads=3), r"n_query_heads=4 is not divisible by n_kv_heads=3"),
        (dict(n_kv_heads=0), r"n_kv_heads must be a positive integer"),
        (dict(n_head=0), r"n_head must be a positive integer"),
    ],
)
def test_invalid_heads_raise_precise_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        build("mha", **overrides)


@pytest.mark.parametrize("name", [n for n in PRESETS if n != "mha"])
def test_preset_needs_divisible_head_count(name):
    if name == "mqa":
        build(name, n_embd=30, n_head=6)  # Hq = H, Hkv = 1: any H works
        return
    with pytest.raises(ValueError, match=rf"attention '{name}' uses n_\w+ = n_head/\d, which needs n_head divisible"):
        build(name, n_embd=30, n_head=6 if name != "ssqa" else 3)


def test_rope_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(head_size=8, block_size=32)
    q, k = torch.randn(8), torch.randn(8)
    def score(m, n):
        qs = torch.zeros(1, 1, 32, 8)
        ks = torch.zeros(1, 1, 32, 8)
        qs[0, 0, m] = q
        ks[0, 0, n] = k
        return (rope(qs)[0, 0, m] @ rope(ks)[0, 0, n]).item()
    assert score(5, 2) == pytest.approx(score(20, 17), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 4), abs=1e-3)


def test_sdpa_gets_grouped_kv_without_repeat(monkeypatch):
    seen = []
    real = F.scaled_dot_product_attention
    def spy(q, k, v, **kw):
        seen.append((q.shape[1], k.shape[1], kw.get("enable_gqa")))
        return real(q, k, v, **kw)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    build("sqa")(torch.randn(1, 16, 32))
    assert seen == [(4, 2, True)]  # K/V keep their 2 heads; the kernel does the grouping


class RunningSum(DecodingState):
    """A fixed-size decoding state: the sum of the values seen so far, and how many."""

    def __init__(self, batch, width, dtype, device):
        self.total = torch.zeros(batch, 1, width, dtype=dtype, device=device)
        self.count = 0


class RunningSumLayout:
    def __init__(self, width):
        self.width = width

    def new(self, batch, length, dtype, device):
        return RunningSum(batch, self.width, dtype, device)

    def values(self, length):
        return self.width  # however long the sequence: no per-token cache


class RecurrentMeanAttention(nn.Module):
    """The causal running mean of the values, decoded from a state that does not grow with the sequence."""

    def __init__(self, n_embd, bias=False, **_):
        super().__init__()
        self.v = nn.Linear(n_embd, n_embd, bias=bias)
        self.out_proj = nn.Linear(n_embd, n_embd, bias=bias)

    def forward(self, x, state=None):
        v = self.v(x)  # (B, T, C)
        prefix = v.cumsum(1)
        start = 0
        if state is not None:
            prefix = prefix + state.total
            start = state.count
            state.total, state.count = prefix[:, -1:], state.count + x.size(1)
        counts = torch.arange(start + 1, start + x.size(1) + 1, device=x.device, dtype=v.dtype)[:, None]
        return self.out_proj(prefix / counts)

    @classmethod
    def decoding_state(cls, n_embd, **_):
        return RunningSumLayout(n_embd)


def test_a_fixed_size_recurrent_state_decodes_and_is_counted():
    """The declared state need not be a per-token cache: one of constant size decodes exactly, and the counts
    read its size from the layout (constant per sequence)."""
    register_attention("toy_recurrent", RecurrentMeanAttention, rope=False)
    try:
        check_attention("toy_recurrent")
        checks.assert_decoding_matches("toy_recurrent", pos="learned")
        config = GPTConfig(vocab_size=10, attention="toy_recurrent", n_layer=2, n_embd=32, n_head=4)
        assert cache_values_per_sequence(config, 3) == cache_values_per_sequence(config, 100) == 2 * 32
        assert sum(s.nbytes for s in Transformer(config).new_cache(1, 50)) == 2 * 32 * 4
    finally:
        unregister_attention("toy_recurrent")
