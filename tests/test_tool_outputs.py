"""Every tool's --out against runs: a run, a place inside one, a runs directory or a project holding runs is refused
in one line, even with --overwrite, and everything there stays byte for byte; and the limits every tool shares
(seeds, threads)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
from pathlib import Path

import pytest
from helpers import ROOT, snapshot

from lit_attn.cli.command import TOOLS
from lit_attn.cli.toolcli import SEED_MAX, check_out_place, check_seed, check_threads, cpu_cores


def make_run(run: Path, vocab: str = "ab \n") -> Path:
    """A run directory as training leaves it (config, event file, last.ckpt of a fresh tiny model)."""
    from lit_attn.config import GPTConfig
    from lit_attn.training.checkpoint import save_checkpoint
    from lit_attn.transformer import Transformer

    config = GPTConfig(vocab_size=len(vocab), n_layer=1, n_embd=16, n_head=4, block_size=8)
    weights = {f"transformer.{k}": v for k, v in Transformer(config).state_dict().items()}
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("model: {}\n")
    (run / "events.out.tfevents.1.host.1.0").write_bytes(b"")
    save_checkpoint({"global_step": 0, "state_dict": weights, "hyper_parameters": dataclasses.asdict(config),
                     "CharDataModule": {"vocab": vocab}}, run / "checkpoints" / "last.ckpt")
    return run


@pytest.fixture
def project(tmp_path) -> Path:
    """A project: its own files, runs/ with two runs (base, other)."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text("print('mine')\n")
    make_run(root / "runs" / "base")
    make_run(root / "runs" / "other")
    return root


# Where --out points, relative to the project: each is refused by every tool.
PLACES = {
    "the run": "runs/base",
    "a place inside the run": "runs/base/eval/new",
    "the run's checkpoints": "runs/base/checkpoints",
    "another run": "runs/other",
    "the runs directory": "runs",
    "the project": ".",
}

# tool -> its arguments with --out OUT, for a project P (commands of `lit-attn`, or benchmark modules).
ARGS = {
    "export": lambda p, out: ["--run", "base", "--runs_dir", str(p / "runs"), "--out", out, "--overwrite"],
    "compare": lambda p, out: [str(p / "runs" / "base"), str(p / "runs" / "other"), "--out", out, "--overwrite"],
    "cost-card": lambda p, out: ["--runs", str(p / "runs" / "base"), "--out", out, "--overwrite"],
    "recall-grid": lambda p, out: [str(p / "runs" / "base"), "--out", out, "--overwrite"],
    "sweep": lambda p, out: ["--attention", "mha", "--runs_dir", str(p / "runs"), "--out", out, "--overwrite"],
    "bench": lambda p, out: ["--attention", "mha", "--seq-lens", "8", "--out", out, "--overwrite"],
    "bench-decode": lambda p, out: ["--attention", "mha", "--out", out, "--overwrite"],
    "benchmarks.bench_hf_decode": lambda p, out: ["--layout", "tiny", "--out", out, "--overwrite"],
    "benchmarks.bench_tokenizer": lambda p, out: ["--workdir", out, "--overwrite"],
}


def call(tool: str, argv: list[str]) -> int:
    """The tool's exit status, run in this process (a main() without arguments reads sys.argv)."""
    module = importlib.import_module(TOOLS.get(tool, tool))
    takes_argv = bool(inspect.signature(module.main).parameters)
    saved = sys.argv
    sys.argv = [tool, *argv]
    try:
        return module.main(argv) if takes_argv else module.main()
    except SystemExit as e:
        return e.code
    finally:
        sys.argv = saved


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: ") and "Traceback" not in "\n".join(err), err
    return err[-1]


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("tool", ARGS)
def test_an_out_among_runs_is_refused_by_every_tool_and_nothing_changes(tool, place, project, monkeypatch, capsys):
    if tool == "export":
        pytest.importorskip("transformers")
    monkeypatch.syspath_prepend(str(ROOT))  # benchmarks/ is run from the repository root
    monkeypatch.chdir(project.parent)
    out = str(project / PLACES[place])
    before = snapshot(project)
    assert call(tool, ARGS[tool](project, out)) == 2
    flag = "--workdir" if tool == "benchmarks.bench_tokenizer" else "--out"
    line = error_line(capsys)
    assert line.startswith(f"error: {flag} {out} ") and "outputs go outside every run" in line, line
    assert snapshot(project) == before
    assert sorted(p.name for p in project.parent.iterdir()) == ["proj"], "nothing is written beside it"


@pytest.mark.parametrize(("where", "refused"), [
    ("runs/base/report.md", "is the run"),
    ("runs/base/checkpoints/report.md", "is inside the run"),
    ("runs/report.md", None),  # beside the runs: no run's file is replaced
    ("report.md", None),
])
def test_a_file_out_is_refused_in_a_run(where, refused, project, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT))
    stats = project.parent / "stats.csv"
    stats.write_text("x\n")
    before = snapshot(project)
    status = call("benchmarks.sqa_paper_table", [str(stats), "--out", str(project / where)])
    if refused:
        assert status == 2 and f"its directory {refused}" in error_line(capsys)
        assert snapshot(project) == before
    else:  # accepted: it goes on to read stats.csv, which is no compare output
        assert "outputs go outside" not in capsys.readouterr().err


@pytest.mark.parametrize(("layout", "given", "expected"), [
    (".", {}, "holds the run"),
    (".", {"runs_dirs": ["runs"]}, "holds the runs directory"),
    ("runs", {}, "is the runs directory of"),
    ("runs", {"runs_dirs": ["runs"]}, "is the runs directory"),
    ("runs/base", {"runs": ["runs/base"]}, "is the run"),
    ("runs/base/a/b", {}, "is inside the run"),
    ("runs/new-compare", {"runs_dirs": ["runs"]}, None),  # beside the runs, as a sweep's PREFIX-compare
    ("elsewhere", {"runs": ["runs/base"], "runs_dirs": ["runs"]}, None),
    ("runs/future", {"runs": ["runs/future"]}, "is the run"),  # a run the command is about to make
    ("runs/not-yet", {"runs": ["runs/not-yet/x"]}, "holds the run"),
    ("deep", {}, "holds the run"),  # a run three levels down
])
def test_check_out_place(layout, given, expected, project, monkeypatch):
    monkeypatch.chdir(project)
    (project / "deep" / "a" / "b").mkdir(parents=True)
    make_run(project / "deep" / "a" / "b" / "run")
    if expected is None:
        check_out_place(Path(layout), **given)
        return
    with pytest.raises(ValueError) as e:
        check_out_place(Path(layout), **given)
    assert f"--out {layout} {expected}" in str(e.value) and "\n" not in str(e.value)


def test_sweep_follows_compares_rule_before_it_trains(project, tmp_path, capsys):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "compare.md").write_text("an earlier comparison\n")
    runs = tmp_path / "new_runs"
    assert call("sweep", ["--attention", "mha", "--runs_dir", str(runs), "--out", str(out)]) == 2
    assert error_line(capsys) == (f"error: --out {out} already holds compare.md; pass --overwrite to replace it or "
                                  f"give another --out")
    assert (out / "compare.md").read_text() == "an earlier comparison\n" and not runs.exists(), "nothing trained"
    assert call("compare", [str(project / "runs" / "base"), "--out", str(out)]) == 2
    assert "already holds compare.md; pass --overwrite" in error_line(capsys)


# ---- seeds: one rule, numpy's range, for every tool ----

SEED_CASES = [
    ("sample", ["--ckpt_path", "x.ckpt", "--seed", "-1"], "--seed -1"),
    ("sample", ["--ckpt_path", "x.ckpt", "--seed", str(10**23)], f"--seed {10**23}"),
    ("sample", ["--ckpt_path", "x.ckpt", "--seed", str(SEED_MAX + 1)], f"--seed {SEED_MAX + 1}"),
    ("probe", ["--run", "x", "--seed", "-1"], "--seed -1"),
    ("probe", ["--run", "x", "--seed", str(SEED_MAX + 1)], f"--seed {SEED_MAX + 1}"),
    ("sweep", ["--attention", "mha", "--seeds", "1,-1"], "--seeds -1"),
    ("sweep", ["--attention", "mha", "--seeds", str(10**12)], f"--seeds {10**12}"),
]


@pytest.mark.parametrize(("tool", "argv", "named"), SEED_CASES)
def test_seeds_outside_numpys_range_are_refused_naming_the_flag(tool, argv, named, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert call(tool, argv) == 2
    assert error_line(capsys) == f"error: {named}: a seed is an integer from 0 to {SEED_MAX} (numpy's seed range)"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("value", "ok"), [(0, True), (SEED_MAX, True), (-1, False), (SEED_MAX + 1, False),
                                           (True, False), (1.0, False)])
def test_check_seed(value, ok):
    if ok:
        assert check_seed(value, "--seed") == value
    else:
        with pytest.raises(ValueError, match="^--seed .*: a seed is an integer from 0 to 4294967295"):
            check_seed(value, "--seed")


# ---- threads: no more than this process's cores ----

THREAD_TOOLS = ["bench", "bench-decode", "benchmarks.bench_hf_decode", "benchmarks.bench_overhead",
                "benchmarks.bench_qsa", "benchmarks.sdpa_backends"]


@pytest.mark.parametrize("tool", THREAD_TOOLS)
def test_more_threads_than_cores_are_refused(tool, tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.chdir(tmp_path)
    assert call(tool, ["--threads", "100000"]) == 2
    line = error_line(capsys)
    assert line.startswith("error: --threads 100000: this machine gives this process ") and \
        f"use --threads 1 to {cpu_cores()}" in line, line
    assert list(tmp_path.iterdir()) == []


def test_check_threads_counts_this_process_cores(monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert cpu_cores() == 3 and check_threads(1) == 1 and check_threads(3) == 3
    for threads in (4, 0, -1):
        with pytest.raises(ValueError, match=rf"^--threads {threads}: this machine gives this process 3 CPU "
                                             r"core\(s\); use --threads 1 to 3$"):
            check_threads(threads)


def test_help_answers_before_torch_and_lightning_load():
    """`--help` is parsed before the heavy libraries are imported (one child process for all the tools)."""
    import subprocess

    tools = ["sample", "probe", "evaluate", "export", "compare"]
    code = ("import sys, contextlib, io\nfrom lit_attn.cli.command import main\n"
            f"for tool in {tools!r}:\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "        main([tool, '--help'])\n"
            "print(sorted(m for m in ('torch', 'lightning', 'transformers', 'lm_eval') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done
