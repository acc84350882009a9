"""The README's attention, in the user's own package as one class with forward(x) only: it passes its test, trains
from the command line by its import path, resumes, reports real parameter and FLOP counts, decodes (uncached),
and is costed."""

from __future__ import annotations

import csv
import re

import pytest
import yaml
from docs_commands import write_readme_attention
from helpers import TINY_FIT, history, run_main, write_corpus

from lit_attn.cli import command
from lit_attn.testing import check_attention

PATH = "my_pkg.attn.TemperedAttention"


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    write_readme_attention(tmp_path)  # the README's example, as written there
    monkeypatch.syspath_prepend(str(tmp_path))
    return {"PYTHONPATH": str(tmp_path)}


def test_the_users_attention_passes_the_checks(tmp_path, user_package):
    check_attention(PATH, n_embd=48, n_head=6, block_size=12)
    test = {}
    exec((tmp_path / "test_my_attention.py").read_text(), test)  # the README's one line of test
    test["test_tempered_attention"]()


@pytest.mark.slow
def test_the_users_attention_trains_resumes_decodes_and_is_costed(tmp_path, user_package, capsys, monkeypatch):
    corpus = write_corpus(tmp_path / "corpus.txt")
    args = ["fit", f"--data.path={corpus}", "--run=mine", f"--model.attention={PATH}", *TINY_FIT]
    done = run_main(*args, cwd=tmp_path, env=user_package | {"COLUMNS": "200"})  # rich tables on one line each
    assert done.returncode == 0, done.stderr[-3000:]
    # Real counts in the console: 3*32*32 + 32*32 + 4 temperatures per layer, FLOPs measured on the meta device.
    assert re.search(r"per layer \(x1\)\s*│\s*4,100\s*│\s*4,100", done.stdout), done.stdout[-3000:]
    assert re.search(r"attn FLOPs/token: linear\s*│\s*│\s*8,192", done.stdout)
    assert re.search(r"attn FLOPs/token: quadratic\s*│\s*│\s*2,048", done.stdout)  # 4 * C * T = 4 * 32 * 16
    assert "none (uncached decoding)" in done.stdout and "n/a: no count" not in done.stdout
    run = tmp_path / "runs" / "mine"
    (_, table), = history(run)["params/text_summary"]  # the same counts in TensorBoard's text tab
    table = table.decode() if isinstance(table, bytes) else str(table)
    assert "| per layer (x1) | 4,100 | 4,100 |" in table and "| attn FLOPs/token: linear |  | 8,192 |" in table
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["attention"] == PATH

    # The rest in this process: the fixture put the user's package on its path too.
    monkeypatch.chdir(tmp_path)
    assert tool(*args, "--trainer.max_steps=6", "--ckpt_path=last") == 0
    capsys.readouterr()

    assert tool("sample", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--prompt", "The ",
                "--max_new_tokens", "8", "--temperature", "0") == 0
    assert capsys.readouterr().out.startswith("The ")

    assert tool("cost-card", "--attention", f"mha,{PATH}", "--out", str(tmp_path / "card")) == 0
    rows = {r["attention"]: r for r in csv.DictReader((tmp_path / "card" / "cost_card.csv").open())}
    assert rows[PATH]["decoding"] == "uncached" and rows["mha"]["decoding"] == "per token"
    assert int(rows[PATH]["parameters"]) > 0 and float(rows[PATH]["train_flops_per_token"]) > 0
    capsys.readouterr()

    assert tool("bench-decode", "--attention", f"mha,{PATH}", "--layout", "small", "--contexts", "32",
                "--batches", "1", "--decode-steps", "2", "--repeats", "1", "--out", str(tmp_path / "decode")) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {PATH} | 1 | 32 |"))
    assert "| uncached |" in row  # its decode state: none declared, so decoding recomputes the prefix


def tool(name: str, *args: str) -> int:
    """`lit-attn NAME ARGS` in this process: its exit status."""
    try:
        return command.main([name, *args]) or 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
