"""Every benchmark's bad input ends in one `error:` line and exit status 2, before anything heavy runs."""

from __future__ import annotations

import importlib
import sys

import pytest
from helpers import NO_GPU, ROOT

HUGE = "100000000"

CASES = [
    ("sdpa_backends", ["--device", "foo"], "--device foo: not a torch device"),
    pytest.param("sdpa_backends", ["--device", "cuda"], "--device cuda: this machine has no CUDA GPU", marks=NO_GPU),
    ("sdpa_backends", ["--n-head", "3"], "n_embd=256 is not divisible by n_head=3"),
    ("sdpa_backends", ["--batch", "0"], "--n-embd, --n-head, --seq-len, --batch, --repeats and --threads must be"),
    ("sdpa_backends", ["--seq-len", HUGE, "--batch", "100"], "batch 100 x T=100000000 needs about "),
    ("bench_qsa", ["--batch", "0"], "--batch, --context, --repeats, --threads and every --dims value must be >= 1"),
    ("bench_qsa", ["--batch", HUGE, "--dims", "4"], "d=4 at batch 100000000 x context 16 needs about "),
    ("bench_tokenizer", ["--mb", "-1"], "--mb must be > 0, --vocab-size >= 257"),
    ("bench_tokenizer", ["--vocab-size", "100"], "--mb must be > 0, --vocab-size >= 257"),
    ("bench_tokenizer", ["--num-proc", "0"], "--mb must be > 0, --vocab-size >= 257 and every --num-proc value >= 1"),
    ("bench_tokenizer", ["--mb", "1e9"], "--mb 1e+09: building the corpus needs about "),
    ("bench_tokenizer", ["--workdir", "{file}"], "--workdir {file} is a file; give a directory"),
    ("bench_tokenizer", ["--workdir", "{full}"], "--workdir {full} is not empty; "),
    ("bench_sqa_paper", ["--variants", "mha,bogus"], "--variants bogus: choose among mha, gqa"),
    pytest.param("bench_sqa_paper", ["--device", "cuda"], "--device cuda: this machine has no CUDA GPU", marks=NO_GPU),
    ("bench_sqa_paper", ["--peak-flops", "0"], "--peak-flops must be > 0"),
    ("bench_sqa_paper", ["--steps", "0"], "--seq-len, --batch and --steps must be >= 1"),
    ("bench_overhead", ["--steps", "0"], "--steps, --repeats and --threads must be >= 1"),
    ("bench_overhead", ["--", "--model.n_layer=x"],
     "--model.n_layer must be an integer >= 1 (number of transformer blocks), got 'x'"),
    ("bench_overhead", ["--", "--bogus"], "unrecognized arguments: --bogus"),
    ("bench_compile", ["--", "--trainer.max_steps=x"], "--trainer.max_steps='x' is invalid"),
    ("bench_variants", ["--variant", "mha="], "give at least two --variant NAME=FLAGS"),
    ("bench_variants", ["--variant", "a=", "--variant", "a=--model.lr=1e-3"], "--variant names must differ"),
    ("bench_variants", ["--variant", "a b=--x"], "--variant takes NAME=FLAGS"),
    ("bench_variants", ["--variant", "a=", "--variant", "b=", "--steps", "0"], "--steps, --repeats and --threads"),
    ("bench_muon", ["--steps", "0"], "--n-layer, --n-embd, --n-head, --block-size, --batch, --steps and --repeats"),
    ("bench_muon", ["--n-head", "3"], "--n-embd 128 is not divisible by --n-head 3"),
    ("bench_muon", ["--threads", "999"], "--threads 999: this machine gives this process"),
]


@pytest.mark.parametrize(("module", "argv", "message"), CASES,
                         ids=lambda v: " ".join(v)[:30] if isinstance(v, list) else None)
def test_bad_input_is_one_line(module, argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT))  # benchmarks/ is run from the repository root
    monkeypatch.chdir(tmp_path)
    paths = {"file": tmp_path / "a_file", "full": tmp_path / "full"}
    paths["file"].write_text("x")
    paths["full"].mkdir()
    (paths["full"] / "kept").write_text("kept")
    argv = [a.format(**paths) for a in argv]
    tool = importlib.import_module(f"benchmarks.{module}")
    monkeypatch.setattr(sys, "argv", [module, *argv])  # tools that read their own command line
    try:
        status = tool.main(argv) if module not in ("bench_overhead", "bench_compile") else tool.main()
    except SystemExit as e:
        status = e.code
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: " + message.format(**paths)), captured.err
    assert "Traceback" not in captured.err and (paths["full"] / "kept").read_text() == "kept"
