"""Gated DeltaNet (`gated_deltanet`): the chunked and recurrent forms against the paper's step-by-step rule, the
layer against its formula, check_attention, a decoding state that does not grow, FLOPs linear in T, the refusal
of RoPE, and a fit and a sample through the command line."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import TINY_FIT, scalars, write_corpus

from lit_attn import GPTConfig, Transformer
from lit_attn.analytic import attention_flops_per_token, cache_values_per_sequence
from lit_attn.attention import build_attention, get_attention
from lit_attn.attention.gated_deltanet import chunk_gated_delta_rule, recurrent_gated_delta_rule
from lit_attn.cli.lightning_cli import cli
from lit_attn.testing import check_attention
from lit_attn.tools import sample as sampler


def naive_gated_delta_rule(q, k, v, g, beta, state):
    """The paper's rule as written, one head and one token at a time, S (d_v x d_k):
    S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T, o_t = S_t q_t. Arguments as the module's
    forms take them (state (B, H, d_k, d_v), the paper's S transposed)."""
    B, H, T, dk = q.shape
    out = torch.zeros(B, H, T, v.size(-1), dtype=torch.float64)
    final = torch.zeros(B, H, dk, v.size(-1), dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            S = state[b, h].double().T
            for t in range(T):
                kt, alpha, bt = k[b, h, t].double(), math.exp(g[b, h, t]), float(beta[b, h, t])
                S = alpha * S @ (torch.eye(dk, dtype=torch.float64) - bt * torch.outer(kt, kt)) \
                    + bt * torch.outer(v[b, h, t].double(), kt)
                out[b, h, t] = S @ q[b, h, t].double()
            final[b, h] = S.T
    return out.float(), final.float()


def random_inputs(T, B=2, H=3, dk=8, dv=6, seed=0):
    """Inputs as the layer makes them: unit keys, log-decays g < 0, beta in (0, 1), a non-zero initial state."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, dk, generator=gen) * dk**-0.5
    k = F.normalize(torch.randn(B, H, T, dk, generator=gen), dim=-1)
    v = torch.randn(B, H, T, dv, generator=gen)
    g = -torch.rand(B, H, T, generator=gen) * 0.5
    beta = torch.rand(B, H, T, generator=gen)
    state = torch.randn(B, H, dk, dv, generator=gen)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("T,chunk", [(1, 16), (7, 16), (16, 16), (33, 16), (50, 8), (130, 64)])
def test_chunked_recurrent_and_naive_forms_agree(T, chunk):
    """Lengths below, at and past the chunk size, multiples of it and not (the last chunk shorter)."""
    inputs = random_inputs(T)
    expected_o, expected_state = naive_gated_delta_rule(*inputs)
    for o, state in (chunk_gated_delta_rule(*inputs, chunk), recurrent_gated_delta_rule(*inputs)):
        torch.testing.assert_close(o, expected_o, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(state, expected_state, atol=1e-5, rtol=1e-5)


def test_the_chunked_forms_gradients_are_the_recurrent_ones():
    """Training differentiates the chunked form (through its triangular solve): the same gradients as the rule's."""
    grads = []
    for form in (lambda *a: chunk_gated_delta_rule(*a, 8), recurrent_gated_delta_rule):
        inputs = [t.clone().requires_grad_(True) for t in random_inputs(21, seed=3)]
        o, state = form(*inputs)
        (o.square().sum() + state.sum()).backward()
        grads.append([t.grad for t in inputs])
    for chunked, recurrent in zip(*grads):
        torch.testing.assert_close(chunked, recurrent, atol=1e-5, rtol=1e-5)


def reference_layer(layer, x):
    """The layer's formula on its own weights, written out: causal depthwise convolution and SiLU on q, k, v,
    L2-normalised q (scaled by d_k^-1/2) and k, alpha = exp(-exp(A_log) softplus(W_a x + dt_bias)),
    beta = sigmoid(W_b x), the naive rule, RMSNorm per head times SiLU(W_g x), the output projection."""
    B, T, _ = x.shape
    H, dk, dv, K = layer.n_head, layer.head_k_dim, layer.head_v_dim, layer.conv_size
    qkv = layer.qkv(x)  # (B, T, W)
    w = layer.conv.weight[:, 0]  # (W, K): tap K-1 reads the current token
    conv = sum(w[:, K - 1 - j] * F.pad(qkv, (0, 0, j, 0))[:, :T] for j in range(K))
    q, k, v = F.silu(conv).split([H * dk, H * dk, H * dv], dim=-1)
    gate, a, b = layer.gates(x).split([H * dv, H, H], dim=-1)
    q = F.normalize(q.view(B, T, H, dk), dim=-1) * dk**-0.5
    k = F.normalize(k.view(B, T, H, dk), dim=-1)
    g = -layer.A_log.exp() * F.softplus(a + layer.dt_bias)
    o, _ = naive_gated_delta_rule(q.transpose(1, 2), k.transpose(1, 2), v.view(B, T, H, dv).transpose(1, 2),
                                  g.transpose(1, 2), b.sigmoid().transpose(1, 2), torch.zeros(B, H, dk, dv))
    o = o.transpose(1, 2)  # (B, T, H, dv)
    o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + 1e-5) * layer.o_norm.weight
    return layer.out_proj((o * F.silu(gate.view(B, T, H, dv))).reshape(B, T, H * dv))


@pytest.mark.parametrize("options", [None, {"chunk_size": 4, "head_k_dim": 6, "head_v_dim": 10, "conv_size": 3}])
def test_the_layer_is_its_formula(options):
    torch.manual_seed(0)
    layer = build_attention("gated_deltanet", options, n_embd=32, n_head=4).eval()
    with torch.no_grad():
        layer.o_norm.weight.uniform_(0.5, 1.5)  # not all ones
        x = torch.randn(2, 19, 32)
        torch.testing.assert_close(layer(x), reference_layer(layer, x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("options,sizes", [
    (None, {}),
    ({"chunk_size": 4}, {"bias": True}),
    ({"chunk_size": 5, "head_k_dim": 6, "head_v_dim": 10, "conv_size": 2}, {"n_embd": 48, "n_head": 3}),
], ids=["default", "chunk4-bias", "dims"])
def test_gated_deltanet_passes_check_attention(options, sizes):
    check_attention("gated_deltanet", options, **sizes)


def test_a_prompt_in_parts_decodes_as_the_full_forward():
    """Several tokens into a state that has seen some (the chunked form from the state), then single tokens (the
    recurrent form): the logits of one forward over the whole sequence."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=40, attention="gated_deltanet", attention_options={"chunk_size": 4}, n_layer=2,
                       n_embd=32, n_head=4, block_size=24)
    model = Transformer(config).eval()
    idx = torch.randint(0, 40, (2, 20))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 20)
        parts = [(0, 5), (5, 15), *((t, t + 1) for t in range(15, 20))]
        got = torch.cat([model(idx[:, a:b], cache, torch.arange(a, b), length=b) for a, b in parts], dim=1)
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)


def test_the_decoding_state_does_not_grow_with_the_sequence():
    """Per sequence: S (H x d_k x d_v) and the convolution's last K - 1 inputs of q, k, v, after 1 token as after
    a thousand; the model's states hold that many values, and generating leaves their size as it was."""
    config = GPTConfig(vocab_size=40, attention="gated_deltanet", n_layer=2, n_embd=32, n_head=4, block_size=64)
    H, dk, dv, K = 4, 8, 8, 4
    per_layer = H * dk * dv + (K - 1) * H * (2 * dk + dv)
    assert [cache_values_per_sequence(config, n) for n in (1, 64, 1000)] == [2 * per_layer] * 3
    model = Transformer(config).eval()
    assert sum(s.nbytes for s in model.new_cache(1, 2)) == sum(s.nbytes for s in model.new_cache(1, 64)) \
        == 2 * per_layer * 4  # float32
    cache = model.new_cache(1, 64)
    idx = torch.randint(0, 40, (1, 64))
    with torch.no_grad():
        model(idx[:, :8], cache, torch.arange(8), length=8)
        before = sum(s.nbytes for s in cache)
        for t in range(8, 64):
            model(idx[:, t : t + 1], cache, torch.tensor([t]), length=t + 1)
    assert sum(s.nbytes for s in cache) == before


def test_flops_per_token_are_linear_in_the_context():
    """The chunked form's work per token stops growing at the chunk size: at T and 4T (multiples of it) the
    counts are equal, the chunk term H (5 d_k + 3 d_v) C, where MHA's quadratic term grows 4x; at any T the
    declared counts are those measured from the module."""
    spec = get_attention("gated_deltanet")
    args = spec.arguments(None, {"n_embd": 64, "n_head": 4, "block_size": 1024})
    H, dk, dv, C = 4, 16, 16, 64
    at = {T: spec.flops(T, **args) for T in (128, 512, 300)}
    assert at[128] == at[512] and at[128].quadratic == H * (5 * dk + 3 * dv) * C
    assert at[300].linear == at[128].linear and at[300].quadratic <= at[128].quadratic
    for T in (128, 300):
        assert spec.derived(T, **args)[2] == at[T]
    config = GPTConfig(vocab_size=40, attention="gated_deltanet", n_embd=64, n_head=4, block_size=1024)
    mha = GPTConfig(vocab_size=40, attention="mha", n_embd=64, n_head=4, block_size=1024)
    assert attention_flops_per_token(config, 1024) == attention_flops_per_token(config, 256)
    assert attention_flops_per_token(mha, 1024).quadratic == 4 * attention_flops_per_token(mha, 256).quadratic


def test_rope_is_refused_in_one_line():
    with pytest.raises(ValueError, match="does not use rotary position embeddings") as raised:
        build_attention("gated_deltanet", None, n_embd=32, n_head=4, rope=True)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("flag,message", [
    ("--model.pos=rope", "attention 'gated_deltanet' does not use rotary position embeddings"),
    ('--model.attention_options={"chunk_size": 0}', "chunk_size must be a positive integer, got 0"),
    ("--model.n_kv_heads=2", "attention 'gated_deltanet' does not take n_kv_heads"),
])
def test_bad_settings_on_the_command_line_are_one_line(flag, message, tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus.txt")
    code = cli(["fit", f"--data.path={corpus}", f"--runs_dir={tmp_path / 'runs'}", *TINY_FIT,
                "--model.attention=gated_deltanet", flag])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: ") and message in err[-1], err
    assert "Traceback" not in "\n".join(err) and not (tmp_path / "runs").exists()


def test_a_fit_trains_and_its_run_samples(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus.txt")
    fit = [arg for arg in TINY_FIT if not arg.startswith(("--trainer.max_steps", "--trainer.val_check_interval"))]
    assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={tmp_path}", "--run=gdn", *fit,
                "--model.attention=gated_deltanet", "--model.lr=1e-2", "--trainer.max_steps=40",
                "--trainer.val_check_interval=40", "--trainer.log_every_n_steps=1", "--samples.max_new_tokens=2",
                "--params.print_table=false"]) == 0
    losses = [value for _, value in scalars(tmp_path / "gdn", "train/loss")]
    assert len(losses) >= 30 and all(math.isfinite(v) for v in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3, losses  # nats per character
    capsys.readouterr()
    assert sampler.main(["--ckpt_path", str(tmp_path / "gdn"), "--prompt", "the ", "--max_new_tokens", "12",
                         "--temperature", "0", "--device", "cpu"]) == 0
    out = capsys.readouterr().out.rstrip("\n")
    assert out.startswith("the ") and len(out) == 4 + 12


def test_the_flash_linear_attention_reference_agrees():
    """flash-linear-attention's own PyTorch reference of the rule, where it is installed (never required)."""
    naive = pytest.importorskip("fla.ops.gated_delta_rule.naive")
    q, k, v, g, beta, state = random_inputs(37)
    o, final = naive.naive_recurrent_gated_delta_rule(
        *(t.transpose(1, 2) for t in (q, k, v, beta, g)), scale=1.0, initial_state=state, output_final_state=True)
    expected_o, expected_state = chunk_gated_delta_rule(q, k, v, g, beta, state, 16)
    torch.testing.assert_close(o.transpose(1, 2).float(), expected_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final.float(), expected_state, atol=1e-5, rtol=1e-5)
