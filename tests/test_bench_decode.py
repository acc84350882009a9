"""The decoding benchmark on the small layout: outputs, cache bytes, cached vs uncached generation, CLI errors."""

from __future__ import annotations

import csv
from dataclasses import fields

import pytest
import torch

from lit_attn.bench_decode import LAYOUTS, DecodeRow, build_model, main, model_config, run_generate

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
        assert float(r["cache_bytes_per_token_measured"]) == int(r["cache_bytes_per_token_analytic"])
        assert r["peak_mib"] == ""  # CPU: not measured
    cache = {r["attention"]: int(r["cache_bytes_per_token_analytic"]) for r in records}
    # small layout: 2 layers x (k, v) x 8 heads x head size 8 x 4 bytes; gqa keeps n_head/4 key/value heads
    assert cache == {"mha": 2 * 2 * 8 * 8 * 4, "gqa": 2 * 2 * 2 * 8 * 4}
    for name in ("decode.png", "cache.png"):
        png = (out / name).read_bytes()
        assert len(png) > 1000 and png.startswith(b"\x89PNG\r\n\x1a\n")


def test_gqa_cache_is_a_quarter_of_mha_at_16_heads():
    sizes = {}
    for name in ("mha", "gqa"):
        model = build_model(model_config("paper", name), torch.device("cpu"), torch.float32)
        cache = model.new_cache(1, 4)
        sizes[name] = sum(t.nbytes for layer in cache for t in layer.values()) / 4
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


def test_cli_errors_are_one_line(capsys):
    block = LAYOUTS["small"].block_size
    for argv, message in (
        (["--bogus"], "error: unrecognized arguments: --bogus"),
        (["--decode-steps", "x"], "error: --decode-steps='x' is invalid: expected int"),
        (["--contexts", "16,x"], "error: --contexts='16,x' is invalid: expected comma-separated integers"),
        (["--batches", "0"], "error: --batches needs integers >= 1"),
        (["--attention", "mha,no_such"], "error: unknown attention 'no_such'"),
        (["--layout", "small", "--contexts", str(block + 1)], "error: --contexts values must be <= the small layout"),
        (["--contexts", "8", "--decode-steps", "9"], "error: --decode-steps must be between 1 and the smallest"),
        (["--layout", "small", "--generate", "--prompt", str(block)], "error: --prompt and --new-tokens must be >= 1"),
        (["--compile", "--warmup", "0"], "error: --compile needs --warmup >= 1"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.startswith(message) and err.count("\n") == 1, err
