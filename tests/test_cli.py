import os
import subprocess
import sys
from pathlib import Path

import pytest

from lit_attn import attention_names
from main import main

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, cwd, timeout=240):
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    env.pop("LIT_ATTN_DEBUG", None)
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_fit_smoke_in_subprocess(tmp_path, corpus):
    result = run_cli(
        "fit", f"--data.path={corpus}", "--trainer.max_steps=6", "--trainer.val_check_interval=3",
        "--trainer.limit_val_batches=2", f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        "--model.n_layer=1", "--model.block_size=32", "--trainer.enable_progress_bar=false", cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "runs" / "lit_attn" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert list(run.glob("events.out.tfevents.*"))
    assert "block_size: 32" in (run / "config.yaml").read_text()


@pytest.mark.parametrize("name", attention_names())
def test_fit_every_attention(name, tmp_path, corpus, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", f"--model.attention={name}", f"--data.path={corpus}", "--trainer.fast_dev_run=2",
          "--model.n_layer=1", "--model.block_size=16", "--trainer.enable_progress_bar=false"])


@pytest.mark.parametrize("cmd", ["validate", "test", "predict"])
def test_other_subcommands(cmd, tmp_path, corpus, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main([cmd, f"--data.path={corpus}", "--trainer.limit_" + {"validate": "val", "test": "test", "predict": "predict"}[cmd]
          + "_batches=2", "--model.n_layer=1", "--model.block_size=16", "--trainer.enable_progress_bar=false",
          f"--trainer.logger.init_args.save_dir={tmp_path}"])


@pytest.mark.parametrize("args,message", [
    (["--model.attention=bogus"], "error: unknown attention 'bogus'; choose one of: gqa, mha"),
    (["--model.n_head=3"], "error: n_embd=128 is not divisible by n_head=3"),
    (["--model.attention=mha", "--model.n_query_heads=2", "--model.n_kv_heads=4"],
     "error: n_query_heads=2 is smaller than n_kv_heads=4"),
    (["--data.path=/nonexistent/corpus.txt"], "error: text file not found: /nonexistent/corpus.txt"),
    (["--model.block_size=100000"], "fewer than block_size+1 = 100001"),
    (["--model.lr=-1"], "error: lr must be positive"),
])
def test_user_errors_are_one_line(args, message, tmp_path, corpus):
    base = [] if any(a.startswith("--data.path") for a in args) else [f"--data.path={corpus}"]
    result = run_cli("fit", *base, *args, f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}", cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")
