"""The recipe's model options, each on its own flag: QK-norm (--model.qk_norm), the ReLU² MLP (--model.ffn relu2)
and logit soft-capping (--model.logit_softcap). Each changes the forward as defined (hand-computed cases), is
refused in one line where it cannot apply, keeps the parameter and FLOP counts exact, and a fit with all three
resumes exactly; left at their defaults, the model is the one it was before them."""

import dataclasses
import math

import pytest
import torch
from helpers import ROOT, TINY_FIT, fit_straight_and_resumed, last_checkpoint, one_line_error, resumable_fit
from lightning.fabric.utilities.throughput import measure_flops

from lit_attn import GPTConfig, Transformer
from lit_attn.analytic import gpt_params, gpt_train_flops_per_token
from lit_attn.attention import build_attention, register_attention, unregister_attention
from lit_attn.attention.registry import attention_names, get_attention
from lit_attn.cli.lightning_cli import cli
from lit_attn.hf import hf_family
from lit_attn.testing import check_attention
from lit_attn.tools.cost_card_layout import swapped
from lit_attn.tools.export import main as export_main
from lit_attn.training.checkpoint import save_checkpoint

EPS = 1e-5  # kernels.QK_NORM_EPS


def rms(x: torch.Tensor) -> torch.Tensor:
    """x over the RMS of its last axis, written out."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


# ---- QK-norm ----

@pytest.mark.parametrize("rope", [False, True])
def test_qk_norm_normalises_each_heads_queries_and_keys_then_rotates_them(rope):
    torch.manual_seed(0)
    attn = build_attention("mha", n_embd=8, n_head=2, block_size=4, rope=rope, qk_norm=True).eval()
    x = torch.randn(1, 4, 8)
    q, k, v = (t.view(1, 4, 2, 4).transpose(1, 2) for t in attn.qkv(x).split(8, -1))  # (B, H, T, hs)
    q, k = rms(q), rms(k)
    if rope:
        q, k = attn.rope(q), attn.rope(k)
    scores = (q @ k.transpose(-2, -1) / 2).masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(), float("-inf"))
    expected = attn.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(1, 4, 8))  # sqrt(hs) = 2 above
    torch.testing.assert_close(attn(x), expected)


# Every family that has queries and keys, with the softmax families' window, sinks and gate among them.
QK_NORMED = [("mha", None), ("gqa", {"window": 3, "sinks": True}), ("sqa", {"gate": "elementwise"}),
             ("xsmqa", None), ("diff", None), ("mla", None), ("mla", {"q_lora_rank": 8})]


def scale_queries_and_keys(attn: torch.nn.Module, factor: float) -> None:
    """Multiply the weights that make the queries and keys (not the values) by `factor`."""
    with torch.no_grad():
        if hasattr(attn, "kv_up"):  # MLA: the query, the keys' no-RoPE up-projection and the shared RoPE key
            (attn.q_proj.weight if attn.q_lora_rank is None else attn.q_up.weight).mul_(factor)
            attn.kv_up.weight.view(attn.n_head, attn.nope + attn.v_dim, -1)[:, :attn.nope].mul_(factor)
            attn.kv_down.weight[attn.kv_lora_rank:].mul_(factor)
        else:  # one fused projection: queries, keys, then the values
            attn.qkv.weight[: -attn.n_kv_heads * attn.head_size].mul_(factor)


@pytest.mark.parametrize("name, options", QK_NORMED)
def test_with_qk_norm_the_scale_of_queries_and_keys_no_longer_matters(name, options):
    def outputs(qk_norm: bool, size: float) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        attn = build_attention(name, options, n_embd=16, n_head=4, block_size=8, rope=True, qk_norm=qk_norm).eval()
        x = size * torch.randn(2, 8, 16)
        before = attn(x)
        scale_queries_and_keys(attn, 5.0)
        return before, attn(x)

    # large inputs: queries and keys well above the norm's epsilon; small ones: softmaxes far from one-hot
    torch.testing.assert_close(*outputs(True, 20.0), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(*outputs(False, 1.0), rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("name, options", QK_NORMED)
def test_every_family_that_takes_qk_norm_passes_check_attention_with_it(name, options):
    check_attention(name, options, qk_norm=True)  # causal, gradients, RoPE, cached decoding, counts


@pytest.mark.parametrize("name, why", [
    ("noq", "has no queries to normalise"),
    ("gated_deltanet", "already L2-normalises its queries and keys"),
    ("mamba2", "has no queries and keys to normalise"),
    ("qsa", "has no query and key vectors to normalise"),
])
def test_an_attention_that_cannot_apply_qk_norm_is_refused_in_one_line(name, why):
    message = one_line_error(GPTConfig, vocab_size=10, attention=name, n_layer=1, n_embd=16, n_head=2, block_size=8,
                             qk_norm=True)
    assert message.startswith(f"attention {name!r} {why}") and message.endswith("; drop --model.qk_norm")


class NoNorm(torch.nn.Module):
    """An attention of one's own that takes no qk_norm (and says nothing of why)."""

    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.proj = torch.nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def test_an_attention_without_a_qk_norm_argument_is_refused_it():
    register_attention("no_norm", NoNorm)
    try:
        message = one_line_error(GPTConfig, vocab_size=10, attention="no_norm", n_embd=16, n_head=2, qk_norm=True)
        assert GPTConfig(vocab_size=10, attention="no_norm", n_embd=16, n_head=2).qk_norm is False
    finally:
        unregister_attention("no_norm")
    assert message == ("attention 'no_norm' does not normalise queries and keys (its constructor takes no qk_norm); "
                       "drop --model.qk_norm")


def test_a_layer_pattern_names_the_layer_that_cannot_apply_qk_norm():
    message = one_line_error(GPTConfig, vocab_size=10, n_layer=2, n_embd=16, n_head=2, qk_norm=True,
                             layer_pattern=["mha", "gated_deltanet"])
    assert message.startswith("--model.layer_pattern layer 1 (gated_deltanet): attention 'gated_deltanet'")


def test_auto_applies_qk_norm_where_the_attention_can_and_nowhere_else():
    # A hybrid: layer 0 normalises its queries and keys, the recurrent layer 1 cannot and is left without.
    config = GPTConfig(vocab_size=10, n_layer=2, n_embd=16, n_head=2, block_size=8, qk_norm="auto",
                       layer_pattern=["mha", "gated_deltanet"])
    torch.manual_seed(0)
    auto = Transformer(config)
    torch.manual_seed(0)
    plain = Transformer(dataclasses.replace(config, qk_norm=False))
    plain.load_state_dict(auto.state_dict())
    x = torch.randint(0, 10, (2, 8))
    assert not torch.allclose(auto(x), plain(x))  # layer 0 normalised
    assert [block.attn.qk_norm for block in auto.blocks[:1]] == [True]
    only_recurrent = dataclasses.replace(config, n_layer=1, layer_pattern=None, attention="gated_deltanet")
    torch.manual_seed(0)
    a, b = Transformer(only_recurrent), Transformer(dataclasses.replace(only_recurrent, qk_norm=False))
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(x), b(x))  # nothing to normalise: the same model as without


def test_the_command_line_refuses_qk_norm_in_one_line_and_leaves_nothing(corpus, tmp_path, capsys):
    runs = tmp_path / "runs"
    args = resumable_fit(corpus, runs, "noq", 2, "--model.attention=noq", "--model.qk_norm=true", total_steps=2)
    assert cli(args) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: attention 'noq' has no queries to normalise (its queries are the input itself); drop --model.qk_norm")
    assert not (runs / "noq").exists()


def test_the_cost_card_counts_an_attention_that_cannot_normalise_without_qk_norm():
    base = GPTConfig(vocab_size=10, n_layer=1, n_embd=16, n_head=4, block_size=8, qk_norm=True)
    assert (swapped(base, "gqa").qk_norm, swapped(base, "noq").qk_norm) == (True, False)


# ---- ReLU² MLP ----

def test_relu2_squares_the_relu_of_the_hidden_layer():
    config = GPTConfig(vocab_size=10, n_layer=1, n_embd=2, n_head=1, ffn="relu2", ffn_hidden=2, bias=False)
    ffn = Transformer(config).blocks[0].ffn
    with torch.no_grad():
        ffn.in_proj.weight.copy_(torch.eye(2))
        ffn.out_proj.weight.copy_(torch.tensor([[1.0, 1.0], [0.0, 1.0]]))
    # h = (-2, 3) -> ReLU(h)^2 = (0, 9) -> (0 + 9, 9)
    assert torch.equal(ffn(torch.tensor([[-2.0, 3.0]])), torch.tensor([[9.0, 9.0]]))


def test_relu2_is_as_wide_as_gelu_by_default():
    assert GPTConfig(vocab_size=10, n_embd=32, n_head=2, ffn="relu2").ffn_width == 4 * 32


# ---- logit soft-capping ----

def test_logit_softcap_is_cap_times_tanh_of_the_logits_over_cap():
    config = GPTConfig(vocab_size=3, n_layer=1, n_embd=2, n_head=1, bias=False, tie_embeddings=False,
                       logit_softcap=15.0)
    model = Transformer(config)
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [3.0, 0.0]]))
    got = model.logits(torch.tensor([[10.0, -1.0]]))  # raw logits (10, -1, 30)
    expected = torch.tensor([[15 * math.tanh(10 / 15), 15 * math.tanh(-1 / 15), 15 * math.tanh(2.0)]])
    torch.testing.assert_close(got, expected)


def test_the_forward_and_its_selected_positions_are_capped():
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=12, n_layer=1, n_embd=16, n_head=2, block_size=8)
    plain = Transformer(config)
    capped = Transformer(dataclasses.replace(config, logit_softcap=2.0))
    capped.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 12, (2, 8))
    raw = plain(idx)
    torch.testing.assert_close(capped(idx), 2.0 * torch.tanh(raw / 2.0))
    select = idx % 2 == 0
    torch.testing.assert_close(capped(idx, select=select), 2.0 * torch.tanh(raw[select] / 2.0))


@pytest.mark.parametrize("use_cache", [False, True])
def test_sampling_draws_from_the_capped_logits(use_cache):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=12, n_layer=1, n_embd=16, n_head=2, block_size=16, logit_softcap=0.5)
    model = Transformer(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(50)  # raw logits far beyond the cap: capped and uncapped draws part at once
    prompt = torch.tensor([[1, 2, 3]])
    out = model.generate(prompt, 6, use_cache=use_cache, generator=torch.Generator().manual_seed(1))
    draws, expected = torch.Generator().manual_seed(1), prompt
    for _ in range(6):
        probabilities = model(expected)[:, -1].float().softmax(-1)
        expected = torch.cat([expected, torch.multinomial(probabilities, 1, generator=draws)], 1)
    assert torch.equal(out, expected)


# ---- export, counts, defaults ----

@pytest.mark.parametrize("option, refused", [
    (dict(qk_norm=True), "qk_norm=true (transformers' GPT-2 and Llama do not normalise queries and keys)"),
    (dict(logit_softcap=15.0), "logit_softcap=15.0 (transformers' GPT-2 and Llama do not cap their logits)"),
    (dict(ffn="relu2"), "pos learned, norm layernorm, ffn relu2"),
])
def test_export_refuses_what_gpt2_and_llama_cannot_compute(option, refused):
    exportable = GPTConfig(vocab_size=10, n_layer=1, n_embd=16, n_head=2, block_size=8)
    assert hf_family(exportable) == "gpt2"
    message = one_line_error(hf_family, dataclasses.replace(exportable, **option))
    assert message.startswith(f"cannot export to Hugging Face: {refused};")


@pytest.mark.parametrize("attention, layout", [
    ("mha", dict(ffn="relu2", qk_norm=True, logit_softcap=15.0)),
    ("gqa", dict(ffn="relu2", bias=False, pos="rope", norm="rmsnorm", tie_embeddings=False)),
    ("diff", dict(qk_norm=True, pos="rope")),
    ("mla", dict(qk_norm=True, pos="rope", ffn="relu2")),
])
def test_counts_stay_exact_and_only_the_mlp_changes_them(attention, layout):
    config = GPTConfig(vocab_size=50, attention=attention, n_layer=2, n_embd=64, n_head=8, block_size=32, **layout)
    model = Transformer(config)
    assert gpt_params(config)["total"] == sum(p.numel() for p in model.parameters())
    with torch.device("meta"):
        meta = Transformer(config)
        x = torch.zeros(3, 32, dtype=torch.long)
    assert measure_flops(meta, lambda: meta(x), loss_fn=torch.Tensor.sum) == 3 * 32 * gpt_train_flops_per_token(config)
    # QK-norm and the cap add no parameters and no matmuls; ReLU² has GELU's weights
    plain = dataclasses.replace(config, qk_norm=False, logit_softcap=None, ffn="gelu")
    assert (gpt_params(config), gpt_train_flops_per_token(config)) == (gpt_params(plain),
                                                                      gpt_train_flops_per_token(plain))


def test_left_at_their_defaults_the_options_leave_the_model_as_before():
    config = GPTConfig(vocab_size=10, n_layer=1, n_embd=8, n_head=2)
    assert (config.qk_norm, config.logit_softcap, config.ffn) == (False, None, "gelu")
    keys = ["tok_emb.weight", "pos_emb.weight", "blocks.0.norm1.weight", "blocks.0.norm1.bias",
            "blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "blocks.0.attn.out_proj.weight",
            "blocks.0.attn.out_proj.bias", "blocks.0.norm2.weight", "blocks.0.norm2.bias",
            "blocks.0.ffn.in_proj.weight", "blocks.0.ffn.in_proj.bias", "blocks.0.ffn.out_proj.weight",
            "blocks.0.ffn.out_proj.bias", "norm_f.weight", "norm_f.bias", "lm_head.weight"]
    assert list(Transformer(config).state_dict()) == keys
    on = dataclasses.replace(config, qk_norm=True, logit_softcap=15.0, ffn="relu2")
    assert list(Transformer(on).state_dict()) == keys  # a checkpoint's keys are the same with them on
    # a run's settings from before these options build the same model
    before = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("qk_norm", "logit_softcap")}
    assert GPTConfig.from_hparams(before) == config


# ---- a fit ----

STEPS = 8
RECIPE = ("--model.qk_norm=true", "--model.ffn=relu2", "--model.logit_softcap=15.0", "--model.pos=rope")


def test_a_fit_with_every_option_trains_resumes_exactly_and_refuses_another_cap(small_corpus, tmp_path, capsys):
    fit = fit_straight_and_resumed(small_corpus, tmp_path, *RECIPE, steps=STEPS)
    saved = last_checkpoint(tmp_path / "straight")
    assert {k: saved["hyper_parameters"][k] for k in ("qk_norm", "ffn", "logit_softcap")} == {
        "qk_norm": True, "ffn": "relu2", "logit_softcap": 15.0}
    capsys.readouterr()
    out = tmp_path / "hf"
    assert export_main(["--run", str(tmp_path / "straight"), "--out", str(out)]) == 2 and not out.exists()
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "error: cannot export to Hugging Face: qk_norm=true")
    assert fit("halves", STEPS + 2, "--ckpt_path=last", "--model.logit_softcap=30.0") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "error: the checkpoint's model differs from this run's: logit_softcap=15.0 (this run: 30.0)")


def test_a_run_from_before_the_options_resumes_without_them_and_refuses_them(corpus, tmp_path, capsys):
    def fit(steps, *extra):
        return cli(resumable_fit(corpus, tmp_path, "old", steps, *extra, total_steps=4, every=2, val_every=2))

    assert fit(2) == 0
    path = tmp_path / "old" / "checkpoints" / "last.ckpt"
    old = last_checkpoint(tmp_path / "old")
    for key in ("qk_norm", "logit_softcap"):  # as a checkpoint written before them
        del old["hyper_parameters"][key]
    save_checkpoint(old, path)
    capsys.readouterr()
    assert fit(4, "--ckpt_path=last", "--model.qk_norm=true") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "error: the checkpoint's model differs from this run's: qk_norm=False (this run: True)")
    assert fit(4, "--ckpt_path=last") == 0


# ---- configs/recipe_modern.yaml ----

# One attention of each kind in the README's test command, every other registered one in the long tests.
QUICK_RECIPE = ("mha", "mla", "noq", "gated_deltanet")


@pytest.mark.parametrize("attention", [name if name in QUICK_RECIPE else pytest.param(name, marks=pytest.mark.long)
                                       for name in attention_names()])
def test_the_modern_recipe_trains_every_registered_attention(attention, small_corpus, tmp_path, capsys):
    args = ["fit", f"--config={ROOT / 'configs' / 'recipe_modern.yaml'}", f"--data.path={small_corpus}",
            f"--runs_dir={tmp_path}", "--run=r", f"--model.attention={attention}", *TINY_FIT]
    if not get_attention(attention).rope:  # the recipe's rotary positions: refused in one line, as the config says
        assert cli(args) == 2 and capsys.readouterr().err.strip().endswith("use --model.pos learned")
        args.append("--model.pos=learned")
    assert cli(args) == 0
    saved = last_checkpoint(tmp_path / "r")
    hp = saved["hyper_parameters"]
    assert (hp["optimizer"], hp["schedule"], hp["qk_norm"], hp["ffn"]) == ("muon", "trapezoidal", "auto", "relu2")
    assert [g["name"] for g in saved["optimizer_states"][0]["param_groups"]][0] == "muon"
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values() if v.is_floating_point())
