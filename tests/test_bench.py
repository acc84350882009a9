"""The attention benchmark on tiny sizes: Markdown table, CSV and PNG are well formed."""

from __future__ import annotations

import csv
import re
from dataclasses import fields

import pytest
import torch
from helpers import NO_GPU, ROOT, exit_status

from benchmarks.bench import Row, main, run_benchmark
from benchmarks.bench_report import TABLE_HEADER, markdown_table

ATTENTIONS = ["mha", "sqa", "xsqa"]
SEQ_LENS = [8, 16]


def _table_rows(table: str) -> list[list[str]]:
    lines = table.strip().splitlines()
    assert lines[0].startswith("| part | attention | T |")
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def test_run_benchmark_rows_and_speedups():
    rows = run_benchmark(ATTENTIONS, SEQ_LENS, tokens=32, warmup=0, repeats=1)
    assert [(r.attention, r.seq_len) for r in rows] == [(a, t) for t in SEQ_LENS for a in ATTENTIONS]
    assert [r.batch for r in rows if r.attention == "mha"] == [4, 2]  # tokens // T keeps tokens per step constant
    for r in rows:
        assert r.fwd_s > 0 and r.fwd_bwd_s > 0
        assert r.peak_mem_mib is None  # CPU: not measured, reported as n/a
        assert r.ideal_score == 16 / r.n_query_heads
        assert r.eff_fwd == pytest.approx(r.speedup_fwd / r.ideal_score)
        assert r.fwd_s_min <= r.fwd_s <= r.fwd_s_max and r.fwd_bwd_s_min <= r.fwd_bwd_s <= r.fwd_bwd_s_max
    assert all(r.speedup_fwd == 1.0 for r in rows if r.attention == "mha")


def test_options_and_attentions_without_rope():
    """An entry carries its options as JSON (its commas are its own); gated_deltanet, which takes no RoPE, runs with
    learned positions; the ideal-FLOPs speed-up of both follows their capped context terms."""
    from benchmarks.bench import layout
    from lit_attn.cli.toolcli import split_attentions

    entries = split_attentions('mha,mha{"window": 4, "sinks": "learned"},gated_deltanet')
    assert entries == ["mha", 'mha{"window": 4, "sinks": "learned"}', "gated_deltanet"]
    assert layout(entries[1], 16).attention_options == {"window": 4, "sinks": "learned"}
    assert (layout("gated_deltanet", 16).pos, layout("mha", 16).pos) == ("learned", "rope")
    rows = run_benchmark(["mha", 'mha{"window": 4}', "gated_deltanet"], [16], tokens=16, warmup=0, repeats=1)
    assert [r.attention for r in rows] == ["mha", 'mha{"window": 4}', "gated_deltanet"]
    assert all(r.fwd_s > 0 and r.fwd_bwd_s > 0 for r in rows)
    assert rows[1].ideal_flops > 1  # the window caps the scores at 4 keys of 16


def test_steps_are_timed_in_turns():
    import torch

    from benchmarks.bench import time_interleaved

    calls = []
    steps = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    times = time_interleaved(steps, torch.device("cpu"), warmup=1, repeats=3)
    assert calls == ["a", "b", "c", "c", "b", "a", "a", "b", "c", "c", "b", "a"]  # the order alternates
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3, "c": 3}


def test_markdown_table_is_well_formed():
    rows = run_benchmark(ATTENTIONS, SEQ_LENS, tokens=32, warmup=0, repeats=1)
    body = _table_rows(markdown_table(rows))
    assert len(body) == len(ATTENTIONS) * len(SEQ_LENS)
    for cells in body:
        assert len(cells) == len(TABLE_HEADER)
        assert cells[0] == "layer" and cells[1] in ATTENTIONS
        for cell in cells[2:-1]:
            float(cell)  # every timing, speed-up and efficiency cell is numeric
        assert cells[-1] == "n/a"


def test_cli_writes_table_csv_and_png(tmp_path, capsys):
    out = tmp_path / "bench"
    argv = ["--attention", ",".join(ATTENTIONS), "--seq-lens", "8,16", "--tokens", "32",
            "--repeats", "1", "--warmup", "0", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    body = _table_rows(capsys.readouterr().out.split("\n\n", 1)[1])
    assert len(body) == len(ATTENTIONS) * len(SEQ_LENS)

    with open(out / "bench.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == [f.name for f in fields(Row)]
        records = list(reader)
    assert [(r["attention"], int(r["seq_len"])) for r in records] == [(a, t) for t in SEQ_LENS for a in ATTENTIONS]
    for r in records:
        for key in ("fwd_s", "fwd_bwd_s", "speedup_fwd", "speedup_fwd_bwd", "ideal_score", "eff_fwd_bwd"):
            assert float(r[key]) > 0
        assert r["peak_mem_mib"] == ""

    png = (out / "bench.png").read_bytes()
    assert len(png) > 1000 and png.startswith(b"\x89PNG\r\n\x1a\n")
    assert (out / "bench.md").read_text().count("\n| layer |") == len(body)


def test_sqa_paper_speed_script_runs_the_papers_layout(monkeypatch, capsys):
    """python -m benchmarks.bench_sqa_paper on CPU at a tiny batch: the paper's models, with its figures beside."""
    # `python -m benchmarks.X` runs from the repository root, which is then on sys.path; so it is here too.
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import bench_sqa_paper

    assert bench_sqa_paper.main(["--variants", "mha,xsmqa", "--batch", "1", "--seq-len", "16", "--steps", "1",
                                 "--warmup", "0", "--device", "cpu"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["mha"][1:2] == ["11,966,224"] and rows["xsmqa"][1:2] == ["10,196,752"]
    assert rows["mha"][3] == "1.000" and rows["xsmqa"][4:6] == ["0.6250", "0.871"]


def _fake_free_memory(monkeypatch, sequences: float, share: float = 1.0) -> tuple[int, int]:
    """Make bench_sqa_paper see RAM for `sequences` of context 16 (of mha) in `share` of it; (fixed, per sequence)."""
    from benchmarks import bench_sqa_paper

    fixed, per_seq = bench_sqa_paper.memory_per_batch(["mha"], 16)
    monkeypatch.setattr(bench_sqa_paper, "available_memory", lambda: int((fixed + sequences * per_seq) / share))
    return fixed, per_seq


@pytest.mark.parametrize(("sequences", "expected"), [
    (1000, 128), pytest.param(100, 64, marks=pytest.mark.slow), pytest.param(5, 4, marks=pytest.mark.slow), (1.5, 1)])
def test_sqa_paper_speed_picks_a_cpu_batch_that_fits(sequences, expected, monkeypatch, capsys):
    """Without --batch, the largest power of two up to 128 whose estimate fits in 80% of the free RAM, said so."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import bench_sqa_paper

    _fake_free_memory(monkeypatch, sequences, share=0.8)
    assert bench_sqa_paper.cpu_batch(None, ["mha"], 16) == expected
    assert capsys.readouterr().err.startswith(f"CPU: batch {expected} (about ")


@pytest.mark.parametrize(("argv", "sequences", "message"), [
    (["--batch", "11"], 10, r"error: batch 11 x context 16 needs about .* GiB of memory \(estimated\), .* GiB is "
                            r"available; pass --batch 10 or less$"),
    pytest.param([], 0.5, r"error: one sequence of context 16 needs about .*; pass a shorter --seq-len$",
                 marks=pytest.mark.slow),
    pytest.param(["--batch", "1"], 0.5, r"error: batch 1 x context 16 needs .*; pass a shorter --seq-len$",
                 marks=pytest.mark.slow),
], ids=["batch-too-big", "default-no-room", "batch-1-no-room"])
def test_sqa_paper_speed_refuses_a_batch_that_does_not_fit(argv, sequences, message, monkeypatch, capsys):
    """Refused before any model is trained: one line with the memory needed, the memory free, and the fix."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import bench_sqa_paper

    _fake_free_memory(monkeypatch, sequences)
    monkeypatch.setattr(bench_sqa_paper, "run", lambda *a: pytest.fail("ran a batch that does not fit"))
    assert bench_sqa_paper.main(["--variants", "mha", "--seq-len", "16", "--device", "cpu", *argv]) == 2
    captured = capsys.readouterr()
    assert re.fullmatch(message, captured.err.strip()) and captured.err.count("\n") == 1, captured.err
    assert captured.out == ""


def test_memory_estimate_grows_with_the_tokens_and_counts_adam():
    """The estimate's parts: weights x 4 (weights, gradients, two AdamW moments) and a per-token part from
    the bytes saved for backward, the same whether probed on 4 or 16 tokens."""
    from benchmarks.bench import PEAK_OVER_SAVED, saved_bytes, train_step_memory

    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    weights = sum(p.nbytes for p in model.parameters())
    per_token = []
    for tokens in (4, 16):
        x = torch.randn(tokens, 8)
        saved = saved_bytes(lambda x=x: model(x).sum(), list(model.parameters()))
        assert saved >= tokens * (8 + 32) * 4  # at least each linear layer's input
        fixed, t = train_step_memory(model, lambda x=x: model(x).sum(), tokens, optimizer_states=2)
        assert fixed == 4 * weights and t == pytest.approx(PEAK_OVER_SAVED * saved / tokens)
        per_token.append(t)
    assert per_token[0] == pytest.approx(per_token[1])


TINY = ["--seq-lens", "8", "--tokens", "8", "--repeats", "1", "--warmup", "0", "--device", "cpu"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--tokens", "x"], "--tokens='x' is invalid: expected int (--help lists the flags)"),
    (["--seq-lens", "8,x"], "--seq-lens='8,x' is invalid: expected comma-separated integers"),
    (["--repeats", "0"], "--repeats and --tokens and every --seq-lens value must be >= 1"),
    (["--tokens", "-5"], "--repeats and --tokens and every --seq-lens value must be >= 1"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--attention", "mha,no_such", *TINY, "--out", "{new}"], "unknown attention 'no_such'"),
    (["--attention", "mha{{window}}", "--out", "{new}"], "--attention entry 'mha{{window}}': its options are not JSON"),
    (["--attention", 'mha{{"window": 1}}', "--out", "{new}"], "the attention option window (--model.attention_options) "
                                                              "must be an integer >= 2"),
    pytest.param(["--device", "cuda"], "--device cuda: this machine has no CUDA GPU; use --device cpu", marks=NO_GPU),
    (["--device", "tpu0"], "--device tpu0: not a torch device"),
    (["--out", "{file}"], "--out {file} is a file; give a directory"),
    (["--out", "{full}"], "--out {full} already holds bench.csv; pass --overwrite to replace it or give another --out"),
    (["--seq-lens", "1024", "--tokens", "1000000000", "--model", "--attention", "mha", "--out", "{new}"],
     "the layer at T=1024 x batch 976562 needs about "),
    (["--seq-lens", "100000000", "--tokens", "1", "--attention", "mha", "--out", "{new}"],
     "the layer at T=100000000 x batch 1 needs about "),
], ids=lambda v: " ".join(v)[:40] if isinstance(v, list) else None)
def test_cli_errors_are_one_line(argv, message, tmp_path, capsys):
    """Exit status 2 and one `error:` line; nothing is run or written, outputs already there stay."""
    paths = {"file": tmp_path / "a_file", "full": tmp_path / "full", "new": tmp_path / "new"}
    paths["file"].write_text("x")
    paths["full"].mkdir()
    (paths["full"] / "bench.csv").write_text("kept")
    assert exit_status(main, [a.format(**paths) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + message.format(**paths)) and err.count("\n") == 1, err
    assert (paths["full"] / "bench.csv").read_text() == "kept" and not paths["new"].exists()


def test_memory_refusal_names_the_tokens_that_fit(monkeypatch, capsys):
    """The --tokens it suggests is a multiple of T whose estimate fits the memory available."""
    from benchmarks import bench

    fixed, per_token = bench.group_memory("layer", ["mha"], 64, torch.float32)
    monkeypatch.setattr(bench, "available_memory", lambda: int(fixed + per_token * 64 * 10.5))
    with pytest.raises(ValueError, match=r"T=64 x batch 20 needs .*; pass --tokens 640 or less$"):
        bench.run_benchmark(["mha"], [64], tokens=64 * 20, warmup=0, repeats=1)
    assert bench.run_benchmark(["mha"], [64], tokens=640, warmup=0, repeats=1)[0].batch == 10


def test_existing_outputs_are_replaced_with_overwrite(tmp_path, capsys):
    (tmp_path / "bench.md").write_text("old")
    assert main(["--attention", "mha", *TINY, "--out", str(tmp_path), "--overwrite"]) == 0
    assert (tmp_path / "bench.md").read_text().startswith("device cpu")


@pytest.mark.slow
def test_bench_report_does_not_import_bench():
    """bench_report is imported by bench, never the reverse: a fresh interpreter shows which modules it loads."""
    import subprocess
    import sys

    code = "import sys, benchmarks.bench_report; print('benchmarks.bench' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False"]


def test_benchmarks_edit_no_path():
    """benchmarks/ is a package that imports the project without sys.path edits."""
    sources = sorted((ROOT / "benchmarks").glob("*.py"))
    assert (ROOT / "benchmarks" / "__init__.py") in sources
    assert not [p.name for p in sources if "sys.path" in p.read_text().replace("without editing sys.path", "")]


def _stats_csv(path, groups, reference="mha"):
    """compare's stats.csv for {attention: ({seed: final val loss}, time per batch)}, paired against `reference`."""
    from lit_attn.tools import stats
    from lit_attn.tools.compare import write_stats_csv

    table = [{"group": name, "n_runs": len(losses), "seeds": ", ".join(map(str, losses)), "data_seeds": "",
              "loss": stats.summarize(list(losses.values())),
              "acc": stats.summarize([0.5] * len(losses)), "time_median": time, "time_min": time, "time_max": time,
              "tokens_mean": 1000.0,
              "paired": None if name == reference else stats.paired_difference(losses, groups[reference][0])}
             for name, (losses, time) in groups.items()]
    write_stats_csv(table, "attention", reference, path)


def test_sqa_paper_table_puts_the_papers_ratios_beside_the_measured_ones(monkeypatch, tmp_path, capsys):
    """The paper's time vs MHA and loss difference are computed from its table; ours from stats.csv."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import sqa_paper_table

    stats = tmp_path / "stats.csv"
    _stats_csv(stats, {"mha": ({1: 2.0, 2: 2.1, 3: 1.9}, 0.5),
                       "sqa": ({1: 2.1, 2: 2.2, 3: 2.0}, 0.3),  # +0.1 at every seed
                       "xsqa": ({1: 1.9, 2: 2.2, 3: 1.9}, 0.25)})  # -0.1, +0.1, 0: mean 0, std 0.1
    assert sqa_paper_table.main([str(stats), "--out", str(tmp_path / "t.md")]) == 0
    printed = capsys.readouterr().out
    assert (tmp_path / "t.md").read_text() == printed
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in printed.splitlines()[2:]}
    # paper: sqa 0.6417 / 0.7173 s and 1.2272 - 1.1976 loss; ours: 0.3 / 0.5 s and the paired +0.1
    assert rows["sqa"][3:5] == ["0.895", "+0.0296"]
    assert rows["sqa"][5:12] == ["3", "2.1000 ± 0.1000", "50.00%", "0.3000", "0.600", "+0.1000 [+0.1000, +0.1000]",
                                 "worse"]
    assert rows["mha"][3:5] == ["1.000", "+0.0000"] and rows["mha"][9:11] == ["1.000", ""]
    # mean 0 ± t(0.975, 2) * 0.1 / sqrt(3) = 4.3027 * 0.05774 = 0.2484
    assert rows["xsqa"][9:12] == ["0.500", "+0.0000 [-0.2484, +0.2484]", "indistinguishable at this budget"]
    assert rows["gqa"][5] == "0" and rows["gqa"][-1] == "not run"


def _write_sqa_only(path):
    _stats_csv(path, {"sqa": ({1: 2.1}, 0.3)}, reference="sqa")


@pytest.mark.parametrize(("make", "extra", "message"), [
    (None, [], r"stats.csv is not a file; give the stats.csv"),
    (lambda p: p.mkdir(), [], r"stats.csv is not a file"),
    (_write_sqa_only, [], r"has no mha runs; the ratios are relative to mha"),
    (lambda p: p.write_text("n_kv_heads,n_runs\n4,3\n"), [], r"is not a stats.csv grouped by attention"),
    (lambda p: p.write_bytes(b"\xff\xfe\x00\x81"), [], r"is not a readable CSV \("),
    (lambda p: p.write_text("attention,reference\nmha,mha\n"), [], r"lacks the column 'time_per_batch_median_s'"),
    (lambda p: p.write_text("attention,reference,time_per_batch_median_s\nmha,mha,x\n"), [],
     r"has a cell that is not a number"),
    ("ok", ["--out", "{tmp}/t.md"], r"--out .*t.md exists; pass --overwrite to replace it or give another --out"),
    ("ok", ["--out", "{tmp}"], r"--out .* is a directory; give a file name"),
    ("ok", ["--out", "{tmp}/no/t.md"], r"--out .*: the directory .*no does not exist"),
], ids=["missing", "directory", "no-mha", "not-grouped", "binary", "old-columns", "not-a-number", "out-exists",
        "out-is-dir", "out-parent-missing"])
def test_sqa_paper_table_errors_are_one_line(make, extra, message, monkeypatch, tmp_path, capsys):
    """Every bad input: exit status 2, one `error:` line on stderr, nothing on stdout, no file touched."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import sqa_paper_table

    stats = tmp_path / "stats.csv"
    if make == "ok":
        _stats_csv(stats, {"mha": ({1: 2.0}, 0.5)})
        (tmp_path / "t.md").write_text("kept")
    elif make is not None:
        make(stats)
    assert sqa_paper_table.main([str(stats), *(a.format(tmp=tmp_path) for a in extra)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and captured.err.startswith("error: "), captured
    assert re.search(message, captured.err), captured.err
    assert make != "ok" or (tmp_path / "t.md").read_text() == "kept"


def test_sqa_paper_table_overwrites_only_when_asked(monkeypatch, tmp_path, capsys):
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import sqa_paper_table

    stats, out = tmp_path / "stats.csv", tmp_path / "t.md"
    _stats_csv(stats, {"mha": ({1: 2.0}, 0.5)})
    out.write_text("old")
    assert sqa_paper_table.main([str(stats), "--out", str(out), "--overwrite"]) == 0
    assert out.read_text() == capsys.readouterr().out != "old"
