"""The `gate` option of the softmax families (sigmoid output gating): its formula, counts, cached decoding,
`none` leaving the attention as it was, refusals and fits through the command line."""

import pytest
import torch
from helpers import TINY_FIT, last_checkpoint, write_corpus

from lit_attn import GPTConfig, Transformer
from lit_attn.attention import build_attention, get_attention
from lit_attn.attention.kernels import causal_attention
from lit_attn.cli.lightning_cli import cli
from lit_attn.testing import check_attention

FAMILIES = ["mha", "gqa", "sqa", "xsmqa", "noq"]  # full and shared K/V heads, fewer query heads, no query projection
GATES = ["headwise", "elementwise"]
SIZES = dict(n_embd=32, n_head=4, block_size=16)


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("name", FAMILIES)
def test_gated_attentions_pass_check_attention(name, gate):
    check_attention(name, {"gate": gate})


def heads_output(attn, x):
    """The attention's heads' outputs (B, T, Hq*hs) before any gate, as the ungated forward computes them."""
    hs = attn.head_size
    if hasattr(attn, "qkv"):
        q, k, v = attn.qkv(x).split([attn.n_query_heads * hs, attn.n_kv_heads * hs, attn.n_kv_heads * hs], dim=-1)
    else:  # noq: the input is the query
        q, (k, v) = x, attn.kv(x).chunk(2, dim=-1)
    return causal_attention(q, k, v, hs, attn.rope, 0.0)


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("name", ["gqa", "sqa", "noq"])
def test_the_gate_multiplies_each_heads_output_by_a_sigmoid_of_the_input(name, gate):
    torch.manual_seed(0)
    attn = build_attention(name, {"gate": gate}, **SIZES, bias=True).eval()
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        y = heads_output(attn, x)
        B, T, width = y.shape
        hq = attn.n_query_heads
        scores = torch.sigmoid(x @ attn.gate.proj.weight.T + attn.gate.proj.bias)  # (B, T, Hq or Hq*hs)
        assert scores.size(-1) == (hq if gate == "headwise" else width)
        gated = y.view(B, T, hq, -1) * scores.view(B, T, hq, -1)  # one scalar per head, or one per channel
        torch.testing.assert_close(attn(x), attn.out_proj(gated.view(B, T, width)))


def test_a_zero_gate_halves_the_heads_output():
    torch.manual_seed(0)
    gated = build_attention("mha", {"gate": "elementwise"}, **SIZES).eval()
    plain = build_attention("mha", None, **SIZES).eval()
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if not k.startswith("gate.")})
    torch.nn.init.zeros_(gated.gate.proj.weight)  # sigmoid(0) = 1/2 everywhere; no biases anywhere
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        torch.testing.assert_close(gated(x), plain(x) / 2)


@pytest.mark.parametrize("name", FAMILIES)
def test_gate_none_is_the_attention_as_it_was(name):
    """No parameter, no key and no output changes: checkpoints of ungated runs load as they are."""
    torch.manual_seed(0)
    default = build_attention(name, None, **SIZES).eval()
    torch.manual_seed(0)
    none = build_attention(name, {"gate": "none"}, **SIZES).eval()
    assert not [k for k in default.state_dict() if "gate" in k]
    assert default.state_dict().keys() == none.state_dict().keys()
    assert all(torch.equal(v, none.state_dict()[k]) for k, v in default.state_dict().items())
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        assert torch.equal(default(x), none(x))
        assert torch.equal(default(x), default.out_proj(heads_output(default, x)))
    spec = get_attention(name)
    assert spec.params(**spec.arguments({"gate": "none"}, SIZES)) == spec.params(**spec.arguments(None, SIZES))


# d=32, four heads of 8: mha's projections 4 d^2 = 4096; sqa (Hq=2, Hkv=1): d*(2+2)*8 + 2*8*d = 1536.
@pytest.mark.parametrize("name,options,common,expected", [
    ("mha", {"gate": "headwise"}, {}, 4096 + 32 * 4),
    ("mha", {"gate": "elementwise"}, {}, 4096 + 32 * 32),
    ("mha", {"gate": "headwise"}, {"qkv_bias": True}, 4096 + 3 * 32 + 32 * 4 + 4),  # the gate's bias follows q/k/v's
    ("sqa", {"gate": "headwise"}, {}, 1536 + 32 * 2),
    ("sqa", {"gate": "elementwise"}, {"bias": True}, 1536 + (2 + 2) * 8 + 32 + 32 * 16 + 16),
    ("noq", {"gate": "elementwise"}, {}, 3072 + 32 * 32),  # noq: no query projection (d^2 less)
])
def test_parameter_count_is_the_hand_formula(name, options, common, expected):
    spec = get_attention(name)
    args = spec.arguments(options, {**SIZES, **common})
    assert spec.params(**args) == expected
    assert sum(p.numel() for p in spec.build(**args).parameters()) == expected


@pytest.mark.parametrize("gate,width", [("none", 0), ("headwise", 4), ("elementwise", 32)])
def test_the_gate_adds_its_projection_to_the_linear_flops(gate, width):
    spec = get_attention("mha")
    split = spec.flops(16, **spec.arguments({"gate": gate}, SIZES))
    assert split.linear == 2 * 4 * 32 * 32 + 2 * 32 * width and split.quadratic == 4 * 32 * 16
    assert spec.state(**spec.arguments({"gate": gate}, SIZES)).shapes == {"k": (4, 8), "v": (4, 8)}  # nothing cached


@pytest.mark.parametrize("name,gate,pos", [("gqa", "headwise", "rope"), ("noq", "elementwise", "learned")])
def test_cached_decoding_equals_the_full_forward_in_a_model(name, gate, pos):
    torch.manual_seed(0)
    model = Transformer(GPTConfig(vocab_size=23, attention=name, attention_options={"gate": gate}, n_layer=2,
                                  n_embd=32, n_head=4, block_size=16, pos=pos)).eval()
    idx = torch.randint(0, 23, (2, 16))
    cache = model.new_cache(2)
    with torch.no_grad():
        full = model(idx)
        steps = [model(idx[:, :5], cache, torch.arange(5))]
        steps += [model(idx[:, t:t + 1], cache, torch.tensor([t])) for t in range(5, 16)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("options,message", [
    ('{"gate": "bogus"}', "unknown gate 'bogus'; choose none, headwise, elementwise"),
    ('{"gate": 3}', "--model.attention_options key 'gate' of attention 'gqa' must be str"),
])
def test_a_bad_gate_on_the_command_line_is_one_line(options, message, tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus.txt")
    code = cli(["fit", f"--data.path={corpus}", f"--runs_dir={tmp_path / 'runs'}", *TINY_FIT,
                "--model.attention=gqa", f"--model.attention_options={options}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: ") and message in err[-1], err
    assert "Traceback" not in "\n".join(err) and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name,gate,width", [("gqa", "headwise", 4), ("mha", "elementwise", 32)])
def test_a_tiny_fit_trains_a_gated_attention(name, gate, width, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={tmp_path}", "--run=gated", *TINY_FIT,
                f"--model.attention={name}", f'--model.attention_options={{"gate": "{gate}"}}',
                "--samples.max_new_tokens=4", "--params.print_table=false"]) == 0
    checkpoint = last_checkpoint(tmp_path / "gated")
    assert checkpoint["global_step"] == 4
    assert checkpoint["state_dict"]["transformer.blocks.0.attn.gate.proj.weight"].shape == (width, 32)
    assert checkpoint["hyper_parameters"]["attention_options"] == {"gate": gate}
