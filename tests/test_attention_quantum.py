"""Quantum self-attention: causality, pairwise input-dependent scores, the
explicit formulas, agreement with PennyLane's simulator, parameter counts, and a short fit."""

import math

import attention_checks as checks
import pytest
import torch

from lit_attn import GPTConfig, Transformer
from lit_attn.attention import attention_options, build_attention
from lit_attn.attention.quantum import attention_param_count, circuit_param_count, n_qubits
from lit_attn.attention.quantum_sim import circuit_unitary, draw_pauli_strings

VARIANTS = ["qsa", "qsa_fixed"]
NORMS = ["average", "softmax"]


def build(name, n_embd=4, n_head=1, block_size=8, **options):
    common = dict(n_embd=n_embd, n_head=n_head, n_query_heads=None, n_kv_heads=None, block_size=block_size,
                  dropout=0.0, bias=True, qkv_bias=None, rope=False)
    return build_attention(name, options, **common).eval()


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("normalization", NORMS)
def test_causal_for_both_normalizations(name, normalization):
    attn = build(name, n_embd=6, n_head=2, normalization=normalization)
    x = torch.randn(3, 8, 6)
    for t in range(8):
        x2 = x.clone()
        x2[:, t + 1 :] = torch.randn(3, 7 - t, 6)
        y, y2 = attn(x), attn(x2)
        torch.testing.assert_close(y[:, : t + 1], y2[:, : t + 1], rtol=0, atol=0)
        if t < 7:
            assert not torch.allclose(y[:, t + 1 :], y2[:, t + 1 :])


@pytest.mark.parametrize("name", VARIANTS)
def test_q_and_k_depend_on_the_input_and_scores_are_pairwise(name):
    attn = build(name)
    x = torch.randn(2, 8, 4)
    q, k, _ = attn.readouts(x)
    x2 = x.clone()
    x2[:, 3] = torch.randn(2, 4)
    q2, k2, _ = attn.readouts(x2)
    changed = (q - q2).abs().amax(dim=(0, 1)) > 1e-4
    assert changed[3] and not changed[[0, 1, 2, 4, 5, 6, 7]].any()  # only token 3's q moved
    assert ((k - k2).abs().amax(dim=(0, 1)) > 1e-4)[3]
    a = torch.exp(-(q[..., :, None] - k[..., None, :]) ** 2)  # (B, H, T, T)
    assert (a[..., 7, :].std(-1) > 1e-3).all()  # a_7j varies with j


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("normalization", NORMS)
def test_output_equals_the_explicit_formula(name, normalization):
    attn = build(name, n_embd=6, n_head=2, normalization=normalization).double()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    q, k, v = attn.readouts(x)  # (B, H, T), (B, H, T), (B, H, T, d)
    B, H, T, d = v.shape
    out = torch.zeros(B, T, H, d, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                a = [math.exp(-(q[b, h, i] - k[b, h, j]).item() ** 2) for j in range(i + 1)]
                if normalization == "average":
                    w = [a_j / sum(a) for a_j in a]
                else:
                    e = [math.exp(a_j / math.sqrt(d)) for a_j in a]
                    w = [e_j / sum(e) for e_j in e]
                out[b, i, h] = sum(w_j * v[b, h, j] for j, w_j in enumerate(w))
    torch.testing.assert_close(attn(x), attn.out_proj(out.reshape(B, T, H * d)))


def test_per_token_circuits_are_indexed_by_position():
    attn = build("qsa")
    x = torch.randn(1, 8, 4)
    q_full, _, _ = attn.readouts(x)
    q_short, _, _ = attn.readouts(x[:, :3])  # T < block_size uses circuits 0..2
    torch.testing.assert_close(q_short, q_full[..., :3])
    with torch.no_grad():
        attn.circuit_angles()[5].add_(1.0)
    q_moved, _, _ = attn.readouts(x)
    assert torch.equal(q_moved[..., :5], q_full[..., :5]) and not torch.allclose(q_moved[..., 5], q_full[..., 5])


def test_unitaries_are_unitary_and_encoding_pads():
    u = circuit_unitary(torch.rand(5, 2, 3, 3, dtype=torch.float64) * 6.3)  # 5 circuits, 2 repetitions, 3 qubits
    eye = torch.eye(8, dtype=torch.complex128)
    torch.testing.assert_close(u @ u.mH, eye.expand_as(u))
    assert [n_qubits(d) for d in (2, 3, 4, 5, 16, 17)] == [1, 2, 2, 3, 4, 5]


def test_pauli_strings_are_fixed_distinct_buffers_and_reload():
    s = draw_pauli_strings(16, 4, seed=0)
    assert torch.equal(s, draw_pauli_strings(16, 4, seed=0))
    assert (s != 0).any(-1).all() and len({tuple(r) for r in s.tolist()}) == 16
    a, b = build("qsa_fixed", pauli_seed=0), build("qsa_fixed", pauli_seed=1)
    assert "pauli_strings" in a.state_dict() and not any(p is a.pauli_strings for p in a.parameters())
    assert not torch.equal(a.pauli_strings, b.pauli_strings)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 8, 4)
    torch.testing.assert_close(a(x), b(x))


def test_readouts_stay_float32_under_bf16_autocast():
    attn = build("qsa", n_embd=16)
    x = torch.randn(2, 8, 16)
    q, k, v = attn.readouts(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        qa, ka, va = attn.readouts(x)
        y = attn(x)
    assert qa.dtype == va.dtype == torch.float32 and y.shape == x.shape
    torch.testing.assert_close((qa, ka, va), (q, k, v))


def test_runs_on_the_meta_device():
    """Lightning's measure_flops runs a meta-device copy of the model (which has no autocast)."""
    with torch.device("meta"):
        model = Transformer(GPTConfig(vocab_size=16, attention="qsa", n_layer=1, n_embd=4, n_head=1, block_size=8))
        assert model(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, 16)


def test_rope_is_refused_and_options_are_validated():
    assert attention_options("qsa") == attention_options("qsa_fixed") == ["normalization", "repetitions", "pauli_seed"]
    for name in ("qsa", "qsa_fixed"):  # q and k are scalars from circuits: nothing to rotate
        with pytest.raises(ValueError, match=rf"attention '{name}' does not use rotary position embeddings .*"
                                             r"use --model.pos learned"):
            build_attention(name, None, n_embd=4, n_head=1, block_size=8, bias=True, rope=True)
    with pytest.raises(ValueError, match=r"unknown normalization 'sum' for attention 'qsa'; choose average or softmax"):
        build("qsa", normalization="sum")
    with pytest.raises(ValueError, match=r"repetitions must be a positive integer, got 0"):
        build("qsa_fixed", repetitions=0)
    with pytest.raises(ValueError, match=r"at least 2 channels per head \(n_embd / n_head = 8/8 = 1\)"):
        build("qsa", n_embd=8, n_head=8)
    with pytest.raises(ValueError, match=r"got unknown option\(s\) temperature; its options are: normalization"):
        build("qsa", temperature=1.0)
    with pytest.raises(ValueError, match=r"sequence length 9 exceeds block_size 8"):
        build("qsa")(torch.randn(1, 9, 4))


@pytest.mark.parametrize("d,n", [(4, 2), (16, 4)])
def test_parameter_formulas_match_the_model(d, n):
    block, layers = 16, 6
    assert circuit_param_count(d, 1, block, per_token=False) == 9 * n
    assert circuit_param_count(d, 1, block, per_token=True) == 9 * n * block
    assert circuit_param_count(d, 1, block, per_token=True, repetitions=2) == 18 * n * block
    for name, per_token in (("qsa", True), ("qsa_fixed", False)):
        model = Transformer(GPTConfig(vocab_size=65, attention=name, n_layer=layers, n_embd=d, n_head=1,
                                      block_size=block))
        quantum = sum(blk.attn.angles.numel() for blk in model.blocks)
        attn = sum(p.numel() for blk in model.blocks for p in blk.attn.parameters())
        assert quantum == layers * circuit_param_count(d, 1, block, per_token)
        assert attn == layers * attention_param_count(d, 1, block, per_token, bias=True)
        assert model.blocks[0].attn.n_circuit_params == circuit_param_count(d, 1, block, per_token)


# ---- cross-check against PennyLane's default.qubit (an independent simulator) ----

def pennylane_readouts(attn, x):
    """q, k, v of `attn` for x (1, T, C), simulated by PennyLane (lit_attn.attention.pennylane_reference,
    the same reference benchmarks/bench_qsa.py times) one token at a time, differentiable by
    parameter shift with respect to a float64 copy of the angles, which is also returned."""
    pytest.importorskip("pennylane")
    from lit_attn.attention import pennylane_reference as reference

    leaf = attn.angles.detach().double().clone().requires_grad_(True)
    q, k, v = reference.pennylane_readouts(attn, x.double(), leaf, diff_method="parameter-shift", broadcast=False)
    return q, k, v, leaf


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,head_size,n_head,repetitions",
    [("qsa", 2, 1, 1), ("qsa_fixed", 3, 2, 1), ("qsa", 4, 1, 2), ("qsa_fixed", 7, 1, 1), ("qsa", 16, 1, 1)],
)  # 1, 2, 2, 3 and 4 qubits; padding (3, 7), two heads, two ansatz repetitions
def test_readouts_and_gradients_agree_with_pennylane(name, head_size, n_head, repetitions):
    pytest.importorskip("pennylane")
    T = 2
    attn = build(name, n_embd=head_size * n_head, n_head=n_head, block_size=T, repetitions=repetitions).double()
    x = torch.randn(1, T, head_size * n_head, dtype=torch.float64)
    q, k, v = attn.readouts(x)
    pq, pk, pv, leaf = pennylane_readouts(attn, x)
    torch.testing.assert_close((q, k, v), (pq, pk, pv), rtol=0, atol=1e-5)
    # Gradients of a random linear combination of every readout with respect to every angle.
    wq, wk, wv = torch.randn_like(q), torch.randn_like(k), torch.randn_like(v)
    ((q * wq).sum() + (k * wk).sum() + (v * wv).sum()).backward()
    ((pq * wq).sum() + (pk * wk).sum() + (pv * wv).sum()).backward()
    assert attn.angles.grad.abs().max() > 1e-3
    torch.testing.assert_close(attn.angles.grad, leaf.grad, rtol=0, atol=1e-5)
    # float32 (the training dtype) agrees to the same tolerance.
    q32, k32, v32 = attn.float().readouts(x.float())
    torch.testing.assert_close((q32.double(), k32.double(), v32.double()), (pq, pk, pv), rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", VARIANTS)
def test_pennylane_reference_broadcast_matches_per_token(name):
    """The broadcast, backprop form of the reference (what benchmarks/bench_qsa.py times) simulates the
    same circuits as the per-token form above, for a batch of several rows, and agrees with ours."""
    pytest.importorskip("pennylane")
    from lit_attn.attention.pennylane_reference import pennylane_readouts as reference

    attn = build(name, n_embd=6, n_head=2, block_size=4).double()
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    broadcast = reference(attn, x)
    per_token = reference(attn, x, broadcast=False)
    torch.testing.assert_close(broadcast, per_token, rtol=0, atol=1e-12)
    torch.testing.assert_close(attn.readouts(x), broadcast, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", VARIANTS)
def test_short_fit_lowers_validation_loss(name, corpus):
    before, after, model, initial = checks.short_fit(name, corpus)
    assert after < before - 0.5, (before, after)
    angles = "transformer.blocks.0.attn.angles"
    assert not torch.allclose(initial[angles], model.state_dict()[angles])  # the circuits were trained too


def test_average_attention_with_dropout_matches_autograd_of_the_formula():
    """The hand-written backward of the "average" path (with a dropout mask), against autograd
    through the plain formula y_i = sum_j a_ij m_ij v_j / sum_j a_ij, and against gradcheck."""
    from lit_attn.attention.quantum import _AverageAttention

    B, H, T, d = 2, 2, 5, 3
    q, k = (torch.rand(B, H, T, dtype=torch.float64).mul(2).sub(1).requires_grad_() for _ in range(2))
    v = torch.randn(B, H, T, d, dtype=torch.float64, requires_grad=True)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    drop = torch.nn.functional.dropout(torch.ones(B, H, T, T, dtype=torch.float64), p=0.3)
    assert (drop == 0).any()
    a = torch.exp(-(q.unsqueeze(-1) - k.unsqueeze(-2)).square()) * causal
    reference = (a * drop) @ v / a.sum(-1, keepdim=True)
    y = _AverageAttention.apply(q, k, v, causal, drop)
    torch.testing.assert_close(y, reference)
    g = torch.randn_like(y)
    torch.testing.assert_close(torch.autograd.grad(y, (q, k, v), g), torch.autograd.grad(reference, (q, k, v), g))
    assert torch.autograd.gradcheck(lambda q, k, v: _AverageAttention.apply(q, k, v, causal, drop), (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: _AverageAttention.apply(q, k, v, causal, None), (q, k, v))


@pytest.mark.parametrize("name", VARIANTS)
def test_layer_gradients_pass_gradcheck(name):
    attn = build(name, n_embd=6, n_head=2, block_size=4).double()
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, angles: torch.func.functional_call(attn, {"angles": angles}, (x,)),
                                    (x, attn.angles.detach().clone().requires_grad_()))
