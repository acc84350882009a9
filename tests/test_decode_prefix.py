"""Cached decoding reads only the filled prefix of the cache: a prompt, then single steps, into a cache
shorter than block_size whose unwritten slots hold NaN, gives the full forward's logits for every attention
with a cache; the length comes from the caller (`generate`) or from the positions."""

import pytest
import torch

from lit_attn import GPTConfig, Transformer
from lit_attn.attention import attention_names, get_attention
from lit_attn.attention.kernels import causal_attention
from lit_attn.attention.state import KVLayout
from lit_attn.decoding import LAYOUT_MIN_TOKENS, decoding_layout, has_onednn_linear

# The attentions whose state keeps buffers per past token (a recurrent state has no unwritten slots to read).
CACHED = [n for n in attention_names() if isinstance(get_attention(n).state(**get_attention(n).arguments(
    None, {"n_embd": 32, "n_head": 4, "block_size": 16})), KVLayout)]


def model_for(name: str, pos: str = "learned") -> Transformer:
    torch.manual_seed(0)
    return Transformer(GPTConfig(vocab_size=40, attention=name, n_layer=2, n_embd=32, n_head=4, block_size=16,
                                 pos=pos)).eval()


def nan_cache(model: Transformer, batch: int, length: int) -> list:
    """A cache whose every slot is NaN until written: reading one past the filled prefix poisons the output."""
    cache = model.new_cache(batch, length)
    for layer in cache:
        for buffer in layer.buffers.values():
            buffer.fill_(float("nan"))
    return cache


@pytest.mark.parametrize("name", CACHED)
def test_prompt_then_steps_read_only_the_filled_prefix(name):
    model = model_for(name, "rope" if get_attention(name).rope else "learned")
    idx = torch.randint(0, 40, (2, 12))
    with torch.no_grad():
        full = model(idx)  # (B, T, V)
        cache = nan_cache(model, 2, 12)  # shorter than block_size 16
        steps = [model(idx[:, :5], cache, torch.arange(5), length=5)]
        # Odd positions pass the length, even ones leave the model to read it from the positions.
        steps += [model(idx[:, t : t + 1], cache, torch.tensor([t]), length=t + 1 if t % 2 else None)
                  for t in range(5, 12)]
    got = torch.cat(steps, dim=1)
    assert torch.isfinite(got).all(), f"{name} read an unwritten cache slot"
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["mha", "qsa"])
def test_a_chunk_after_the_prompt_attends_causally_within_it(name):
    """T > 1 new tokens that do not start at 0 (a prompt fed in two parts) need the mask over the prefix."""
    model = model_for(name)
    idx = torch.randint(0, 40, (1, 10))
    with torch.no_grad():
        full = model(idx)
        cache = nan_cache(model, 1, 10)
        first = model(idx[:, :4], cache, torch.arange(4))
        rest = model(idx[:, 4:], cache, torch.arange(4, 10))
    torch.testing.assert_close(torch.cat([first, rest], 1), full, rtol=1e-5, atol=1e-5)


def test_a_prefill_attends_over_its_own_keys_alone(monkeypatch):
    """Positions 0..T-1 into an empty cache: plain causal attention on the new keys, no mask over the buffer;
    a step of one token on a CPU: two matmuls over the filled keys (see single_query_attention)."""
    import lit_attn.attention.kernels as kernels

    calls = []
    sdpa, single = torch.nn.functional.scaled_dot_product_attention, kernels.single_query_attention

    def spy(q, k, v, **kw):
        calls.append((k.size(2), kw["attn_mask"], kw["is_causal"]))
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(kernels, "single_query_attention", lambda q, k, v: calls.append(("single", k.size(2))) or
                        single(q, k, v))
    q, k, v = torch.randn(3, 2, 6, 32).unbind(0)
    cache = KVLayout({"k": (4, 8), "v": (4, 8)}).new(2, 16, torch.float32, "cpu")
    cache.step(torch.arange(6))
    causal_attention(q, k, v, 8, None, 0.0, cache)
    cache.step(torch.tensor([6]), 7)
    causal_attention(q[:, :1], k[:, :1], v[:, :1], 8, None, 0.0, cache)
    assert calls == [(6, None, True), ("single", 7)]  # prefill: 6 keys, causal; a step: the 7 filled


@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (4, 1), (2, 1)])
def test_single_query_attention_is_sdpa_with_grouped_heads(hq, hkv):
    from lit_attn.attention.kernels import single_query_attention

    q, k, v = torch.randn(3, hq, 1, 16), torch.randn(3, hkv, 10, 16), torch.randn(3, hkv, 10, 16)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)
    torch.testing.assert_close(single_query_attention(q, k, v), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["gqa", "noq", "qsa_fixed"])
def test_generate_uses_a_cache_as_long_as_the_generation(name, monkeypatch):
    """The cache is sized to prompt + new tokens (less to zero than block_size); the tokens equal uncached ones."""
    model = model_for(name)
    sizes = []
    new_cache = model.new_cache
    monkeypatch.setattr(model, "new_cache", lambda b, n=None: sizes.append(n) or new_cache(b, n))
    start = torch.randint(0, 40, (3, 4))
    cached = model.generate(start, 6, temperature=0)
    assert sizes == [9] and cached.shape == (3, 10) and torch.equal(cached[:, :4], start)
    assert torch.equal(cached, model.generate(start, 6, temperature=0, use_cache=False))


def test_decoding_layout_keeps_the_values_and_restores_the_weights():
    model = model_for("mha")
    weights = {name: (p.data_ptr(), p.detach().clone()) for name, p in model.named_parameters()}
    onednn = torch.backends.mkldnn.enabled
    with decoding_layout(model):
        assert not torch.backends.mkldnn.enabled  # ATen's GELU, not oneDNN's
        moved = [name for name, p in model.named_parameters() if not p.is_contiguous()]
        assert all(torch.equal(p, weights[name][1]) for name, p in model.named_parameters())
    assert "blocks.0.attn.qkv.weight" in moved and "tok_emb.weight" not in moved  # the tied head stays
    # Only weights with more outputs than inputs: a contiguous run along the longer side.
    assert "blocks.0.ffn.in_proj.weight" in moved and "blocks.0.ffn.out_proj.weight" not in moved
    assert "blocks.0.attn.out_proj.weight" not in moved
    assert torch.backends.mkldnn.enabled == onednn
    assert all(p.data_ptr() == weights[name][0] and p.is_contiguous() for name, p in model.named_parameters())
    start = torch.randint(0, 40, (2, 3))
    long = model.generate(start, LAYOUT_MIN_TOKENS, temperature=0)  # in the layout
    assert torch.equal(long[:, :8], model.generate(start, 5, temperature=0))  # not in it


@pytest.mark.skipif(not has_onednn_linear(), reason="this torch build has no oneDNN linear")
@pytest.mark.parametrize("rows,threads", [(3, 1), (1, 2)])
def test_decoding_layout_prepacks_the_linears_for_several_rows_or_threads(rows, threads, monkeypatch):
    """More rows or threads: each plain nn.Linear runs oneDNN on a prepacked copy for inputs of `rows` rows,
    with F.linear's values; other inputs run F.linear; a subclass keeps its own forward; all restored on exit."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    model = model_for("mha")

    class Scaled(torch.nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    ffn = model.blocks[1].ffn
    ffn.in_proj.__class__ = Scaled
    qkv, x = model.blocks[0].attn.qkv, torch.randn(rows, 1, 32)
    with torch.no_grad():
        expected, expected_ffn = qkv(x), ffn.in_proj(x)
        with decoding_layout(model, rows=rows):
            assert "forward" in vars(qkv) and "forward" not in vars(ffn.in_proj)
            assert qkv.weight.is_contiguous()  # not the one-row layout
            torch.testing.assert_close(qkv(x), expected, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(qkv(x[:, :0]), expected[:, :0])
            torch.testing.assert_close(qkv(torch.cat([x, x], 1)), torch.cat([expected, expected], 1))
            torch.testing.assert_close(ffn.in_proj(x), expected_ffn)
    assert not any("forward" in vars(m) for m in model.modules())
    ffn.in_proj.__class__ = torch.nn.Linear
    start = torch.randint(0, 40, (rows, 3))
    long = model.generate(start, LAYOUT_MIN_TOKENS, temperature=0)  # in the layout
    assert torch.equal(long[:, :8], model.generate(start, 5, temperature=0))  # not in it


@pytest.mark.skipif(not has_onednn_linear(), reason="this torch build has no oneDNN linear")
def test_decoding_layout_restores_everything_when_it_fails_part_way(monkeypatch):
    import lit_attn.decoding as decoding

    model, calls = model_for("mha"), []
    real = decoding._prepacked_forward

    def failing(m, rows):
        calls.append(m)
        if len(calls) == 3:
            raise RuntimeError("no memory for the packed copy")
        return real(m, rows)

    monkeypatch.setattr(decoding, "_prepacked_forward", failing)
    onednn = torch.backends.mkldnn.enabled
    with pytest.raises(RuntimeError, match="packed copy"), decoding_layout(model, rows=2):
        pass
    assert len(calls) == 3 and not any("forward" in vars(m) for m in model.modules())
    assert all(p.is_contiguous() for p in model.parameters()) and torch.backends.mkldnn.enabled == onednn
