"""Monitoring callbacks: what a short fit writes to TensorBoard and the console; DDP through the CLI."""

import contextlib
import io
import os
import re
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import yaml
from helpers import ROOT, events, newest_events, run_main, scalars, tiny_gpt, tiny_trainer, write_corpus
from lightning.pytorch.callbacks import EarlyStopping, RichProgressBar
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.plugins.hparams import plugin_data_pb2

from callbacks import HParamsSummary, ParameterCounts, TextSamples, TimingMonitor, UseStepProgressBar, ValidationLines
from datamodules import CharDataModule
from lit_attn import GPT

STEPS, VAL_EVERY, WARMUP = 8, 4, 2


def the_corpus(path: Path) -> Path:
    """ASCII lines that all begin with "The ", so the prompt "The " is in the vocabulary."""
    return write_corpus(path, non_ascii=False, start="The ")


@pytest.fixture(scope="module")
def fit(tmp_path_factory):
    """One short fit with every monitoring callback; console output captured."""
    tmp = tmp_path_factory.mktemp("fit")
    L.seed_everything(0)
    data = CharDataModule(path=str(the_corpus(tmp / "corpus.txt")), block_size=16, batch_size=8)
    model = tiny_gpt(data.vocab_size, n_embd=32, n_head=4, block_size=16)
    cbs = dict(  # in configs/default.yaml's order: timing last, after the hparams summary that reads it
        params=ParameterCounts(),
        samples=TextSamples(prompts=["The ", "\u2603"], max_new_tokens=12),  # the snowman is not in the vocabulary
        hparams=HParamsSummary(),
        progress=UseStepProgressBar(),
        # A made-up peak, so MFU is logged on CPU too; the first WARMUP batches are left out of the rates.
        timing=TimingMonitor(window_size=2, peak_flops=1e12, warmup_batches=WARMUP),
    )
    trainer = L.Trainer(
        max_steps=STEPS, val_check_interval=VAL_EVERY, limit_val_batches=2, log_every_n_steps=2, accelerator="cpu",
        logger=TensorBoardLogger(str(tmp / "runs"), name="fit", default_hp_metric=False),
        callbacks=list(cbs.values()), enable_checkpointing=False, enable_model_summary=False,
    )
    console = io.StringIO()
    with contextlib.redirect_stdout(console), pytest.warns(UserWarning, match="skipping prompt"):
        trainer.fit(model, data)
    return SimpleNamespace(trainer=trainer, model=model, cbs=cbs, acc=newest_events(tmp / "runs"),
                           console=console.getvalue(), run_dir=tmp / "runs")


def run_events(fit):
    """The run directory's own events."""
    return events(Path(fit.trainer.logger.log_dir))


def test_timing_logs_time_per_batch_and_tokens_per_second(fit):
    acc = run_events(fit)
    tags = acc.Tags()["scalars"]
    assert {"train/time_per_batch", "train/tokens_per_sec", "train/device/flops_per_sec",
            "train/device/mfu"} <= set(tags)
    # Lightning's counters and rates that repeat these, and the end-of-fit totals, are not scalars.
    assert not [t for t in tags if t.startswith(("timing/", "validate/")) or t in (
        "train/time", "train/batches", "train/samples", "train/lengths", "train/device/items_per_sec",
        "train/device/batches_per_sec", "train/device/samples_per_sec")]
    (text,) = acc.Tensors("timing/text_summary")
    assert text.step == STEPS and "| time per batch (mean) |" in text.tensor_proto.string_val[0].decode()
    assert all(v > 0 for _, v in scalars(acc, "train/time_per_batch"))
    # A window of 2 batch ends, the first at the end of the warm-up's last batch (step WARMUP - 1) or later.
    assert min(s for s, _ in scalars(acc, "train/time_per_batch")) >= WARMUP
    s = fit.cbs["timing"].summary
    assert (s["batches"], s["warmup_batches"]) == (STEPS, WARMUP) and 0 < s["warmup_time"] < s["train_time"]
    measured = s["train_time"] - s["warmup_time"]  # the means are over the batches after the warm-up
    assert s["time_per_batch"] == pytest.approx(measured / (STEPS - WARMUP))
    assert s["tokens_per_sec"] == pytest.approx(8 * 16 * (STEPS - WARMUP) / measured)
    assert s["train_time"] < s["fit_time"]  # validation and samples are excluded from training time
    # FLOPs per batch: measured on a meta copy, 3 x forward; MFU uses the given peak.
    assert fit.cbs["timing"].flops_source == "measured on meta"
    assert s["mfu"] == pytest.approx(s["flops_per_batch"] * (STEPS - WARMUP) / measured / 1e12)
    table = text.tensor_proto.string_val[0].decode()
    assert f"| warm-up, left out of the means below | first {WARMUP} batches," in table


def test_samples_are_text_in_the_event_file(fit):
    acc = run_events(fit)
    assert "samples/text_summary" in acc.Tags()["tensors"]
    texts = acc.Tensors("samples/text_summary")
    # Every validation, not the sanity check, at the step of its val/loss (the index of the step before it).
    assert [t.step for t in texts] == [s for s, _ in scalars(acc, "val/loss")] == [VAL_EVERY - 1, STEPS - 1]
    body = texts[-1].tensor_proto.string_val[0].decode()
    assert "'The '" in body and "\u2603" not in body


def test_samples_leave_the_rng_alone_and_skip_without_decode(fit):
    state = torch.get_rng_state()
    trainer = SimpleNamespace(sanity_checking=False, loggers=fit.trainer.loggers, datamodule=fit.trainer.datamodule,
                              strategy=fit.trainer.strategy, is_global_zero=False, global_step=0)
    TextSamples(max_new_tokens=3).on_validation_end(trainer, fit.model)
    assert torch.equal(state, torch.get_rng_state())
    trainer.datamodule = object()  # no encode/decode: nothing to do, no error
    TextSamples().on_validation_end(trainer, fit.model)


def test_parameter_counts_logged(fit):
    acc, model = run_events(fit), fit.model
    assert not [t for t in acc.Tags()["scalars"] if t.startswith(("params/", "flops/"))]  # constants: text only
    (event,) = acc.Tensors("params/text_summary")
    rows = {}
    for line in event.tensor_proto.string_val[0].decode().splitlines():
        if line.startswith("| ") and not line.startswith("| component"):
            label, measured, analytic = (cell.strip() for cell in line.strip("|").split("|"))
            rows[label] = (measured, analytic)
    assert event.step == 0
    total = sum(p.numel() for p in model.parameters())
    assert rows["total"] == (f"{total:,}", f"{total:,}")
    parts = ("embeddings", "attention", "ffn", "norms", "head")
    assert sum(int(rows[p][0].replace(",", "")) for p in parts) == total
    net = model.transformer
    attention = sum(p.numel() for p in net.blocks[0].attn.parameters())
    assert rows["per layer (x1)"] == (f"{attention:,}", f"{attention:,}")
    # MHA in the GPT-2 layout: the formula applies, beside the total minus position embeddings.
    compare = total - net.pos_emb.weight.numel()
    assert rows["nanoGPT formula (MHA, GPT-2 layout)"] == (f"{compare:,} (total - pos. emb.)", f"{compare:,}")
    assert rows["attn FLOPs/token: quadratic"][1].startswith(f"{4 * 32 * 16:,} ")  # 4 * Hq * hs * T
    assert rows["decode state/token"] == ("", f"{2 * 32:,} values")  # K and V of width 32, one layer


def test_nanogpt_formula_is_a_reference_for_another_layout():
    from callbacks.params import _rows, build_report

    rows = {label: (m, a) for label, m, a in _rows(build_report(tiny_gpt(32, attention="sqa", n_head=4)))}
    measured, analytic = rows["nanoGPT formula (MHA, GPT-2 layout)"]
    assert measured == "n/a: layout differs (attention sqa)" and analytic.endswith(" (reference)")


def test_hparams_tab_has_attention_params_and_results(fit):
    log_dir = Path(fit.trainer.logger.log_dir)
    (events_file,) = log_dir.glob("events.out.tfevents.*")
    start, metrics, steps = None, None, set()
    for event in EventFileLoader(str(events_file)).Load():
        for value in event.summary.value:
            if value.tag.startswith("_hparams_/"):
                steps.add(event.step)
                data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                if data.HasField("session_start_info"):
                    start = data.session_start_info.hparams
                if data.HasField("experiment"):
                    metrics = [m.name.tag for m in data.experiment.metric_infos]
    n_params = sum(p.numel() for p in fit.model.parameters())
    assert start["Attention"].string_value == "mha"
    assert (start["Hq"].string_value, start["Hkv"].string_value) == ("4", "4")  # integers as written, not 4.0000
    assert start["Parameters"].string_value == f"{n_params:,}"
    assert metrics == [f"whole_run/{m}" for m in ("val_loss", "val_acc", "n_params", "time_per_batch", "tokens_per_sec",
                                                  "train_time", "mfu")]  # MFU: the fit gives a peak
    # The metric scalars are the run's own (no sub-run of its own), at the last validation's step.
    acc = hp = run_events(fit)
    assert not [p for p in log_dir.iterdir() if p.is_dir() and any(p.rglob("events.out.tfevents.*"))]
    assert scalars(hp, "whole_run/val_loss") == [(STEPS - 1, pytest.approx(scalars(acc, "val/loss")[-1][1]))]
    assert scalars(hp, "whole_run/n_params") == [(STEPS - 1, n_params)]
    assert scalars(hp, "whole_run/time_per_batch")[0][1] == pytest.approx(fit.cbs["timing"].summary["time_per_batch"])
    assert steps == {STEPS - 1}


def test_console_shows_parameter_table_and_timing_summary(fit):
    out = fit.console
    assert "Parameters: attention mha" in out and "nanoGPT formula" in out
    assert "time per batch (mean)" in out and "MFU" in out


def test_fit_swapped_in_validation_lines_where_the_console_is_no_terminal(fit):
    assert type(fit.trainer.progress_bar_callback) is ValidationLines
    assert not any(isinstance(cb, RichProgressBar) for cb in fit.trainer.callbacks)
    lines = [line for line in fit.console.splitlines() if line.startswith("step ")]
    assert len(lines) == STEPS // VAL_EVERY, fit.console  # one per validation
    for step, line in zip(range(VAL_EVERY, STEPS + 1, VAL_EVERY), lines):
        assert re.fullmatch(rf"step {step}/{STEPS} · train/loss \d+\.\d{{4}} · val/loss \d+\.\d{{4}} · elapsed "
                            rf"\d+:\d\d:\d\d", line), line
    assert "Epoch 0" not in fit.console  # no bar


def test_bf16_mixed_short_fit_on_cpu(tmp_path):
    data = CharDataModule(path=str(the_corpus(tmp_path / "corpus.txt")), block_size=16, batch_size=4)
    model = tiny_gpt(data.vocab_size, n_embd=32, n_head=4, block_size=16)
    timing = TimingMonitor(window_size=2)
    # Gradient clipping as in configs/default.yaml: it must work with mixed precision.
    trainer = L.Trainer(max_steps=3, limit_val_batches=1, precision="bf16-mixed", gradient_clip_val=1.0,
                        accelerator="cpu", logger=False, callbacks=[timing], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        trainer.fit(model, data)
    assert "precision bf16-mixed" in out.getvalue()
    assert timing.summary["batches"] == 3 and torch.isfinite(trainer.callback_metrics["train/loss"])


@pytest.mark.parametrize("preset,expected", [
    ("cpu", "accelerator: cpu"), ("gpu", "precision: bf16-mixed"), ("ddp", "strategy: ddp"),
    ("fsdp", "class_path: lit_attn.training.sharding.FSDP"),
    ("multinode", "num_nodes: 2"),
])
def test_trainer_presets_parse_and_keep_the_callbacks(preset, expected):
    from lit_attn.cli.lightning_cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        main(["fit", f"--config={ROOT / 'configs' / 'trainer' / f'{preset}.yaml'}", "--print_config"])
    assert stop.value.code == 0
    config = yaml.safe_load(out.getvalue())
    assert expected in out.getvalue()
    assert config["checkpoint"]["every_n_train_steps"] == 250 and config["timing"]["window_size"] == 20


def test_forced_callback_options_are_flags():
    from lit_attn.cli.lightning_cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["fit", "--timing.peak_flops=9.89e14", "--checkpoint.every_n_train_steps=100", "--print_config"])
    config = yaml.safe_load(out.getvalue())
    assert config["timing"]["peak_flops"] == 9.89e14 and config["checkpoint"]["every_n_train_steps"] == 100


def test_a_users_callback_list_cannot_drop_the_forced_callbacks(tmp_path, corpus):
    from callbacks.checkpointing import LastCheckpoint
    from datamodules.windows import WindowDataModule
    from lit_attn import GPT
    from lit_attn.cli.lightning_cli import DEFAULT_CONFIG, FORCED_CALLBACKS, LitAttnCLI

    config = tmp_path / "mine.yaml"
    config.write_text("trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.EarlyStopping\n"
                      "      init_args: {monitor: val/loss}\n")
    cli = LitAttnCLI(GPT, WindowDataModule, subclass_mode_data=True, run=False,
                     args=[f"--config={config}", f"--data.path={corpus}", f"--runs_dir={tmp_path}", "--run=mine",
                           "--checkpoint.every_n_train_steps=7"],
                     parser_kwargs={"default_config_files": [str(DEFAULT_CONFIG)]})
    types = [type(cb) for cb in cli.trainer.callbacks]
    assert all(cls in types for cls in FORCED_CALLBACKS.values())
    assert EarlyStopping in types
    (last,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, LastCheckpoint)]
    assert last._every_n_train_steps == 7


@pytest.mark.parametrize("listed,message", [
    ("callbacks.checkpointing.LastCheckpoint", "LastCheckpoint is always on; remove it from trainer.callbacks"),
    ("callbacks.timing.TimingMonitor", "set its options with --timing.*"),
])
def test_listing_a_forced_callback_is_one_clear_error(listed, message, tmp_path, corpus, capsys):
    from lit_attn.cli.lightning_cli import cli

    config = tmp_path / "dup.yaml"
    config.write_text(f"trainer:\n  callbacks:\n    - class_path: {listed}\n")
    assert cli(["fit", f"--config={config}", f"--data.path={corpus}", f"--runs_dir={tmp_path / 'runs'}"]) == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]
    assert cli(["fit", "--trainer.enable_checkpointing=false", f"--data.path={corpus}",
                f"--runs_dir={tmp_path / 'runs'}"]) == 2
    assert "would drop last.ckpt" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


# ---- DDP through the CLI ----

def fit_args(corpus: Path, batch_size: int) -> list[str]:
    return [f"--data.path={corpus}", f"--data.batch_size={batch_size}", f"--trainer.max_steps={STEPS}",
            f"--trainer.val_check_interval={STEPS}", "--trainer.limit_val_batches=2", "--trainer.log_every_n_steps=2",
            "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false", "--model.n_layer=2",
            "--model.n_embd=32", "--model.n_head=4", "--model.block_size=16"]


def final_val_loss(run_dir: Path) -> float:
    # The run's own directory: its hparams/ subdirectory has no val/loss.
    (log_dir,) = {f.parent for f in run_dir.rglob("events.out.tfevents.*") if f.parent.name != "hparams"}
    (value,) = [v for _, v in scalars(log_dir, "val/loss")]  # the one validation, after the last step
    return value


@pytest.mark.slow
@pytest.mark.long
def test_ddp_two_processes_match_one_process_at_equal_global_batch(tmp_path):
    corpus = the_corpus(tmp_path / "corpus.txt")
    (tmp_path / "ddp").mkdir()
    ddp = run_main("fit", *fit_args(corpus, 8), "--trainer.devices=2", "--trainer.strategy=ddp", cwd=tmp_path / "ddp")
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert ddp.stdout.count("Timing: 2 device(s)") == 1  # summaries and tables on rank zero only
    assert ddp.stdout.count("Parameters: attention") == 1
    ddp_loss = final_val_loss(tmp_path / "ddp")

    from lit_attn.cli.lightning_cli import main  # the 1-process runs in this process: no second interpreter start-up

    losses = {}
    for name, batch in (("single", 16), ("half_batch", 8)):
        (tmp_path / name).mkdir()
        cwd = os.getcwd()
        try:
            os.chdir(tmp_path / name)
            with contextlib.redirect_stdout(io.StringIO()):
                main(["fit", *fit_args(corpus, batch), "--trainer.devices=1"])
        finally:
            os.chdir(cwd)
        losses[name] = final_val_loss(tmp_path / name)
    print(f"val/loss at step {STEPS}: ddp 2x8 {ddp_loss:.7f}, 1x16 {losses['single']:.7f}, "
          f"1x8 {losses['half_batch']:.7f}")
    # 2 ranks x 8 windows see exactly the 16 windows of the 1-process batch (the sampler
    # deals one permutation round-robin) and DDP averages the two half-batch gradients,
    # so the runs differ only in float32 summation order (observed: < 1e-6). 1e-5 leaves
    # room for that noise on other CPUs and is 100x smaller than the effect of training on
    # other windows (the half-batch control moves the loss by ~1e-3): ranks sharing data,
    # unsynced gradients or an unreduced validation would fail it.
    assert abs(ddp_loss - losses["single"]) < 1e-5, (ddp_loss, losses)
    assert abs(losses["half_batch"] - losses["single"]) > 1e-4, losses


def _tiny_fit(tmp_path, steps, callbacks, **trainer_kw):
    return tiny_trainer(the_corpus(tmp_path / "corpus.txt"), max_steps=steps, limit_val_batches=0, callbacks=callbacks,
                        **trainer_kw)


def test_train_loss_is_logged_only_on_logging_steps(tmp_path, monkeypatch):
    model, trainer, data = _tiny_fit(tmp_path, 7, [], log_every_n_steps=3)
    logged = []
    real_log = GPT.log

    def spy(self, name, value, *args, **kwargs):
        if name == "train/loss":
            logged.append(self.trainer.global_step)
        return real_log(self, name, value, *args, **kwargs)

    monkeypatch.setattr(GPT, "log", spy)
    trainer.fit(model, data)
    assert logged == [0, 2, 5, 6]  # the first step, every 3rd (Lightning's logging steps), the last
    assert torch.isfinite(trainer.callback_metrics["train/loss"])


def test_finite_loss_guard_reads_losses_only_at_checks(tmp_path, monkeypatch):
    from callbacks.nan_guard import FiniteLossGuard, NonFiniteLossError

    guard = FiniteLossGuard(check_every_n_steps=4)
    checks = []
    real_check = FiniteLossGuard.check
    monkeypatch.setattr(FiniteLossGuard, "check", lambda self, trainer, *module, **kw: (
        checks.append(trainer.global_step), real_check(self, trainer, *module, **kw)))
    model, trainer, data = _tiny_fit(tmp_path, 10, [guard])
    trainer.fit(model, data)
    assert checks == [4, 8, 10]  # every 4 steps and at the end of training, not every step

    real_loss = GPT._loss
    monkeypatch.setattr(GPT, "_loss", lambda self, logits, y: real_loss(self, logits, y) * (
        float("nan") if self.trainer.global_step >= 5 else 1.0))
    checks.clear()
    model, trainer, data = _tiny_fit(tmp_path, 10, [FiniteLossGuard(check_every_n_steps=4)])
    with pytest.raises(NonFiniteLossError, match="training loss is nan at step 5; stopped without saving"):
        trainer.fit(model, data)
    assert checks == [4, 8]  # found at the first check after the bad step


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_fused_adamw_and_gradient_clipping(tmp_path, precision):
    """AdamW is fused at full precision and under bf16 autocast, and the gradients are still clipped."""
    norms = []

    class GradNorm(L.Callback):
        def on_before_zero_grad(self, trainer, pl_module, optimizer):  # the previous step's gradients, as clipped
            grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
            if grads:
                norms.append(float(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads]))))

    model, trainer, data = _tiny_fit(tmp_path, 4, [GradNorm()], precision=precision, gradient_clip_val=1e-3)
    trainer.fit(model, data)
    assert trainer.optimizers[0].defaults["fused"] is True
    assert norms and max(norms) <= 1e-3 * 1.01


@pytest.mark.parametrize("attention,options,per_token,label", [
    ("mha", None, 2 * 16, "decode state/token"),  # K and V of width 16: grows with every token
    ("mha", {"window": 4}, 2 * 16, "decode state/token (last W)"),  # the same per token, for the last 4 only
    ("mla", None, None, "decode state/token"),  # the latent and the shared RoPE key
    ("gated_deltanet", {"chunk_size": 4}, None, None),  # a fixed state: no per-token row
])
def test_decode_state_rows_say_what_the_layout_keeps(attention, options, per_token, label):
    """Per token only where the state grows per token; per sequence at T as the layout's values(T) say."""
    from callbacks.params import _rows, build_report

    model = tiny_gpt(32, attention=attention, attention_options=options, block_size=16)
    layout = model.config.spec.state(**model.config.attention_args())
    rows = {name: analytic for name, _, analytic in _rows(build_report(model))}
    state = rows["decode state/sequence at T=16"]
    assert state.startswith(f"{layout.values(16):,} values ({4 * layout.values(16):,} B in float32)")
    per_token_rows = [name for name in rows if name.startswith("decode state/token")]
    assert per_token_rows == ([label] if label else [])
    if label:
        assert rows[label] == f"{per_token or layout.values(1):,} values"
    capped = options is not None  # a window or a chunked recurrence: per token the context term stops growing
    assert ("attn FLOPs/token: context (capped)" in rows) == capped
    assert ("attn FLOPs/token: quadratic" in rows) != capped
    assert state.endswith({"mha": "per token", "mla": "per token", "gated_deltanet": "fixed"}[attention]
                          if not (options and "window" in options) else "window")
