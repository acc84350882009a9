"""Quantum self-attention with a decoding cache: prefill plus token-by-token decoding reproduces the
full forward, for the layer alone and inside the model, and cached generation equals uncached."""

import pytest
import torch

from lit_attn import GPTConfig, Transformer
from lit_attn.attention import build_attention, get_attention

VARIANTS = ["qsa", "qsa_fixed"]
NORMS = ["average", "softmax"]


def layer_and_cache(name, normalization, n_head, batch, length, n_embd=8, block_size=12):
    common = dict(n_embd=n_embd, n_head=n_head, n_query_heads=None, n_kv_heads=None, block_size=block_size,
                  dropout=0.0, bias=True, qkv_bias=None, rope=False)
    options = {"normalization": normalization}
    attn = build_attention(name, options, **common).eval()
    spec = get_attention(name)
    layout = spec.state(**spec.arguments(options, common))
    return attn, layout.new(batch, length, torch.float32, "cpu")


def decode(attn, x, state, positions):
    """One decoding step of the layer alone: the tokens x at `positions`, through `state`."""
    state.step(positions)
    return attn(x, state)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("normalization", NORMS)
@pytest.mark.parametrize("n_head", [1, 2])
@pytest.mark.parametrize("length", [10, 12])  # a cache longer than the sequence, and one exactly as long
def test_prefill_then_decode_equals_full_forward(name, normalization, n_head, length):
    torch.manual_seed(0)
    B, P, T = 2, 4, 10
    attn, cache = layer_and_cache(name, normalization, n_head, B, length)
    x = torch.randn(B, T, 8)
    with torch.no_grad():
        full = attn(x)  # (B, T, C)
        steps = [decode(attn, x[:, :P], cache, torch.arange(P))]
        steps += [decode(attn, x[:, t : t + 1], cache, torch.tensor([t])) for t in range(P, T)]
    assert all(s.shape == (B, s.size(1), 8) for s in steps)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-6)
    # The cache holds the key and value readouts of every token, at its position.
    q, k, v = attn.readouts(x)  # (B, H, T), (B, H, T), (B, H, T, d)
    torch.testing.assert_close(cache["k"][:, :T], k.transpose(1, 2), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cache["v"][:, :T], v.transpose(1, 2), rtol=1e-5, atol=1e-6)


def test_per_token_decoding_uses_the_circuits_of_each_position():
    torch.manual_seed(0)
    attn, cache = layer_and_cache("qsa", "average", 1, 1, 8, n_embd=4, block_size=8)
    x = torch.randn(1, 8, 4)
    with torch.no_grad():
        decode(attn, x[:, :5], cache, torch.arange(5))
        before = decode(attn, x[:, 5:6], cache, torch.tensor([5]))
        attn.circuit_angles()[5].add_(1.0)
        after = decode(attn, x[:, 5:6], cache, torch.tensor([5]))
        assert not torch.allclose(before, after)
        torch.testing.assert_close(after, attn(x[:, :6])[:, 5:], rtol=1e-5, atol=1e-6)


def test_cache_longer_than_the_per_token_circuits_is_refused():
    attn, cache = layer_and_cache("qsa", "average", 1, 1, 9, n_embd=4, block_size=8)
    with pytest.raises(ValueError, match="block_size"):
        decode(attn, torch.randn(1, 1, 4), cache, torch.tensor([0]))


def test_qsa_fixed_decodes_past_block_size():
    torch.manual_seed(0)
    attn, cache = layer_and_cache("qsa_fixed", "softmax", 2, 2, 12, block_size=6)
    x = torch.randn(2, 12, 8)
    with torch.no_grad():
        full = attn(x)
        steps = [decode(attn, x[:, :3], cache, torch.arange(3))]
        steps += [decode(attn, x[:, t : t + 1], cache, torch.tensor([t])) for t in range(3, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("normalization", NORMS)
def test_model_decoding_and_generation_match_the_full_forward(name, normalization):
    torch.manual_seed(0)
    total, prompt = 16, 5
    config = GPTConfig(vocab_size=20, attention=name, attention_options={"normalization": normalization},
                       n_layer=2, n_embd=8, n_head=1, block_size=total)
    model = Transformer(config).eval()
    idx = torch.randint(0, 20, (2, total))
    with torch.no_grad():
        full = model(idx)  # (B, T, V)
        cache = model.new_cache(2)
        steps = [model(idx[:, :prompt], cache, torch.arange(prompt))]
        steps += [model(idx[:, t : t + 1], cache, torch.tensor([t])) for t in range(prompt, total)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-6)
    start = idx[:, :prompt]
    new = total + 4 - prompt  # 4 tokens past block_size, where both crop the context
    cached = model.generate(start, new, temperature=0, use_cache=True)
    uncached = model.generate(start, new, temperature=0, use_cache=False)
    assert cached.shape == (2, total + 4) and torch.equal(cached, uncached)
