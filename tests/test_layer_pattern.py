"""Per-layer attention patterns (--model.layer_pattern): each layer built with its own attention and options, the
counts summed over the layers (and equal to the measured ones), decoding through each layer's own state, the CLI
fit and its resume, and a bad pattern refused in one line naming the flag."""

import pytest
import torch
from helpers import fit_straight_and_resumed, last_checkpoint, one_line_error, resumable_fit
from lightning.fabric.utilities.throughput import measure_flops

from callbacks.params import _rows, _title, build_report
from lit_attn import GPTConfig, Transformer
from lit_attn.analytic import (
    attention_params,
    cache_values_per_sequence,
    gpt_params,
    gpt_train_flops_per_token,
    layer_flops_per_token,
    layer_params,
)
from lit_attn.attention import get_attention
from lit_attn.cli.lightning_cli import cli
from lit_attn.cli.ranges import model_size
from lit_attn.hf import hf_family
from lit_attn.pattern import pattern_label
from lit_attn.tools.events import hparams_record
from lit_attn.tools.export import main as export_main
from lit_attn.tools.run_record import read_run

SMALL = dict(vocab_size=40, n_embd=32, n_head=4, block_size=32)
MIXED = ["mla", {"attention": "gqa", "options": {"window": 4, "sinks": True}}, "diff", "mha"]


def config(pattern, n_layer=4, **kw):
    return GPTConfig(**SMALL | dict(n_layer=n_layer, layer_pattern=pattern) | kw)


def windows(model):
    return [getattr(block.attn, "window", "none") for block in model.blocks]


@pytest.mark.parametrize("pattern, n_layer, local_window, expected", [
    ("SSSL", 8, 8, [8, 8, 8, None] * 2),  # nanochat's window_pattern
    ("SL", 4, 16, [16, None, 16, None]),  # Gemma 2's 1 local : 1 global
    ("SSSSSL", 8, 4, [4, 4, 4, 4, 4, None, 4, 4]),  # Gemma 3's 5 local : 1 global, repeated and cut at n_layer
    ("L", 2, None, [None, None]),
])
def test_letters_give_each_layer_its_window(pattern, n_layer, local_window, expected):
    model = Transformer(config(pattern, n_layer, local_window=local_window))
    assert windows(model) == expected
    assert {type(block.attn) for block in model.blocks} == {get_attention("mha").cls}


def test_a_list_mixes_registered_attentions_and_repeats_when_it_divides_n_layer():
    model = Transformer(config(["mla", {"options": {"window": 4}}], n_layer=4, attention_options={"gate": "headwise"}))
    classes = [type(block.attn) for block in model.blocks]
    assert classes == [get_attention("mla").cls, get_attention("mha").cls] * 2
    # The model's attention takes its entry's options over --model.attention_options; another one only its own
    # (mla takes no gate: given the model's options, it would refuse them).
    assert windows(model)[1::2] == [4, 4] and model.blocks[1].attn.gate is not None
    model = Transformer(config(["gqa", "mha"], n_layer=2, attention="gqa", attention_options={"gate": "headwise"}))
    assert model.blocks[0].attn.gate is not None and model.blocks[1].attn.gate is None


@pytest.mark.parametrize("pattern, kw", [
    ("SSSL", dict(local_window=8)),
    (MIXED, dict(pos="rope")),
    (["mha", "gqa"], dict(ffn="swiglu", norm="rmsnorm", pos="rope")),
])
def test_counts_are_the_sums_of_the_layers_and_equal_the_measured_ones(pattern, kw):
    c = config(pattern, **kw)
    layers = c.layers
    assert layer_params(c) == [attention_params(layer) for layer in layers]
    with torch.device("meta"):
        model = Transformer(c)
        x = torch.zeros(2, 32, dtype=torch.long)
    measured = [sum(p.numel() for p in block.attn.parameters()) for block in model.blocks]
    assert layer_params(c) == measured
    assert gpt_params(c)["attention"] == sum(measured)
    assert gpt_params(c)["total"] == sum(p.numel() for p in model.parameters())
    assert model_size(c)[0] == gpt_params(c)["total"]  # the memory check's estimate
    assert measure_flops(model, lambda: model(x), loss_fn=torch.Tensor.sum) == \
        2 * 32 * gpt_train_flops_per_token(c)


def test_the_local_layers_flops_per_token_stop_growing_past_the_window():
    c = config("SSSL", n_layer=4, block_size=64, local_window=8)
    per_context = {t: layer_flops_per_token(c, t) for t in (4, 8, 16, 32, 64)}
    local = [splits[0].total for splits in per_context.values()]
    full = [splits[3].total for splits in per_context.values()]
    assert local[0] < local[1] == local[2] == local[3] == local[4]
    assert full == sorted(full) and len(set(full)) == 5  # the global layer keeps growing
    assert per_context[64][0] == per_context[64][1] == per_context[64][2]
    # The model's training FLOPs per token grow with the global layer alone past the window.
    growth = [gpt_train_flops_per_token(c, t) - gpt_train_flops_per_token(c, 8) for t in (16, 32, 64)]
    assert growth == [3 * (per_context[t][3].total - per_context[8][3].total) for t in (16, 32, 64)]


def test_decode_memory_is_flat_for_the_local_layers_and_the_cache_holds_what_the_counts_say():
    c = config("SL", n_layer=2, block_size=32, local_window=4)
    model = Transformer(c)
    held = {n: [s.nbytes for s in model.new_cache(1, n)] for n in (2, 4, 8, 16)}
    assert [held[n][0] for n in (4, 8, 16)] == [held[4][0]] * 3  # the S layer: a ring of 4 tokens
    assert held[4][1] < held[8][1] < held[16][1]  # the L layer grows
    assert [sum(h) for h in held.values()] == [4 * cache_values_per_sequence(c, n) for n in held]


def test_cached_decoding_equals_the_full_forward_for_a_mixed_pattern():
    torch.manual_seed(0)
    model = Transformer(config(MIXED, n_layer=4, block_size=16, pos="rope")).eval()
    torch.nn.init.normal_(model.blocks[1].attn.sinks)
    idx = torch.randint(0, 40, (2, 16))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2)
        steps = [model(idx[:, :7], cache, torch.arange(7))]
        steps += [model(idx[:, t : t + 1], cache, torch.tensor([t])) for t in range(7, 12)]
        steps += [model(idx[:, 12:], cache, torch.arange(12, 16))]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-4)
    start = idx[:, :5]
    assert torch.equal(model.generate(start, 15, temperature=0), model.generate(start, 15, temperature=0,
                                                                               use_cache=False))


def test_the_parameter_table_has_a_row_per_layer_and_per_kind_of_layer():
    from helpers import tiny_gpt

    report = build_report(tiny_gpt(32, n_head=4, n_layer=2, layer_pattern=["sqa", "mha"]))
    rows = {label.strip(): (m, a) for label, m, a in _rows(report)}
    assert rows["layer 0 sqa"][0] == rows["layer 0 sqa"][1] != rows["layer 1 mha"][0] == rows["layer 1 mha"][1]
    assert "attn FLOPs/token (sqa, x1): quadratic" in rows and "attn FLOPs/token (mha, x1): quadratic" in rows
    assert "attention sqa+mha, 2 layers" in _title(report) and "Hq/Hkv by layer kind 2/1, 4/4" in _title(report)


def test_labels_name_the_pattern():
    assert pattern_label("mha", "sssl", 64) == "mha/SSSL/w64"
    assert pattern_label("mha", "LL") == "mha/LL"
    assert pattern_label("mha", ["gqa", "gqa", "gqa", {"options": {"window": 8}}]) == "3*gqa+mha(window=8)"
    assert pattern_label("mha", None) == "mha"


def test_hugging_face_export_refuses_a_pattern_in_one_line():
    message = one_line_error(hf_family, config("SL", n_layer=2, local_window=4))
    assert "layer_pattern 'SL'" in message and "same attention" in message


BAD = [
    (dict(layer_pattern="SXL"), "--model.layer_pattern 'SXL' has unknown letter(s) X"),
    (dict(layer_pattern=""), "--model.layer_pattern is empty"),
    (dict(layer_pattern="   "), "--model.layer_pattern is empty"),
    (dict(layer_pattern=[]), "--model.layer_pattern is an empty list"),
    (dict(layer_pattern=["mha", "gqa", "mqa"]), "lists 3 layers, which neither equals nor divides --model.n_layer 4"),
    (dict(layer_pattern="SSSSSL"), "has 6 letters for 4 layers"),
    (dict(layer_pattern=["mha", "bogus"]), "--model.layer_pattern entry 1: unknown attention 'bogus'"),
    (dict(layer_pattern=["mha", {"attention": "mha", "opts": {}}]), "entry 1 has unknown key(s) opts"),
    (dict(layer_pattern=["mha", 3]), "entry 1 must be an attention name"),
    (dict(layer_pattern=["mha", {"options": 4}]), "entry 1: options must be a mapping"),
    (dict(layer_pattern=["mha", {"attention": "mla", "options": {"window": 4}}]),
     "--model.layer_pattern layer 1 (mla(window=4)): attention 'mla' got unknown option(s) window"),
    (dict(layer_pattern=["mha", {"options": {"window": 1}}]), "layer 1 (mha(window=1)): the attention option window"),
    (dict(layer_pattern="SL", attention="qsa"), "attention 'qsa' has no window option for its S layers"),
    (dict(layer_pattern="SL", attention_options={"window": 4}), "drop window from --model.attention_options"),
    (dict(layer_pattern="SL", local_window=32), "--model.local_window must be an integer from 2 to"),
    (dict(layer_pattern="SL"), "--model.layer_pattern 'SL' has S layers: give their window with --model.local_window"),
    (dict(layer_pattern="LL", local_window=8), "has no S layer for --model.local_window"),
    (dict(local_window=8), "--model.local_window sizes the S layers of --model.layer_pattern, which is not set"),
    (dict(layer_pattern=["mha"], local_window=8), "a list --model.layer_pattern gives each layer's window"),
    (dict(layer_pattern=7), "--model.layer_pattern must be a string of the letters S and L"),
]


@pytest.mark.parametrize("settings, message", BAD)
def test_a_bad_pattern_is_refused_in_one_line_naming_the_flag(settings, message):
    def build(**kw):  # a layer's options reach its constructor only when the network is built
        Transformer(GPTConfig(**kw))

    assert message in one_line_error(build, **SMALL | dict(n_layer=4) | settings)


def test_the_command_line_refuses_a_bad_pattern_in_one_line_and_leaves_nothing(corpus, tmp_path, capsys):
    runs = tmp_path / "runs"
    args = resumable_fit(corpus, runs, "bad", 2, "--model.n_layer=2", "--model.layer_pattern=SQ", total_steps=2)
    assert cli(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --model.layer_pattern 'SQ' has unknown letter(s) Q")
    assert not (runs / "bad").exists()


STEPS = 8
# A list in JSON, as on a command line: MLA, then windowed GQA with sinks, repeated over 4 layers.
PATTERN = ('--model.layer_pattern=["mla", {"attention": "gqa", "options": {"window": 4, "sinks": true}}]',
           "--model.n_layer=4", "--model.pos=rope")


def test_a_patterned_fit_trains_resumes_exactly_and_refuses_another_pattern(small_corpus, tmp_path, capsys):
    fit = fit_straight_and_resumed(small_corpus, tmp_path, *PATTERN, steps=STEPS)
    saved = last_checkpoint(tmp_path / "straight")
    assert saved["hyper_parameters"]["layer_pattern"][1]["options"] == {"window": 4, "sinks": True}
    assert read_run(tmp_path / "straight")["attention"] == "mla+gqa(sinks=True, window=4)"
    assert hparams_record(tmp_path / "straight")["Attention"] == "mla+gqa(sinks=True, window=4)"  # TensorBoard's tab
    capsys.readouterr()
    out = tmp_path / "hf" / "straight"
    assert export_main(["--run", str(tmp_path / "straight"), "--out", str(out)]) == 2 and not out.exists()
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "error: cannot export to Hugging Face: layer_pattern [")
    assert fit("halves", STEPS + 2, "--ckpt_path=last", "--model.layer_pattern=[\"mla\", \"gqa\"]") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: the checkpoint's model differs from this run's: layer_pattern=")


# A Gated DeltaNet hybrid as Qwen3-Next lays it out: three recurrent layers to one of attention.
HYBRID = ('--model.layer_pattern=["gated_deltanet", "gated_deltanet", "gated_deltanet", "mha"]', "--model.n_layer=4")


def test_a_gated_deltanet_hybrid_trains_resumes_exactly_and_counts_per_layer(small_corpus, tmp_path):
    """The recurrent layers' fixed states and the attention layer's cache in one model: a fit stopped half way and
    resumed ends with the weights of one that never stopped, and the counts are per layer."""
    fit_straight_and_resumed(small_corpus, tmp_path, *HYBRID, steps=STEPS)
    assert read_run(tmp_path / "straight")["attention"] == "3*gated_deltanet+mha"
    config = GPTConfig(vocab_size=20, attention="mha", n_layer=4, n_embd=32, n_head=4, block_size=16,
                       layer_pattern=["gated_deltanet", "gated_deltanet", "gated_deltanet", "mha"])
    gdn, mha = (get_attention(n) for n in ("gated_deltanet", "mha"))
    args = config.attention_args()
    assert layer_params(config) == [gdn.params(**args)] * 3 + [mha.params(**args)]
    # one sequence's decode state: three fixed recurrent states, one cache that grows per token
    fixed = 3 * gdn.state(**args).values(1)
    assert cache_values_per_sequence(config, 16) - fixed == 16 * (cache_values_per_sequence(config, 1) - fixed)


def recorded_run(root, name, **model):
    """A run directory that records only its model (hparams.yaml), as the tools read it."""
    import yaml

    run = root / name
    run.mkdir()
    (run / "hparams.yaml").write_text(yaml.safe_dump(SMALL | dict(n_layer=2) | model))
    return run


def test_the_tools_tell_patterned_runs_apart_and_count_each_for_its_own_layers(tmp_path):
    from lit_attn.tools.cost_card import choose_layout
    from lit_attn.tools.recall_grid import same_model
    from lit_attn.tools.run_record import run_attention

    plain = recorded_run(tmp_path, "plain", attention="mha")
    local = recorded_run(tmp_path, "local", attention="mha", layer_pattern="SL", local_window=4)
    again = recorded_run(tmp_path, "again", attention="mha", layer_pattern="SL", local_window=4)
    swapped = recorded_run(tmp_path, "swapped", attention="mha", layer_pattern="LS", local_window=4)
    assert [run_attention(r) for r in (plain, local, swapped)] == ["mha", "mha/SL/w4", "mha/LS/w4"]
    # One model for the recall grid only if every layer is the same.
    assert same_model(local) == same_model(again) != same_model(plain)
    assert same_model(local) != same_model(swapped)
    # The cost card counts each run for its own layers: the local layer's cache stops at the window.
    _, configs, _ = choose_layout("runs", [str(plain), str(local)], vocab_size=40)
    assert configs["mha/SL/w4"].layer_pattern == "SL" and configs["mha"].layer_pattern is None
    assert cache_values_per_sequence(configs["mha/SL/w4"], 32) < cache_values_per_sequence(configs["mha"], 32)
