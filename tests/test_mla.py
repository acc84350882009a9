"""Multi-head latent attention (`mla`): DeepSeek-V2's counts, the absorbed decode, transformers' DeepSeek-V2
attention on the same weights, and a fit."""

import importlib.util
import math

import pytest
import torch
from helpers import scalars

from lit_attn import GPTConfig, Transformer
from lit_attn.analytic import cache_values_per_token
from lit_attn.attention import build_attention, get_attention
from lit_attn.attention.mla import MultiHeadLatentAttention
from lit_attn.cli.lightning_cli import cli, main
from lit_attn.testing import check_attention

# DeepSeek-V2-Lite's attention (hidden 2048, 16 heads) and DeepSeek-V2's (hidden 5120, 128 heads, q_lora_rank 1536).
V2_LITE = dict(n_embd=2048, n_head=16, options=dict(kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128,
                                                    qk_rope_head_dim=64, v_head_dim=128))
V2 = dict(n_embd=5120, n_head=128, options=dict(kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128,
                                                qk_rope_head_dim=64, v_head_dim=128))
HAS_DEEPSEEK = importlib.util.find_spec("transformers.models.deepseek_v2") is not None


def paper_parameters(n_embd, n_head, kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim):
    """Section 2.1's matrices, term by term (d, n_h, d_c, d_c', d_h, d_h^R), plus the RMSNorm gains on c^KV and c^Q."""
    d, nh, dc, dq, dh, dr, dv = (n_embd, n_head, kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
                                 v_head_dim)
    query = d * nh * (dh + dr) if dq is None else d * dq + dq + dq * nh * dh + dq * nh * dr  # W^Q | W^DQ, W^UQ, W^QR
    keys_values = d * dc + dc + dc * nh * dh + dc * nh * dv + d * dr  # W^DKV, norm, W^UK, W^UV, W^KR
    return query + keys_values + nh * dv * d  # W^O


@pytest.mark.parametrize("shapes", [V2_LITE, V2], ids=["v2-lite", "v2"])
def test_parameters_equal_the_papers_formula_at_deepseek_shapes(shapes):
    with torch.device("meta"):
        module = build_attention("mla", shapes["options"], n_embd=shapes["n_embd"], n_head=shapes["n_head"])
    expected = paper_parameters(shapes["n_embd"], shapes["n_head"], **shapes["options"])
    spec = get_attention("mla")
    args = spec.arguments(shapes["options"], {"n_embd": shapes["n_embd"], "n_head": shapes["n_head"]})
    assert sum(p.numel() for p in module.parameters()) == spec.params(**args) == expected
    if shapes is V2_LITE:
        assert expected == 13_763_072  # 6,291,456 (W^Q) + 1,180,160 (W^DKV, W^KR, norm) + 2,097,152 + 4,194,304


@pytest.mark.skipif(not HAS_DEEPSEEK, reason="transformers has no DeepSeek-V2 model")
def test_parameters_equal_transformers_deepseek_attention_at_v2_lite_shapes():
    with torch.device("meta"):
        ours = build_attention("mla", V2_LITE["options"], n_embd=2048, n_head=16)
        theirs = deepseek_attention(2048, 16, **V2_LITE["options"])
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())


@pytest.mark.parametrize("n_layer", [1, 27])
def test_cache_holds_the_latent_and_the_rope_key_per_token(n_layer):
    """kv_lora_rank + qk_rope_head_dim values per token and layer (576 at DeepSeek-V2's shapes), whatever the heads."""
    config = GPTConfig(vocab_size=100, attention="mla", attention_options=V2_LITE["options"], n_layer=n_layer,
                       n_embd=2048, n_head=16, block_size=64, pos="rope")
    assert cache_values_per_token(config) == n_layer * 576
    assert cache_values_per_token(GPTConfig(**{**vars(config), "n_head": 32})) == n_layer * 576


def test_the_models_cache_buffers_hold_what_the_layout_says():
    model = Transformer(GPTConfig(vocab_size=20, attention="mla", n_layer=2, n_embd=32, n_head=4, block_size=16))
    cache = model.new_cache(batch=3)
    assert sum(t.numel() for layer in cache for t in layer.buffers.values()) == \
        3 * 16 * cache_values_per_token(model.config)
    assert {k: tuple(t.shape) for k, t in cache[0].buffers.items()} == {"c_kv": (3, 16, 32), "k_rope": (3, 16, 4)}


@pytest.mark.parametrize("options", [None, {"q_lora_rank": 12},
                                     {"kv_lora_rank": 6, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2,
                                      "v_head_dim": 10}])
@pytest.mark.parametrize("bias", [False, True])
def test_check_attention(options, bias):
    check_attention("mla", options, bias=bias)


@pytest.mark.parametrize("options", [None, {"q_lora_rank": 12}])
def test_absorbed_attention_equals_the_expanded_one(options):
    """Over a whole sequence, causally masked: W_UK folded into the queries and W_UV after the latent sum equal the
    per-head keys and values."""
    torch.manual_seed(0)
    module = build_attention("mla", options, n_embd=32, n_head=4, block_size=16, rope=True).eval()
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        q_nope, q_rope = module.queries(x, None)
        c_kv, k_rope = module.latents(x, None)
        causal = torch.ones(16, 16, dtype=torch.bool).tril()
        absorbed = module.absorbed_attention(q_nope, q_rope, c_kv, k_rope, causal)
        expanded = module.expanded_attention(q_nope, q_rope, c_kv, k_rope)
    torch.testing.assert_close(absorbed, expanded, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options", [None, {"q_lora_rank": 12}])
@pytest.mark.parametrize("pos", ["rope", "learned"])
def test_logits_of_the_absorbed_decode_equal_the_full_forward(options, pos, monkeypatch):
    """A one-token prefill, then every token through the absorbed path alone (the expanded one is never called)."""
    torch.manual_seed(0)
    model = Transformer(GPTConfig(vocab_size=40, attention="mla", attention_options=options, n_layer=2, n_embd=32,
                                  n_head=4, block_size=12, pos=pos)).eval()
    with torch.no_grad():  # weights larger than the model's initial ones: scores far from uniform
        for block in model.blocks:
            for p in block.attn.parameters():
                p.normal_(0, 0.3)
    idx = torch.randint(0, 40, (2, 12))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2)
        steps = [model(idx[:, :1], cache, torch.arange(1))]
        monkeypatch.setattr(MultiHeadLatentAttention, "expanded_attention", None)  # a call would raise TypeError
        steps += [model(idx[:, t : t + 1], cache, torch.tensor([t])) for t in range(1, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options, message", [
    ({"qk_rope_head_dim": 3}, "qk_rope_head_dim must be even"),
    ({"kv_lora_rank": 0}, "kv_lora_rank must be a positive integer, got 0"),
    ({"q_lora_rank": -1}, "q_lora_rank must be a positive integer, got -1"),
    ({"v_head_dim": True}, "v_head_dim must be a positive integer, got True"),
])
def test_bad_sizes_are_refused_in_one_line(options, message):
    with pytest.raises(ValueError, match=message) as raised:
        build_attention("mla", options, n_embd=32, n_head=4)
    assert "\n" not in str(raised.value)


def test_a_bad_option_on_the_command_line_exits_2_with_one_line(tmp_path, corpus, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = cli(["fit", "--model.attention=mla", "--model.attention_options", '{"qk_rope_head_dim": 3}',
                f"--data.path={corpus}", "--model.n_layer=1"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("error: attention 'mla': qk_rope_head_dim must be even (RoPE rotates "
                                            "channel pairs), got 3; set an even one in --model.attention_options")
    assert not (tmp_path / "runs").exists()


def test_a_tiny_fit_trains(tmp_path, corpus, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--model.attention=mla", "--model.pos=rope", f"--data.path={corpus}", "--run=mla",
          "--model.n_layer=1", "--model.n_embd=32", "--model.n_head=4", "--model.block_size=16", "--model.lr=1e-2",
          "--trainer.max_steps=40", "--trainer.log_every_n_steps=1", "--trainer.val_check_interval=40",
          "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false", "--samples.max_new_tokens=2"])
    losses = [value for _, value in scalars(tmp_path / "runs" / "mla", "train/loss")]
    assert len(losses) >= 30 and all(math.isfinite(v) for v in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3, losses  # nats per character


# ---- transformers' DeepSeek-V2 attention on the same weights ----

def deepseek_attention(n_embd, n_head, kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                       block_size=64):
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as ds

    config = ds.DeepseekV2Config(
        vocab_size=32, hidden_size=n_embd, num_attention_heads=n_head, num_key_value_heads=n_head,
        num_hidden_layers=1, kv_lora_rank=kv_lora_rank, q_lora_rank=q_lora_rank, qk_nope_head_dim=qk_nope_head_dim,
        qk_rope_head_dim=qk_rope_head_dim, v_head_dim=v_head_dim, max_position_embeddings=block_size,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, attention_bias=False, rms_norm_eps=1e-6)
    config._attn_implementation = "eager"
    return ds.DeepseekV2Attention(config, layer_idx=0)


def interleaved(rows: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """Rows of a RoPE part in DeepSeek's order. lit-attn rotates the pairs (i, i + rope/2) (rotate-half), DeepSeek-V2
    the pairs (2i, 2i + 1) (complex numbers), both by angle position * base^(-2i/rope): moving row i to 2i and row
    i + rope/2 to 2i + 1 makes the two rotations the same."""
    half = rope_dim // 2
    order = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()
    return rows[order]


def load_into_deepseek(ours: MultiHeadLatentAttention, theirs) -> None:
    """Copy `ours`'s weights into transformers' DeepseekV2Attention, the RoPE rows reordered (see `interleaved`)."""
    H, nope, rope = ours.n_head, ours.nope, ours.rope_dim

    def query_rows(w: torch.Tensor) -> torch.Tensor:  # per head [no-RoPE, RoPE] rows
        w = w.view(H, nope + rope, -1)
        return torch.cat([w[:, :nope], torch.stack([interleaved(h, rope) for h in w[:, nope:]])], 1).flatten(0, 1)

    with torch.no_grad():
        if ours.q_lora_rank is None:
            theirs.q_proj.weight.copy_(query_rows(ours.q_proj.weight))
        else:
            theirs.q_a_proj.weight.copy_(ours.q_down.weight)
            theirs.q_a_layernorm.weight.copy_(ours.q_norm.weight)
            theirs.q_b_proj.weight.copy_(query_rows(ours.q_up.weight))
        latent, key = ours.kv_down.weight.split([ours.kv_lora_rank, rope])
        theirs.kv_a_proj_with_mqa.weight.copy_(torch.cat([latent, interleaved(key, rope)]))
        theirs.kv_a_layernorm.weight.copy_(ours.kv_norm.weight)
        theirs.kv_b_proj.weight.copy_(ours.kv_up.weight)
        theirs.o_proj.weight.copy_(ours.out_proj.weight)


def deepseek_output(theirs, x: torch.Tensor) -> torch.Tensor:
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2RotaryEmbedding

    B, T, _ = x.shape
    freqs = DeepseekV2RotaryEmbedding(theirs.config)(x, torch.arange(T).expand(B, T))
    causal = torch.full((T, T), float("-inf")).triu(1).expand(B, 1, T, T)  # additive mask, as its layers pass one
    return theirs(x, attention_mask=causal, position_embeddings=freqs)[0]


MAX_DIFFERENCE_FROM_DEEPSEEK = 1e-5


@pytest.mark.skipif(not HAS_DEEPSEEK, reason="transformers has no DeepSeek-V2 model")
@pytest.mark.parametrize("q_lora_rank", [None, 24])
def test_output_equals_transformers_deepseek_v2_attention_on_the_same_weights(q_lora_rank):
    sizes = dict(kv_lora_rank=32, q_lora_rank=q_lora_rank, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12)
    torch.manual_seed(0)
    ours = build_attention("mla", sizes, n_embd=64, n_head=4, block_size=24, rope=True).eval()
    with torch.no_grad():  # norm gains away from 1, so a missing or misplaced norm shows
        for norm in (ours.kv_norm, getattr(ours, "q_norm", None)):
            if norm is not None:
                norm.weight.uniform_(0.5, 1.5)
    theirs = deepseek_attention(64, 4, **sizes, block_size=24).eval()
    load_into_deepseek(ours, theirs)
    x = torch.randn(2, 24, 64)
    with torch.no_grad():
        expected, got = deepseek_output(theirs, x), ours(x)
    difference = float((got - expected).abs().max())
    assert difference < MAX_DIFFERENCE_FROM_DEEPSEEK * float(expected.abs().max()), difference
    with torch.no_grad():  # the RoPE reordering matters: without it the outputs differ
        theirs.kv_a_proj_with_mqa.weight.copy_(ours.kv_down.weight)
        assert not torch.allclose(deepseek_output(theirs, x), expected, atol=1e-3)
