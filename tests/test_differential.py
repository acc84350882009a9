"""Differential attention (`diff`): the paper's formula, its lambda schedule by depth, counts, cached decoding,
refusals and a fit through the command line."""

import math

import pytest
import torch
from helpers import TINY_FIT, last_checkpoint, write_corpus

from lit_attn import GPTConfig, Transformer
from lit_attn.analytic import cache_values_per_token
from lit_attn.attention import build_attention, get_attention
from lit_attn.attention.differential import depth_lambda_init
from lit_attn.cli.lightning_cli import cli
from lit_attn.testing import check_attention


@pytest.mark.parametrize("options,sizes", [
    (None, {}),
    (None, {"n_kv_heads": 2}),
    ({"lambda_init": 0.5}, {"n_embd": 48, "n_head": 6}),
    (None, {"n_embd": 48, "n_head": 6, "n_kv_heads": 2, "bias": True}),
], ids=["mha-shape", "kv2", "lambda-option", "h6-kv2-bias"])
def test_diff_passes_check_attention(options, sizes):
    check_attention("diff", options, **sizes)


def reference(attn, x):
    """The paper's equations, one differential head at a time with explicit score maps: query (key) map j of
    head i is the (j * heads + i)-th head-size slice, heads = n_head / 2 (n_kv_heads / 2)."""
    B, T, C = x.shape
    H, hkv, hs = attn.n_head, attn.n_kv_heads, attn.head_size
    q, k, v = attn.qkv(x).split([C, hkv * hs, hkv * hs], dim=-1)
    q, k, v = q.view(B, T, 2, H // 2, hs), k.view(B, T, 2, hkv // 2, hs), v.view(B, T, hkv // 2, 2 * hs)
    lam = (torch.exp(attn.lambda_q1 @ attn.lambda_k1) - torch.exp(attn.lambda_q2 @ attn.lambda_k2)
           + attn.lambda_init)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    heads = []
    for i in range(H // 2):
        pair = i // (H // hkv)
        a1, a2 = ((q[:, :, j, i] @ k[:, :, j, pair].transpose(1, 2) / math.sqrt(hs)).masked_fill(future, -math.inf)
                  .softmax(-1) for j in (0, 1))
        head = (a1 - lam * a2) @ v[:, :, pair]  # (B, T, 2*hs)
        head = head * torch.rsqrt(head.square().mean(-1, keepdim=True) + 1e-5) * attn.head_norm.weight
        heads.append((1 - attn.lambda_init) * head)
    return attn.out_proj(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_output_is_the_papers_formula(n_kv_heads):
    torch.manual_seed(0)
    attn = build_attention("diff", None, n_embd=48, n_head=6 if n_kv_heads else 4, n_kv_heads=n_kv_heads,
                           layer_idx=3).eval()
    with torch.no_grad():  # lambda far from lambda_init, and a norm weight that is not all ones
        for p in (attn.lambda_q1, attn.lambda_k1, attn.lambda_q2, attn.lambda_k2):
            p.normal_(0, 0.5)
        attn.head_norm.weight.uniform_(0.5, 1.5)
        x = torch.randn(2, 10, 48)
        assert abs(float(attn.lambda_full()) - attn.lambda_init) > 0.05
        torch.testing.assert_close(attn(x), reference(attn, x), atol=1e-5, rtol=1e-4)


def test_lambda_init_follows_depth_unless_given():
    config = dict(vocab_size=11, attention="diff", n_layer=4, n_embd=32, n_head=4, block_size=8)
    scheduled = [b.attn.lambda_init for b in Transformer(GPTConfig(**config)).blocks]
    # 0.8 - 0.6 * exp(-0.3 * (l - 1)) at depths l = 1..4
    assert scheduled == pytest.approx([0.2, 0.35550907, 0.47071307, 0.55605820])
    assert scheduled == [depth_lambda_init(i) for i in range(4)]
    fixed = Transformer(GPTConfig(**config, attention_options={"lambda_init": 0.5})).blocks
    assert [b.attn.lambda_init for b in fixed] == [0.5] * 4


@pytest.mark.parametrize("sizes,expected", [
    # 4 d^2 (q, k, v, out) + 6 hs (four lambda vectors, the head norm's weight)
    (dict(n_embd=64, n_head=8), 4 * 64 * 64 + 6 * 8),
    # + 3d (q, k, v biases) + d (output bias)
    (dict(n_embd=64, n_head=8, bias=True), 4 * 64 * 64 + 4 * 64 + 6 * 8),
    # q and out d^2 each, k and v d * Hkv * hs each
    (dict(n_embd=64, n_head=8, n_kv_heads=2), 2 * 64 * 64 + 2 * 64 * 2 * 8 + 6 * 8),
])
def test_parameter_count_is_the_hand_formula(sizes, expected):
    spec = get_attention("diff")
    args = spec.arguments(None, sizes)
    assert spec.params(**args) == expected
    assert sum(p.numel() for p in spec.build(**args).parameters()) == expected


@pytest.mark.parametrize("n_kv_heads,per_token", [(None, 2 * 32), (2, 2 * 2 * 8)])
def test_cache_per_token_is_keys_and_values_of_the_kv_maps(n_kv_heads, per_token):
    config = GPTConfig(vocab_size=11, attention="diff", n_layer=1, n_embd=32, n_head=4, n_kv_heads=n_kv_heads)
    assert cache_values_per_token(config) == per_token


@pytest.mark.parametrize("pos,n_kv_heads", [("learned", None), ("rope", 2)])
def test_cached_decoding_equals_the_full_forward_in_a_model(pos, n_kv_heads):
    """Three layers (three lambda_init values): a prefill, then one token per step, gives the full forward's logits,
    and cached generation the uncached one's tokens."""
    torch.manual_seed(0)
    model = Transformer(GPTConfig(vocab_size=23, attention="diff", n_layer=3, n_embd=32, n_head=4,
                                  n_kv_heads=n_kv_heads, block_size=16, pos=pos)).eval()
    idx = torch.randint(0, 23, (2, 16))
    cache = model.new_cache(2)
    with torch.no_grad():
        full = model(idx)
        steps = [model(idx[:, :6], cache, torch.arange(6))]
        steps += [model(idx[:, t:t + 1], cache, torch.tensor([t])) for t in range(6, 16)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)
    prompt = idx[:, :4]
    assert torch.equal(model.generate(prompt, 10, temperature=0, use_cache=True),
                       model.generate(prompt, 10, temperature=0, use_cache=False))


@pytest.mark.parametrize("sizes,message", [
    (dict(n_embd=30, n_head=3), "n_head must be even (got 3)"),
    (dict(n_embd=32, n_head=4, n_kv_heads=1), "n_kv_heads must be even (got 1)"),
    (dict(n_embd=32, n_head=4, n_query_heads=2), "does not take n_query_heads"),
])
def test_head_layouts_it_cannot_pair_are_refused(sizes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        GPTConfig(vocab_size=11, attention="diff", **sizes)


@pytest.mark.parametrize("flag,message", [
    ("--model.n_head=1", "n_head must be even (got 1)"),
    ('--model.attention_options={"lambda_init": 1.5}', "option lambda_init must be in [0, 1)"),
])
def test_bad_settings_on_the_command_line_are_one_line(flag, message, tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus.txt")
    code = cli(["fit", f"--data.path={corpus}", f"--runs_dir={tmp_path / 'runs'}", *TINY_FIT,
                "--model.attention=diff", flag])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: ") and message in err[-1], err
    assert "Traceback" not in "\n".join(err) and not (tmp_path / "runs").exists()


def test_a_tiny_fit_trains_diff(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={tmp_path}", "--run=diff", *TINY_FIT,
                "--model.n_layer=2", "--model.pos=rope", "--model.attention=diff", "--samples.max_new_tokens=4",
                "--params.print_table=false"]) == 0
    checkpoint = last_checkpoint(tmp_path / "diff")
    assert checkpoint["global_step"] == 4
    weights = checkpoint["state_dict"]
    for layer in range(2):
        assert weights[f"transformer.blocks.{layer}.attn.lambda_q1"].shape == (8,)
        assert weights[f"transformer.blocks.{layer}.attn.head_norm.weight"].shape == (16,)
    # the head norm starts at ones: four optimizer steps moved it
    assert not torch.equal(weights["transformer.blocks.0.attn.head_norm.weight"], torch.ones(16))
