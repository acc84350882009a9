from pathlib import Path

import pytest
import torch

from lit_attn import attention_names
from lit_attn.cli.lightning_cli import main


def test_fit_smoke(tmp_path, corpus, monkeypatch, capfd):
    """A fit with the default run name (a real main.py process: test_console.py)."""
    monkeypatch.chdir(tmp_path)
    main(["fit", f"--data.path={corpus}", "--trainer.max_steps=6", "--trainer.val_check_interval=3",
          "--trainer.limit_val_batches=2", "--model.n_layer=1", "--model.block_size=32",
          "--trainer.enable_progress_bar=false"])
    (run,) = (tmp_path / "runs").iterdir()  # one run directory, named after the attention and time
    assert run.name.startswith("mha-") and f"run '{run.name}'" in capfd.readouterr().err
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert list(run.glob("events.out.tfevents.*"))
    assert "block_size: 32" in (run / "config.yaml").read_text()


# Every attention in the full suite; the quick loop trains one of each family (test_attention checks them all).
@pytest.mark.parametrize("name", [n if n in ("mha", "sqa", "noq", "qsa") else pytest.param(n, marks=pytest.mark.slow)
                                  for n in attention_names()])
def test_fit_every_attention(name, tmp_path, corpus, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", f"--model.attention={name}", f"--data.path={corpus}", "--trainer.fast_dev_run=2",
          "--model.n_layer=1", "--model.block_size=16", "--trainer.enable_progress_bar=false"])
    (last,) = (tmp_path / "runs").rglob("last.ckpt")
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert state["global_step"] == 2 and state["hyper_parameters"]["attention"] == name
    assert all(torch.isfinite(w).all() for w in state["state_dict"].values()), "two steps left non-finite weights"


@pytest.mark.slow  # seconds: the full suite runs it, the quick loop stays under 2 minutes
def test_other_subcommands_use_a_runs_checkpoint(tmp_path, corpus, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny = [f"--data.path={corpus}", "--model.n_layer=1", "--model.block_size=16",
            "--trainer.enable_progress_bar=false"]
    main(["fit", *tiny, "--run=r", "--trainer.max_steps=3", "--trainer.limit_val_batches=1"])
    config = (tmp_path / "runs" / "r" / "config.yaml").read_text()
    for cmd, limit in [("validate", "val"), ("test", "test"), ("predict", "predict")]:
        main([cmd, *tiny, "--run=r", "--ckpt_path=last", f"--trainer.limit_{limit}_batches=2"])
    run = tmp_path / "runs" / "r"
    assert (run / "config.yaml").read_text() == config  # the fit's config is never overwritten
    assert not list(run.glob("config.*.yaml"))
    # each evaluation has a directory of its own, with its config
    assert {p.parent.name for p in (run / "eval").glob("*/config.yaml")} == {"validate-1", "test-1", "predict-1"}


def test_objects_can_be_built_from_python(tmp_path, corpus):
    from datamodules.windows import WindowDataModule
    from lit_attn import GPT
    from lit_attn.cli.lightning_cli import DEFAULT_CONFIG, LitAttnCLI

    cli = LitAttnCLI(GPT, WindowDataModule, subclass_mode_data=True, run=False,
                     args=[f"--data.path={corpus}", f"--runs_dir={tmp_path}", "--run=py", "--model.block_size=32"],
                     parser_kwargs={"default_config_files": [str(DEFAULT_CONFIG)]})
    assert cli.model.config.block_size == cli.datamodule.block_size == 32
    assert cli.model.hparams.vocab_size == cli.datamodule.vocab_size
    assert Path(cli.trainer.logger.log_dir).resolve() == (tmp_path / "py").resolve()
