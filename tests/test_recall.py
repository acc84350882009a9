"""RecallAccuracy: val/mqar_acc on the query positions of an MQAR run, overall and per test setting."""

from __future__ import annotations

import pytest
from helpers import history

from lit_attn.cli.lightning_cli import cli

FLAGS = ["--data", "MQARDataModule", "--data.vocab_size=64", "--data.input_seq_len=16", "--data.num_kv_pairs=2",
         "--data.num_train_examples=512", "--data.num_test_examples=40", "--data.batch_size=8",
         "--model.n_layer=1", "--model.n_embd=32", "--model.n_head=4", "--model.block_size=32",
         "--trainer.max_steps=6", "--trainer.val_check_interval=3", "--trainer.limit_val_batches=null",
         "--trainer.enable_progress_bar=false", "--timing.warmup_batches=1", "--samples.max_new_tokens=0",
         "--params.print_table=false"]


@pytest.mark.parametrize("sparse", [pytest.param(False, marks=pytest.mark.slow), True])
def test_recall_accuracy_overall_and_per_setting(tmp_path, sparse):
    assert cli(["fit", *FLAGS, f"--runs_dir={tmp_path}", "--run=r", "--data.test_settings=[[16, 2], [32, 4]]",
                f"--model.sparse_targets={str(sparse).lower()}"]) == 0
    h = history(tmp_path / "r")
    overall, short, long = (dict(h[tag]) for tag in ("val/mqar_acc", "val/mqar_acc/T16_kv2", "val/mqar_acc/T32_kv4"))
    assert sorted(overall) == sorted(short) == sorted(long) == [2, 5]  # both validations, at their steps
    for step in overall:
        # 40 examples x 2 queries and 40 x 4: the overall accuracy is the slices' query-weighted mean, and the
        # model's own val/acc (every labelled position) is the same number
        weighted = (80 * short[step] + 160 * long[step]) / 240
        assert overall[step] == pytest.approx(weighted, abs=1e-6)
        assert dict(h["val/acc"])[step] == pytest.approx(overall[step], abs=1e-6)


def test_a_language_modelling_run_logs_no_recall_accuracy(tmp_path, corpus):
    assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={tmp_path}", "--run=lm", "--model.n_layer=1",
                "--model.n_embd=16", "--model.n_head=2", "--model.block_size=8", "--trainer.max_steps=2",
                "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
                "--trainer.enable_progress_bar=false", "--timing.warmup_batches=1",
                "--params.print_table=false"]) == 0
    assert not [tag for tag in history(tmp_path / "lm") if tag.startswith("val/mqar_acc")]
