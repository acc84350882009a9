"""The decoding benchmark on the small layout: outputs, cache bytes, cached vs uncached generation, CLI errors."""

from __future__ import annotations

import csv
from dataclasses import fields

import pytest
import torch
from helpers import NO_GPU, exit_status

from benchmarks.bench_decode import LAYOUTS, DecodeRow, build_model, main, model_config, run_generate

ATTENTIONS = ["mha", "gqa"]
CONTEXTS = [16, 32]
BATCHES = [1, 2]
TINY = ["--layout", "small", "--decode-steps", "2", "--repeats", "1", "--warmup", "0", "--device", "cpu"]


def test_cli_writes_csv_md_and_pngs(tmp_path, capsys):
    out = tmp_path / "dec"
    argv = ["--attention", ",".join(ATTENTIONS), "--contexts", "16,32", "--batches", "1,2", *TINY, "--out", str(out)]
    assert main(argv) == 0
    table = capsys.readouterr().out.split("\n\n", 1)[1]
    body = [line for line in table.splitlines() if line.startswith("| mha |") or line.startswith("| gqa |")]
    assert len(body) == len(ATTENTIONS) * len(CONTEXTS) * len(BATCHES)
    assert (out / "decode.md").read_text().count("\n| gqa |") == len(CONTEXTS) * len(BATCHES)

    with open(out / "decode.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == [f.name for f in fields(DecodeRow)]
        records = list(reader)
    combos = [(r["attention"], int(r["batch"]), int(r["context"])) for r in records]
    assert combos == [(a, b, t) for b in BATCHES for t in CONTEXTS for a in ATTENTIONS]
    for r in records:
        assert float(r["prefill_s"]) > 0 and float(r["decode_s_per_token"]) > 0
        assert float(r["decode_s_per_token_min"]) <= float(r["decode_s_per_token"])
        assert float(r["decode_tokens_per_sec"]) == pytest.approx(int(r["batch"]) / float(r["decode_s_per_token"]))
        assert float(r["state_bytes_measured"]) == int(r["state_bytes_analytic"])
        assert r["peak_mib"] == "" and r["decoding"] == "per token"  # CPU: not measured
    per_token = {r["attention"]: int(r["state_bytes_analytic"]) // int(r["context"]) for r in records}
    # small layout: 2 layers x (k, v) x 8 heads x head size 8 x 4 bytes; gqa keeps n_head/4 key/value heads
    assert per_token == {"mha": 2 * 2 * 8 * 8 * 4, "gqa": 2 * 2 * 2 * 8 * 4}
    for name in ("decode.png", "cache.png"):
        png = (out / name).read_bytes()
        assert len(png) > 1000 and png.startswith(b"\x89PNG\r\n\x1a\n")


def test_gqa_cache_is_a_quarter_of_mha_at_16_heads():
    sizes = {}
    for name in ("mha", "gqa"):
        model = build_model(model_config("paper", name), torch.device("cpu"), torch.float32)
        cache = model.new_cache(1, 4)
        sizes[name] = sum(layer.nbytes for layer in cache) / 4
    assert sizes["mha"] == 8 * 2 * 16 * 16 * 4 and sizes["gqa"] * 4 == sizes["mha"]


def test_generate_cached_and_uncached_give_the_same_tokens():
    rows = run_generate(["mha", "sqa"], "small", prompt=8, new_tokens=6, warmup=0, repeats=1)
    assert [r.attention for r in rows] == ["mha", "sqa"]
    assert all(r.same_tokens and r.first_difference is None and r.cached_s > 0 and r.uncached_s > 0 for r in rows)


def test_generate_cli_reports_same_tokens(tmp_path, capsys):
    argv = ["--generate", "--attention", "mha", "--prompt", "8", "--new-tokens", "4", *TINY, "--out", str(tmp_path)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("greedy generation, batch 1, prompt 8, 4 new tokens; small layout")
    row = next(line for line in lines if line.startswith("| mha |"))
    assert row.rstrip(" |").endswith("yes")
    assert (tmp_path / "generate.md").read_text().count("| mha |") == 1


BLOCK = LAYOUTS["small"].block_size


STATES = ["mha", 'mha{"window": 16}', "mla", "gated_deltanet"]


def test_decode_state_per_sequence_grows_only_for_a_full_cache(tmp_path, capsys):
    """The state one sequence holds after T tokens, from the buffers: growing for mha and mla, flat past the window
    for a windowed mha, flat for gated_deltanet (no RoPE: it runs with learned positions)."""
    argv = ["--attention", ",".join(STATES), "--contexts", "8,32,64", "--batches", "2", *TINY, "--out", str(tmp_path)]
    assert main(argv) == 0
    assert "gated_deltanet | 2 | 64 |" in capsys.readouterr().out
    with open(tmp_path / "decode.csv", newline="") as fh:
        records = list(csv.DictReader(fh))
    state = {(r["attention"], int(r["context"])): float(r["state_bytes_measured"]) for r in records}
    kind = {r["attention"]: r["decoding"] for r in records}
    assert kind == {"mha": "per token", STATES[1]: "window", "mla": "per token", "gated_deltanet": "fixed"}
    for name in STATES:
        config = model_config("small", name)
        layout = config.spec.state(**config.attention_args())
        assert [state[name, t] for t in (8, 32, 64)] == [4 * config.n_layer * layout.values(t) for t in (8, 32, 64)]
    assert state["mha", 8] < state["mha", 32] < state["mha", 64] and state["mla", 32] == 4 * state["mla", 8]
    assert state[STATES[1], 8] < state[STATES[1], 32] == state[STATES[1], 64]  # 16 tokens kept past 16
    assert state["gated_deltanet", 8] == state["gated_deltanet", 32] == state["gated_deltanet", 64] > 0
    assert model_config("small", "gated_deltanet").pos == "learned" and model_config("small", "mla").pos == "rope"


@pytest.mark.parametrize(("argv", "message"), [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--decode-steps", "x"], "--decode-steps='x' is invalid: expected int"),
    (["--contexts", "16,x"], "--contexts='16,x' is invalid: expected comma-separated integers"),
    (["--batches", "0"], "--batches needs integers >= 1"),
    (["--attention", "mha,no_such"], "unknown attention 'no_such'"),
    (["--attention", "mha{{window: 4}}"], "--attention entry 'mha{{window: 4}}': its options are not JSON"),
    (["--attention", 'mha{{"windw": 4}}'], "attention 'mha' got unknown option(s) windw"),
    (["--layout", "small", "--contexts", str(BLOCK + 1)], "--contexts values must be <= the small layout"),
    (["--contexts", "8", "--decode-steps", "9"], "--decode-steps must be between 1 and the smallest"),
    (["--layout", "small", "--generate", "--prompt", str(BLOCK)], "--prompt and --new-tokens must be >= 1"),
    (["--compile", "--warmup", "0"], "--compile needs --warmup >= 1"),
    pytest.param(["--device", "cuda"], "--device cuda: this machine has no CUDA GPU; use --device cpu", marks=NO_GPU),
    pytest.param(["--device", "cuda:1"], "--device cuda:1: this machine has no CUDA GPU", marks=NO_GPU),
    (["--device", "gpu"], "--device gpu: not a torch device; use cpu, cuda or cuda:N"),
    (["--out", "{file}"], "--out {file} is a file; give a directory"),
    (["--out", "{full}"], "--out {full} already holds decode.md, decode.csv; pass --overwrite to replace them"),
    (["--generate", "--out", "{gen}"], "--out {gen} already holds generate.md; pass --overwrite to replace it"),
    (["--batches", "1,100000000", *TINY], "batch 100000000 x context 128 needs about "),
], ids=lambda v: " ".join(v)[:40] if isinstance(v, list) else None)
def test_cli_errors_are_one_line(argv, message, tmp_path, capsys):
    """Exit status 2 and one `error:` line on stderr; outputs already there are left as they were."""
    paths = {"file": tmp_path / "a_file", "full": tmp_path / "full", "gen": tmp_path / "gen"}
    paths["file"].write_text("x")
    for name, files in (("full", ["decode.md", "decode.csv"]), ("gen", ["generate.md"])):
        paths[name].mkdir()
        for f in files:
            (paths[name] / f).write_text("kept")
    argv = [a.format(**paths) for a in argv]
    assert exit_status(main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + message.format(**paths)) and err.count("\n") == 1, err
    assert all(f.read_text() == "kept" for d in ("full", "gen") for f in paths[d].iterdir())


def test_existing_outputs_are_replaced_with_overwrite(tmp_path, capsys):
    (tmp_path / "decode.md").write_text("old")
    argv = ["--attention", "mha", "--contexts", "16", "--batches", "1", *TINY, "--out", str(tmp_path)]
    assert main([*argv, "--overwrite"]) == 0
    assert (tmp_path / "decode.md").read_text().startswith("small layout")


def test_memory_estimate_covers_weights_caches_and_the_prefill():
    """Weights and caches of every model, plus one prefill's activations: the estimate grows with each."""
    from benchmarks.bench_decode import memory_needed
    from lit_attn.analytic import cache_values_per_token

    mha, gqa = model_config("small", "mha"), model_config("small", "gqa")
    model = build_model(mha, torch.device("cpu"), torch.float32)
    weights = sum(t.nbytes for t in [*model.parameters(), *model.buffers()])
    one = memory_needed([mha], 1, 16, 4)
    assert one > weights + cache_values_per_token(mha) * 4 * 16 + mha.vocab_size * 4 * 16
    assert memory_needed([mha], 2, 16, 4) - weights == pytest.approx(2 * (one - weights), rel=0.01)
    assert memory_needed([mha, gqa], 1, 16, 4) > one
