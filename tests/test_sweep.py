"""lit_attn.sweep: one subprocess fit per attention; a failing variant does not stop the others."""

from __future__ import annotations

import sys

import pytest
from helpers import ROOT, TINY_FIT

from lit_attn import sweep


@pytest.mark.slow
def test_sweep_continues_past_failure(tmp_path, corpus, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LIT_ATTN_DEBUG", raising=False)
    rc = sweep.main(["--attention", "no_such_attention,mqa", "--runs_dir", "runs", "--prefix", "t", "--",
                     f"--data.path={corpus}", *TINY_FIT])
    out, err = capfd.readouterr()
    assert rc == 1
    assert "[sweep] no_such_attention FAILED (exit code" in err and "[sweep] 1 succeeded, 1 failed" in err
    assert (tmp_path / "runs" / "t-mqa" / "checkpoints" / "last.ckpt").is_file()
    assert not (tmp_path / "runs" / "t-no_such_attention").exists()
    table = (tmp_path / "runs" / "t-compare" / "compare.md").read_text()
    assert "| t-mqa | mqa |" in table and "no_such_attention" not in table and table in out
    assert (tmp_path / "runs" / "t-compare" / "val_loss_vs_step.png").is_file()


def test_sweep_usage_errors(tmp_path, capsys):
    assert sweep.main(["--attention", ","]) == 2
    assert "error: --attention needs at least one name" in capsys.readouterr().err
    assert sweep.main(["--attention", "mha", "--config", str(tmp_path / "x.yaml")]) == 2
    assert "error: config file not found" in capsys.readouterr().err


def test_fit_command():
    cmd = sweep.fit_command("gqa", "p-gqa", "r", ["a.yaml"], ["--seed_everything=1"])
    assert cmd[0] == sys.executable and cmd[1] == str(ROOT / "main.py")
    assert cmd[1:] == [str(sweep.main_script()), "fit", "--config", "a.yaml", "--model.attention=gqa", "--run=p-gqa",
                       "--runs_dir=r", "--seed_everything=1"]


def test_sweep_parse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        sweep.main(["--prefix", "p"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        "error: the following arguments are required: attention (--help lists the flags)\n")
    args, extra = sweep.parse_args(["--attention", "mha", "--config", "a.yaml", "--config", "b.yaml", "--",
                                    "--trainer.max_steps=5", "--config", "c.yaml"])
    assert (args.attention, args.config, args.runs_dir, args.prefix, args.out) == ("mha", ["a.yaml", "b.yaml"], "runs",
                                                                                    "sweep", None)
    assert extra == ["--trainer.max_steps=5", "--config", "c.yaml"]
