"""lit-attn command line: `python main.py fit|validate|test|predict [--config FILE] [--model.attention NAME] ...`

configs/default.yaml is always loaded first; later --config files and flags override it.
Every run lives in RUNS_DIR/RUN (TensorBoard events, config, checkpoints); resume one
with `--run RUN --ckpt_path last`. Set LIT_ATTN_DEBUG=1 to see full tracebacks for the
one-line errors.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Literal, Optional

import torch
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger

from callbacks import HParamsSummary, ParameterCounts, TextSamples, TimingMonitor, UseStepProgressBar
from callbacks.checkpointing import LastCheckpoint
from callbacks.guards import FiniteLossGuard
from callbacks.resume import ExactResume
from datamodules.windows import WindowDataModule
from lit_attn import GPT
from lit_attn.checkpoint import load_checkpoint

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "default.yaml"

# User mistakes (bad values, missing files, no network) end in one line, not a traceback.
USER_ERRORS = (ValueError, FileNotFoundError, ConnectionError)

# Model settings that must match a checkpoint for its weights to mean the same thing.
ARCHITECTURE = ("attention", "attention_options", "n_layer", "n_embd", "n_head", "n_query_heads", "n_kv_heads",
                "block_size", "vocab_size", "norm", "pos", "ffn", "ffn_hidden", "bias", "qkv_bias",
                "tie_embeddings", "final_norm")

# Callbacks that are always on, whatever a config's trainer.callbacks list says: the safety
# net (one last.ckpt, exact resume, the NaN guard) and the monitoring every run is compared
# by. Each gets a flag group, e.g. --checkpoint.every_n_train_steps 500, --timing.peak_flops 9.89e14.
FORCED_CALLBACKS = {
    "checkpoint": LastCheckpoint,
    "exact_resume": ExactResume,
    "nan_guard": FiniteLossGuard,
    "lr_monitor": LearningRateMonitor,
    "params": ParameterCounts,
    "samples": TextSamples,
    "hparams_summary": HParamsSummary,
    "step_progress": UseStepProgressBar,
    "timing": TimingMonitor,
}

_fresh_run_dir: Path | None = None  # created by this process; removed if it fails on a user error before saving


def _known_runs(runs_dir: Path) -> str:
    runs = sorted((p for p in runs_dir.glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    return f" (runs in {runs_dir}: {', '.join(p.name for p in runs[:5])})" if runs else f" ({runs_dir} has no runs)"


def _unique(path: Path) -> Path:
    n = 2
    candidate = path
    while candidate.exists():
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
        n += 1
    return candidate


class LitAttnCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument(
            "--run", type=Optional[str], default=None,
            help="Run name. RUNS_DIR/RUN holds the run's TensorBoard events, config and checkpoints; "
                 "default: ATTENTION-DATE-TIME. Resume a run with --run RUN --ckpt_path last.",
        )
        parser.add_argument("--runs_dir", type=str, default="runs", help="Directory that holds the run directories.")
        parser.add_argument(
            "--float32_matmul_precision", type=Literal["highest", "high", "medium"], default="high",
            help="torch.set_float32_matmul_precision on CUDA machines: 'high' lets float32 matmuls (precision "
                 "32-true, and the float32 parts of mixed precision) use TF32 tensor cores; 'highest' keeps "
                 "full float32. Ignored without CUDA.",
        )
        for key, callback in FORCED_CALLBACKS.items():
            parser.add_lightning_class_args(callback, key)
        # One context length, set on the model, drives the data windows too.
        parser.link_arguments("model.block_size", "data.init_args.block_size")
        # The vocabulary is a property of the data, known once the datamodule exists.
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")

    # ---- run directory and checkpoint, before anything is built or written ----

    def _parse_ckpt_path(self) -> None:
        """Lightning would torch.load --ckpt_path here (whatever load_from_checkpoint_support says)
        and merge its hyperparameters; we read checkpoints once, in before_instantiate_classes,
        with one-line errors, and check the given settings against the checkpoint's instead."""

    def before_instantiate_classes(self) -> None:
        global _fresh_run_dir
        # run=False (building the objects from Python) has no subcommand: treat it as fit.
        self.stage = self.subcommand or "fit"
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        self.runs_dir = Path(cfg.runs_dir)
        if torch.cuda.is_available():
            torch.set_float32_matmul_precision(cfg.float32_matmul_precision)
        self.checkpoint: dict[str, Any] | None = None
        run = cfg.run
        if run is None and os.environ.get("LOCAL_RANK", "0") != "0":
            run = os.environ.get("LIT_ATTN_RUN")  # a DDP worker started by rank 0: same directory
        if run is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ValueError("a multi-process launch (torchrun, SLURM) needs --run NAME so every process uses one run directory")

        ckpt = cfg.get("ckpt_path")
        if ckpt == "last":
            if run is None:
                raise ValueError(f"--ckpt_path last needs --run NAME to know which run to resume{_known_runs(self.runs_dir)}")
            if not (self.runs_dir / run).is_dir():
                raise ValueError(f"there is no run {run!r}{_known_runs(self.runs_dir)}")
            path = self.runs_dir / run / "checkpoints" / "last.ckpt"
            if not path.is_file():
                raise ValueError(f"run {run!r} has no checkpoint to resume ({path} does not exist); start it afresh without --ckpt_path")
        elif ckpt is not None:
            path = Path(ckpt)
            if not path.is_file():
                raise FileNotFoundError(f"checkpoint not found: {ckpt}; check --ckpt_path")
            inside = path.resolve().parent
            if run is None and inside.name == "checkpoints" and inside.parent.parent == self.runs_dir.resolve():
                run = inside.parent.name  # resuming a run's checkpoint by path continues that run
        if ckpt is not None:
            self.checkpoint = load_checkpoint(path)
            cfg.ckpt_path = str(path)
            if cfg.get("weights_only", "absent") is None:
                cfg.weights_only = True

        if run is None:
            run = _unique(self.runs_dir / f"{cfg.model.attention}-{time.strftime('%Y%m%d-%H%M%S')}").name
        self.run_name = run
        self.run_dir = self.runs_dir / run
        ckpt_dir = self.run_dir / "checkpoints"
        if self.stage == "fit" and ckpt is None and ckpt_dir.is_dir() and any(ckpt_dir.glob("*.ckpt")):
            raise ValueError(
                f"run {run!r} already has checkpoints in {ckpt_dir}; resume it with --ckpt_path last, "
                f"or start a new run with another --run name"
            )
        os.environ["LIT_ATTN_RUN"] = run
        if not self.run_dir.exists() and os.environ.get("LOCAL_RANK", "0") == "0":
            _fresh_run_dir = self.run_dir
        # Never overwrite the config of an earlier invocation of this run.
        first = self.stage == "fit" and not (self.run_dir / "config.yaml").exists()
        name = "config.yaml" if first else _unique(self.run_dir / f"config.{self.stage}.yaml").name
        self.save_config_kwargs = {**self.save_config_kwargs, "config_filename": name}
        if os.environ.get("LOCAL_RANK", "0") == "0":
            action = f"resuming from {path.name} (step {self.checkpoint['global_step']})" if self.checkpoint else "new run"
            print(f"run {run!r} in {self.run_dir}: {action}", file=sys.stderr, flush=True)

    def instantiate_trainer(self, **kwargs: Any):
        trainer_cfg = self._get(self.config_init, "trainer", default={})
        listed = trainer_cfg.get("callbacks") or []
        for callback in listed if isinstance(listed, list) else [listed]:
            key = next((k for k, c in FORCED_CALLBACKS.items() if type(callback) is c), None)
            if key is not None:
                raise ValueError(
                    f"{type(callback).__name__} is always on; remove it from trainer.callbacks "
                    f"and set its options with --{key}.* (e.g. in the config's top-level '{key}:' section)"
                )
        if trainer_cfg.get("enable_checkpointing") is False:
            raise ValueError(
                "trainer.enable_checkpointing=false would drop last.ckpt, which every run keeps; "
                "save less often with --checkpoint.every_n_train_steps N (0: only at the end and on a stop)"
            )
        if trainer_cfg.get("logger") in (None, True):
            resuming = self.stage == "fit" and self.checkpoint is not None
            kwargs["logger"] = TensorBoardLogger(
                save_dir=str(self.runs_dir), name=self.run_name, version="", default_hp_metric=False,
                # TensorBoard hides events at or after this step from an interrupted earlier
                # attempt, so a resumed run's curves continue without repeats.
                purge_step=int(self.checkpoint["global_step"]) if resuming else (0 if self.stage == "fit" else None),
            )
        if trainer_cfg.get("default_root_dir") is None:
            kwargs["default_root_dir"] = str(self.run_dir)
        return super().instantiate_trainer(**kwargs)

    # ---- checkpoint compatibility, before Lightning restores anything ----

    def _check_checkpoint(self) -> None:
        ckpt, self.checkpoint = self.checkpoint, None
        if ckpt is None:
            return
        dm_key = type(self.datamodule).__qualname__
        if self.datamodule is not None and ckpt.get("datamodule_hparams_name") is not None:
            saved_dm = [k for k in ckpt if k.endswith("DataModule")]
            if saved_dm and dm_key not in saved_dm:
                raise ValueError(f"the checkpoint was trained with {saved_dm[0]}, this run uses {dm_key}; use the run's data settings")
            if dm_key in ckpt:
                self.datamodule.load_state_dict(ckpt[dm_key])  # raises on a different vocabulary/tokenizer
        saved = ckpt.get("hyper_parameters", {})
        diffs = [
            f"{k}={saved[k]!r} (this run: {self.model.hparams.get(k)!r})"
            for k in ARCHITECTURE if k in saved and saved[k] != self.model.hparams.get(k)
        ]
        if diffs:
            raise ValueError(
                f"the checkpoint's model differs from this run's: {'; '.join(diffs)}; "
                f"use the run's settings (see {self.run_dir / 'config.yaml'})"
            )
        own = self.model.state_dict()
        for key, tensor in ckpt.get("state_dict", {}).items():
            if key not in own or own[key].shape != tensor.shape:
                have = tuple(own[key].shape) if key in own else "missing"
                raise ValueError(f"the checkpoint's {key} has shape {tuple(tensor.shape)}, this model's is {have}; use the run's settings")

    before_fit = before_validate = before_test = before_predict = _check_checkpoint

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as e:
            # jsonargparse folds a datamodule constructor's error into a multi-line
            # "Union subtypes" report; building it directly re-raises the real one-line error.
            if "Union subtypes" not in str(e):
                raise
            data = (self.config[self.subcommand] if self.subcommand else self.config).data
            module, _, name = data.class_path.rpartition(".")
            getattr(importlib.import_module(module), name)(**dict(data.init_args))
            raise


def main(args: list[str] | None = None) -> None:
    LitAttnCLI(
        GPT,
        WindowDataModule,
        subclass_mode_data=True,
        load_from_checkpoint_support=False,
        parser_kwargs={
            cmd: {"default_config_files": [str(DEFAULT_CONFIG)]} for cmd in ("fit", "validate", "test", "predict")
        },
        args=args,
    )


def cli(args: list[str] | None = None) -> int:
    """Run the command line; a user error prints one `error: ...` line and returns 2."""
    global _fresh_run_dir
    _fresh_run_dir = None
    try:
        main(args)
    except USER_ERRORS as e:
        if os.environ.get("LIT_ATTN_DEBUG"):
            raise
        # A run directory this invocation created and never saved into is debris, not data.
        if _fresh_run_dir is not None and _fresh_run_dir.is_dir() and not any(_fresh_run_dir.rglob("*.ckpt")):
            shutil.rmtree(_fresh_run_dir, ignore_errors=True)
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
