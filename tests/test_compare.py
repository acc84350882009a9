"""lit_attn.compare on two real short runs: table, CSV, plots, values from the event files."""

from __future__ import annotations

import csv

import pytest
from helpers import TINY_FIT, scalars

from lit_attn import compare
from main import cli


def test_compare_two_runs(tmp_path, corpus, capsys):
    runs = tmp_path / "runs"
    for attention in ("mha", "mqa"):
        assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={runs}", f"--run=r-{attention}",
                    f"--model.attention={attention}", *TINY_FIT]) == 0
    empty = runs / "empty"
    empty.mkdir()
    capsys.readouterr()  # the fits' own console tables
    out = tmp_path / "cmp"
    assert compare.main([str(runs / "r-mha"), str(runs / "r-mqa"), str(empty), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed == (out / "compare.md").read_text()
    lines = printed.splitlines()
    assert lines[0].startswith("| run | attention | parameters | val loss |") and len(lines) == 5
    assert lines[2].startswith("| r-mha | mha |") and lines[3].startswith("| r-mqa | mqa |")
    assert lines[4] == "| empty |" + "  |" * 8  # no events: blank, not a crash
    for png in ("val_loss_vs_step.png", "val_loss_vs_time.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    with (out / "compare.csv").open() as f:
        rows = {r["run"]: r for r in csv.DictReader(f)}
    assert float(rows["r-mqa"]["val_loss"]) == scalars(runs / "r-mqa", "val/loss")[-1][1]
    assert int(rows["r-mqa"]["parameters"]) == int(scalars(runs / "r-mqa", "params/total")[-1][1])
    assert float(rows["r-mha"]["tokens_per_sec"]) > 0 and float(rows["r-mha"]["train_time_s"]) > 0
    # MQA shares one K/V head: fewer parameters than MHA at the same width.
    assert int(rows["r-mqa"]["parameters"]) < int(rows["r-mha"]["parameters"])
    assert rows["empty"]["val_loss"] == ""
    assert [s for s, _, _ in compare.read_run(runs / "r-mha")["curve"]] == [1, 3]


def test_compare_missing_dir(tmp_path, capsys):
    assert compare.main([str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == f"error: run directory not found: {tmp_path / 'nope'}"


def test_attention_is_read_from_yaml(tmp_path, capsys):
    """hparams.yaml (top level) wins over config.yaml (model section); quoting, comments and nesting are YAML's."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("data:\n  attention: wrong\nmodel:\n  n_head: 4\n  attention: 'gqa'  # comment\n")
    assert compare._attention(run) == "gqa"
    (run / "hparams.yaml").write_text("attention_options: null\nattention: \"sqa\"\n")
    assert compare._attention(run) == "sqa"
    (run / "hparams.yaml").write_text("attention: [unclosed\n")
    assert compare._attention(run) == "gqa" and "is not valid YAML" in capsys.readouterr().err
    assert compare._attention(tmp_path) == ""


def test_compare_parse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        compare.main(["--out", "x"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "error: the following arguments are required: run_dirs (--help lists the flags)\n"
