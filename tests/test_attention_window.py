"""Sliding-window attention and learned sinks on the softmax families: the band of positions each query sees,
decoding through a ring buffer (cached = uncached, memory flat past the window), FLOPs capped at the window."""

import attention_checks as checks
import pytest
import torch
import torch.nn.functional as F

from lit_attn import GPTConfig, Transformer
from lit_attn.analytic import attention_flops_per_token, cache_values_per_sequence
from lit_attn.attention import build_attention, get_attention
from lit_attn.attention.window import windowed_attention, windowed_reference
from lit_attn.testing import check_attention

COMMON = dict(n_embd=32, n_head=4, n_query_heads=None, n_kv_heads=None, block_size=16, dropout=0.0, bias=False,
              qkv_bias=None, rope=True)
WINDOWED = [("mha", {"window": 4}), ("gqa", {"window": 5}), ("xsmqa", {"window": 3, "sinks": True}),
            ("sqa", {"window": 6}), ("noq", {"window": 4}), ("noq", {"window": 4, "sinks": True}),
            ("mqa", {"sinks": True})]


def naive(attn, x, window, sinks=None):
    """Dense softmax attention with an explicit band mask and sink column: the definition."""
    B, T, _ = x.shape
    hq, hkv, hs = attn.n_query_heads, attn.n_kv_heads, attn.head_size
    q, k, v = attn.qkv(x).split([hq * hs, hkv * hs, hkv * hs], -1)
    q, k, v = (t.view(B, T, -1, hs).transpose(1, 2) for t in (q, k, v))
    if attn.rope is not None:
        q, k = attn.rope(q), attn.rope(k)
    k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
    scores = q @ k.transpose(-2, -1) / hs**0.5
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    scores = scores.masked_fill((j > i) | (j <= i - window), float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks.view(1, -1, 1, 1).expand(B, hq, T, 1)], -1)
    y = scores.softmax(-1)[..., :T] @ v
    return attn.out_proj(y.transpose(1, 2).reshape(B, T, hq * hs))


@pytest.mark.parametrize("name, options", WINDOWED)
def test_windowed_attentions_pass_check_attention(name, options):
    check_attention(name, options)


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("window", [3, 8, 16, 40])
def test_window_is_the_band_of_the_last_window_positions(window, sinks):
    torch.manual_seed(0)
    attn = build_attention("gqa", {"window": window, "sinks": sinks}, **COMMON).eval()
    if sinks:
        torch.nn.init.normal_(attn.sinks)
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), naive(attn, x, window, attn.sinks), rtol=1e-5, atol=1e-5)


def test_a_position_outside_the_window_changes_nothing():
    attn = build_attention("mha", {"window": 4}, **COMMON).eval()
    x = torch.randn(1, 12, 32)
    changed = x.clone()
    changed[:, 3] += 1.0
    with torch.no_grad():
        y, z = attn(x), attn(changed)
    assert torch.equal(y[:, 7:], z[:, 7:]) and not torch.allclose(y[:, 3:7], z[:, 3:7])


@pytest.mark.parametrize("hq, hkv", [(4, 4), (4, 2), (2, 1)])
@pytest.mark.parametrize("sinks", [False, True])
def test_the_measured_reference_equals_the_sdpa_kernel(hq, hkv, sinks):
    """The gathered form the FLOP count measures on the meta device computes the same function as SDPA."""
    q, k, v = torch.randn(2, hq, 10, 8), torch.randn(2, hkv, 10, 8), torch.randn(2, hkv, 10, 8)
    s = torch.randn(hq) if sinks else None
    expected = windowed_attention(q, k.transpose(1, 2), v.transpose(1, 2), 4, s, 0.0, None)
    torch.testing.assert_close(windowed_reference(q, k, v, 4, s, 0.0), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["mha", "gqa", "noq"])
def test_derived_flops_per_token_stop_growing_past_the_window(name):
    spec = get_attention(name)
    args = spec.arguments({"window": 8}, {k: v for k, v in COMMON.items() if k != "rope"} | {"block_size": 64})
    measured = [spec.derived(t, **args)[2] for t in (4, 8, 16, 32, 64)]
    assert measured[0].total < measured[1].total == measured[2].total == measured[3].total == measured[4].total
    assert measured[4].quadratic == 4 * spec.heads(**args)[0] * 8 * 8  # 4 Hq hs W: each query's window only
    assert [spec.flops(t, **args) for t in (4, 8, 16, 32, 64)] == measured  # the analytic count agrees
    full = spec.arguments(None, {k: v for k, v in COMMON.items() if k != "rope"} | {"block_size": 64})
    assert spec.derived(64, **full)[2].total > spec.derived(32, **full)[2].total  # without a window: grows


def test_mfu_counts_the_windows_flops():
    windowed = GPTConfig(vocab_size=40, attention="mha", attention_options={"window": 8}, n_layer=1, n_embd=32,
                         n_head=4, block_size=64)
    assert attention_flops_per_token(windowed, 64) == attention_flops_per_token(windowed, 8)


@pytest.mark.parametrize("name, options", WINDOWED)
def test_decode_memory_per_sequence_is_flat_past_the_window(name, options):
    config = GPTConfig(vocab_size=40, attention=name, attention_options=options, n_layer=2, n_embd=32, n_head=4,
                       block_size=16)
    window = options.get("window")
    model = Transformer(config)
    held = [sum(s.nbytes for s in model.new_cache(1, n)) for n in (2, 6, 10, 16)]
    analytic = [4 * cache_values_per_sequence(config, n) for n in (2, 6, 10, 16)]
    assert held == analytic
    if window is None:  # sinks alone: a full cache
        assert held[0] < held[1] < held[2] < held[3]
    else:
        assert held[0] < held[1] and len({h for h, n in zip(held, (2, 6, 10, 16)) if n >= window}) == 1


@pytest.mark.parametrize("name, options", WINDOWED)
def test_cached_decoding_equals_the_full_forward(name, options):
    """A prompt longer than the window, single steps, then a chunk of 3 (the ring read before it is written):
    the logits of every position equal the full forward's; cached and uncached generation agree."""
    torch.manual_seed(0)
    model = Transformer(GPTConfig(vocab_size=40, attention=name, attention_options=options, n_layer=2, n_embd=32,
                                  n_head=4, block_size=16, pos="rope")).eval()
    for layer in model.blocks:
        if layer.attn.sinks is not None:
            torch.nn.init.normal_(layer.attn.sinks)
    idx = torch.randint(0, 40, (2, 16))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2)
        steps = [model(idx[:, :7], cache, torch.arange(7))]
        steps += [model(idx[:, t : t + 1], cache, torch.tensor([t])) for t in range(7, 12)]
        steps += [model(idx[:, 12:15], cache, torch.arange(12, 15)), model(idx[:, 15:], cache, torch.tensor([15]))]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    start = idx[:, :5]
    cached = model.generate(start, 15, temperature=0)  # 4 tokens past block_size
    assert torch.equal(cached, model.generate(start, 15, temperature=0, use_cache=False))


@pytest.mark.parametrize("window", [0, 1, -3, 2.5, True, "8"])
def test_a_window_that_is_not_an_integer_of_at_least_2_is_refused(window):
    with pytest.raises(ValueError, match=r"option window \(--model.attention_options\) must be an integer >= 2"):
        build_attention("mha", {"window": window}, **COMMON)


def test_a_windowed_model_trains(corpus):
    before, after, model, _ = checks.short_fit("gqa", corpus, attention_options={"window": 4, "sinks": True},
                                               n_head=4, n_embd=16)
    assert after < before - 0.5, (before, after)
    assert model.transformer.blocks[0].attn.window == 4


def test_sinks_take_weight_off_the_tokens():
    """A very negative sink is no sink; a very positive one takes all the weight: the output is 0."""
    attn = build_attention("mha", {"sinks": True}, **COMMON).eval()
    plain = build_attention("mha", None, **COMMON).eval()
    plain.load_state_dict(attn.state_dict(), strict=False)
    x = torch.randn(1, 8, 32)
    with torch.no_grad():
        attn.sinks.fill_(-1e4)
        torch.testing.assert_close(attn(x), plain(x), rtol=1e-5, atol=1e-6)
        attn.sinks.fill_(1e4)
        torch.testing.assert_close(attn(x), F.linear(torch.zeros(1, 8, 32), attn.out_proj.weight))
