"""Mamba-2 (`mamba2`): the chunked and recurrent forms against the paper's step-by-step recurrence, the layer
against its formula, check_attention, a decoding state that does not grow, FLOPs linear in T, the default sizes,
the refusal of RoPE, a fit and a sample through the command line, and the paper's own listing where installed."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import TINY_FIT, scalars, write_corpus

from lit_attn import GPTConfig, Transformer
from lit_attn.analytic import attention_flops_per_token, cache_values_per_sequence
from lit_attn.attention import build_attention, get_attention
from lit_attn.attention.mamba2 import chunk_ssd, recurrent_ssd
from lit_attn.cli.lightning_cli import cli
from lit_attn.testing import check_attention
from lit_attn.tools import sample as sampler


def naive_ssd(x, dt, A, b, c, state):
    """The paper's recurrence as written, one head and one token at a time, h (P x N) as in the reference code:
    h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t; head h reads group h // (H / G)'s B and C.
    Arguments as the module's forms take them (state (B, H, N, P), this h transposed)."""
    Bsz, H, T, P = x.shape
    G, N = b.size(1), b.size(-1)
    out = torch.zeros(Bsz, H, T, P, dtype=torch.float64)
    final = torch.zeros(Bsz, H, N, P, dtype=torch.float64)
    for i in range(Bsz):
        for h in range(H):
            group = h // (H // G)
            S = state[i, h].double().T
            for t in range(T):
                step = float(dt[i, h, t])
                S = math.exp(step * float(A[h])) * S + step * torch.outer(x[i, h, t].double(), b[i, group, t].double())
                out[i, h, t] = S @ c[i, group, t].double()
            final[i, h] = S.T
    return out.float(), final.float()


def random_inputs(T, B=2, H=4, G=1, P=6, N=5, seed=0):
    """Inputs as the layer makes them: dt > 0, A < 0, a non-zero initial state."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, H, T, P, generator=gen)
    dt = torch.rand(B, H, T, generator=gen) * 0.5
    A = -torch.rand(H, generator=gen) * 4
    b = torch.randn(B, G, T, N, generator=gen)
    c = torch.randn(B, G, T, N, generator=gen)
    state = torch.randn(B, H, N, P, generator=gen)
    return x, dt, A, b, c, state


@pytest.mark.parametrize("T,chunk,groups", [(1, 16, 1), (7, 16, 1), (16, 16, 2), (33, 16, 1), (50, 8, 2),
                                            (130, 64, 1)])
def test_chunked_recurrent_and_naive_forms_agree(T, chunk, groups):
    """Lengths below, at and past the chunk size, multiples of it and not (the last chunk shorter), one group
    and two (B and C shared by two heads each)."""
    inputs = random_inputs(T, G=groups)
    expected_y, expected_state = naive_ssd(*inputs)
    for y, state in (chunk_ssd(*inputs, chunk), recurrent_ssd(*inputs)):
        torch.testing.assert_close(y, expected_y, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(state, expected_state, atol=1e-5, rtol=1e-5)


def test_the_chunked_forms_gradients_are_the_recurrent_ones():
    """Training differentiates the chunked form: the same gradients as the recurrence's."""
    grads = []
    for form in (lambda *a: chunk_ssd(*a, 8), recurrent_ssd):
        inputs = [t.clone().requires_grad_(True) for t in random_inputs(21, G=2, seed=3)]
        y, state = form(*inputs)
        (y.square().sum() + state.sum()).backward()
        grads.append([t.grad for t in inputs])
    for chunked, recurrent in zip(*grads):
        torch.testing.assert_close(chunked, recurrent, atol=1e-5, rtol=1e-5)


def reference_layer(layer, u):
    """The layer's formula on its own weights, written out: in_proj to (z, x, B, C, dt), causal depthwise
    convolution (with bias) and SiLU on (x, B, C), dt = softplus(dt + dt_bias), A = -exp(A_log), the naive
    recurrence plus D x, then y * SiLU(z) RMS-normalised per group (times the norm's weight), the output projection."""
    Bsz, T, _ = u.shape
    H, P, G, N, K = layer.n_head, layer.head_dim, layer.ngroups, layer.d_state, layer.conv_size
    E = H * P
    z, xbc, dt = layer.in_proj(u).split([E, E + 2 * G * N, H], dim=-1)
    w = layer.conv.weight[:, 0]  # (W, K): tap K-1 reads the current token
    conv = sum(w[:, K - 1 - j] * F.pad(xbc, (0, 0, j, 0))[:, :T] for j in range(K)) + layer.conv.bias
    x, b, c = F.silu(conv).split([E, G * N, G * N], dim=-1)
    x = x.view(Bsz, T, H, P).transpose(1, 2)
    dt = F.softplus(dt + layer.dt_bias).transpose(1, 2)
    y, _ = naive_ssd(x, dt, -layer.A_log.exp(), b.view(Bsz, T, G, N).transpose(1, 2),
                     c.view(Bsz, T, G, N).transpose(1, 2), torch.zeros(Bsz, H, N, P))
    y = (y + layer.D[:, None, None] * x).transpose(1, 2).reshape(Bsz, T, G, E // G)
    y = y * F.silu(z.view(Bsz, T, G, E // G))
    y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + 1e-5)
    return layer.out_proj(y.reshape(Bsz, T, E) * layer.norm_weight)


@pytest.mark.parametrize("options", [None, {"chunk_size": 4, "d_state": 6, "head_dim": 10, "conv_size": 3,
                                            "ngroups": 2}])
def test_the_layer_is_its_formula(options):
    torch.manual_seed(0)
    layer = build_attention("mamba2", options, n_embd=32, n_head=4).eval()
    with torch.no_grad():
        layer.norm_weight.uniform_(0.5, 1.5)  # not all ones
        layer.D.uniform_(0.5, 1.5)
        u = torch.randn(2, 19, 32)
        torch.testing.assert_close(layer(u), reference_layer(layer, u), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("options,sizes", [
    (None, {}),
    ({"chunk_size": 4}, {"bias": True}),
    ({"chunk_size": 5, "d_state": 6, "head_dim": 10, "conv_size": 2, "ngroups": 2, "expand": 1},
     {"n_embd": 48, "n_head": 4}),
], ids=["default", "chunk4-bias", "dims"])
def test_mamba2_passes_check_attention(options, sizes):
    check_attention("mamba2", options, **sizes)


@pytest.mark.parametrize("options,sizes,expected", [
    (None, {"n_embd": 32, "n_head": 4}, (4, 16, 32)),  # head_dim = 2 * 32 / 4; d_state = n_embd below 64
    (None, {"n_embd": 256, "n_head": 16}, (16, 32, 64)),  # d_state 64 from n_embd 64 on
    ({"expand": 1, "d_state": 16}, {"n_embd": 64, "n_head": 2}, (2, 32, 16)),
    ({"head_dim": 12}, {"n_embd": 32, "n_head": 3}, (3, 12, 32)),  # head_dim sets the inner width n_head * 12
], ids=["tiny", "sqa-layout", "expand1", "head_dim"])
def test_n_head_sets_the_heads_and_the_defaults_follow_the_width(options, sizes, expected):
    """(heads, head_dim, d_state) of the built layer; the declared heads are the layer's."""
    layer = build_attention("mamba2", options, **sizes)
    assert (layer.n_head, layer.head_dim, layer.d_state) == expected
    spec = get_attention("mamba2")
    assert spec.heads(**spec.arguments(options, sizes)) == (expected[0], expected[0])


def test_a_prompt_in_parts_decodes_as_the_full_forward():
    """Several tokens into a state that has seen some (the chunked form from h), then single tokens (the recurrent
    form): the logits of one forward over the whole sequence."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=40, attention="mamba2", attention_options={"chunk_size": 4}, n_layer=2,
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
    """Per sequence: h (H x d_state x head_dim) and the convolution's last K - 1 inputs of x, B and C, after 1
    token as after a thousand; the model's states hold that many values, and generating leaves their size as it
    was."""
    config = GPTConfig(vocab_size=40, attention="mamba2", n_layer=2, n_embd=32, n_head=4, block_size=64)
    H, P, N, K = 4, 16, 32, 4
    per_layer = H * N * P + (K - 1) * (H * P + 2 * N)
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
    counts are equal, the chunk term (2 G N + 2 H P) C, where MHA's quadratic term grows 4x; at any T the
    declared counts are those measured from the module."""
    spec = get_attention("mamba2")
    args = spec.arguments(None, {"n_embd": 64, "n_head": 4, "block_size": 1024})
    H, P, N, G, C = 4, 32, 64, 1, 64
    at = {T: spec.flops(T, **args) for T in (128, 512, 300)}
    assert at[128] == at[512] and at[128].quadratic == (2 * G * N + 2 * H * P) * C
    assert at[300].linear == at[128].linear and at[300].quadratic <= at[128].quadratic
    for T in (128, 300):
        assert spec.derived(T, **args)[2] == at[T]
    config = GPTConfig(vocab_size=40, attention="mamba2", n_embd=64, n_head=4, block_size=1024)
    mha = GPTConfig(vocab_size=40, attention="mha", n_embd=64, n_head=4, block_size=1024)
    assert attention_flops_per_token(config, 1024) == attention_flops_per_token(config, 256)
    assert attention_flops_per_token(mha, 1024).quadratic == 4 * attention_flops_per_token(mha, 256).quadratic


def test_rope_is_refused_in_one_line():
    with pytest.raises(ValueError, match="does not use rotary position embeddings") as raised:
        build_attention("mamba2", None, n_embd=32, n_head=4, rope=True)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("flag,message", [
    ("--model.pos=rope", "attention 'mamba2' does not use rotary position embeddings"),
    ('--model.attention_options={"chunk_size": 0}', "chunk_size must be a positive integer, got 0"),
    ('--model.attention_options={"ngroups": 3}', "n_head=4 is not divisible by ngroups=3"),
    ("--model.n_kv_heads=2", "attention 'mamba2' does not take n_kv_heads"),
])
def test_bad_settings_on_the_command_line_are_one_line(flag, message, tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus.txt")
    code = cli(["fit", f"--data.path={corpus}", f"--runs_dir={tmp_path / 'runs'}", *TINY_FIT,
                "--model.attention=mamba2", flag])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: ") and message in err[-1], err
    assert "Traceback" not in "\n".join(err) and not (tmp_path / "runs").exists()


def test_a_fit_trains_and_its_run_samples(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus.txt")
    fit = [arg for arg in TINY_FIT if not arg.startswith(("--trainer.max_steps", "--trainer.val_check_interval"))]
    assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={tmp_path}", "--run=m2", *fit,
                "--model.attention=mamba2", "--model.lr=1e-2", "--trainer.max_steps=40",
                "--trainer.val_check_interval=40", "--trainer.log_every_n_steps=1", "--samples.max_new_tokens=2",
                "--params.print_table=false"]) == 0
    losses = [value for _, value in scalars(tmp_path / "m2", "train/loss")]
    assert len(losses) >= 30 and all(math.isfinite(v) for v in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3, losses  # nats per character
    capsys.readouterr()
    assert sampler.main(["--ckpt_path", str(tmp_path / "m2"), "--prompt", "the ", "--max_new_tokens", "12",
                         "--temperature", "0", "--device", "cpu"]) == 0
    out = capsys.readouterr().out.rstrip("\n")
    assert out.startswith("the ") and len(out) == 4 + 12


def test_the_reference_ssd_minimal_agrees():
    """The paper's Listing 1 (`mamba_ssm`'s ssd_minimal_discrete: dt folded into x and A, one group, whole chunks),
    where it is installed (never required)."""
    minimal = pytest.importorskip("mamba_ssm.modules.ssd_minimal")
    x, dt, A, b, c, _ = random_inputs(48)
    y, final = minimal.ssd_minimal_discrete(
        (x * dt[..., None]).transpose(1, 2), (dt * A[:, None]).transpose(1, 2), b.transpose(1, 2), c.transpose(1, 2),
        16)
    expected_y, expected_state = chunk_ssd(x, dt, A, b, c, torch.zeros(2, 4, 5, 6), 16)
    torch.testing.assert_close(y.transpose(1, 2), expected_y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final.squeeze(1).transpose(-1, -2), expected_state, atol=1e-5, rtol=1e-5)
