"""lit-attn's Lightning command line: `lit-attn fit|validate|test|predict [--config FILE] [--model.attention NAME] ...`
(also `python main.py ...`).

configs/default.yaml is always loaded first; later --config files and flags override it.
Every run lives in RUNS_DIR/RUN (TensorBoard events, config, checkpoints); resume one
with `--run RUN --ckpt_path last`. Set LIT_ATTN_DEBUG=1 to see full tracebacks for the
one-line errors.
"""

from __future__ import annotations

import dataclasses
import errno
import importlib
import os
import signal
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional

import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.trainer.states import TrainerStatus

from callbacks import HParamsSummary, ParameterCounts, TextSamples, TimingMonitor, UseStepProgressBar
from callbacks.checkpointing import LastCheckpoint
from callbacks.final_validation import FinalValidation, resume_purge_step
from callbacks.lr import LearningRateLogger
from callbacks.nan_guard import FiniteLossGuard, NonFiniteLossError
from callbacks.recall import RecallAccuracy
from callbacks.resume import ExactResume
from callbacks.tensorboard_layout import TensorBoardLayout
from datamodules.windows import WindowDataModule
from lit_attn import GPT, GPTConfig
from lit_attn.cli.attention_check import check_attention_setting, check_user_attention
from lit_attn.cli.console import interrupted_while_loading, quiet_known_warnings
from lit_attn.cli.parsed_config import (
    EvaluationLogger,
    check_untrained,
    evaluation_dir,
    refuse_replaced_optimizer,
    resolve_data_seed,
    trainer_error_message,
)
from lit_attn.cli.parser import FullHelp, LitAttnParser
from lit_attn.cli.ranges import check_ranges
from lit_attn.cli.required_settings import check_expected
from lit_attn.cli.resources import check_resources
from lit_attn.cli.run_config import check_config_files, with_run_config
from lit_attn.cli.runlock import global_rank_zero
from lit_attn.cli.runs import (
    Invocation,
    RunComplete,
    after_earlier_event_files,
    after_non_finite_loss,
    check_names,
    complete_message,
    resolve_checkpoint,
    unique_path,
)
from lit_attn.load import check_format, load_checkpoint
from lit_attn.training.checkpoint import AtomicCheckpointIO
from lit_attn.training.lightning_compat import NoCheckpointHparamsMerge
from lit_attn.training.run_logger import RunLogger

DEFAULT_CONFIG = Path(str(resources.files("configs") / "default.yaml"))

# User mistakes (bad values, missing files, no network) end in one line, not a traceback.
# Lightning's MisconfigurationException is its word for a setting that cannot work (a ValueError too).
USER_ERRORS = (ValueError, FileNotFoundError, ConnectionError, NotADirectoryError, MisconfigurationException)

# Model settings that must match a checkpoint for its weights to mean the same thing; every other
# model setting (the optimizer's, the schedule's, dropout, compile) may change on resume and takes
# effect from the resumed step (GPT.on_train_start re-applies the optimizer's).
ARCHITECTURE = GPTConfig.architecture_fields()
# A checkpoint written before a setting existed trained as its default says.
ARCHITECTURE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GPTConfig)
                         if f.name in ARCHITECTURE and f.default is not dataclasses.MISSING}

# Callbacks that are always on, whatever a config's trainer.callbacks list says: the safety
# net (one last.ckpt, exact resume, the NaN guard) and the monitoring every run is compared
# by. Each gets a flag group, e.g. --checkpoint.every_n_train_steps 500, --timing.peak_flops 9.89e14.
FORCED_CALLBACKS = {
    "checkpoint": LastCheckpoint,
    "exact_resume": ExactResume,
    "nan_guard": FiniteLossGuard,
    "dashboard": TensorBoardLayout,
    "lr_monitor": LearningRateLogger,
    "params": ParameterCounts,
    "samples": TextSamples,
    "hparams_summary": HParamsSummary,
    "step_progress": UseStepProgressBar,
    "timing": TimingMonitor,
    "final_validation": FinalValidation,
    "recall": RecallAccuracy,
}

# A full disk or quota, a file-size limit, a read-only or forbidden runs directory: the machine's
# state, not a bug; said in one line (checkpoints are written atomically, so none is lost).
STORAGE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM)

_invocation = Invocation()  # this command's run directory, replaced by each command


def _local_rank_zero() -> bool:
    """Whether this is the launching process (or the only one); workers started by DDP have LOCAL_RANK > 0."""
    return os.environ.get("LOCAL_RANK", "0") == "0"


def _comparable(value: Any) -> Any:
    return list(value) if isinstance(value, (tuple, list)) else value


# NoCheckpointHparamsMerge: Lightning would torch.load --ckpt_path in __init__ and merge its hyperparameters;
# checkpoints are read once, in before_instantiate_classes, with one-line errors, and the given settings
# are checked against the checkpoint's instead.
class LitAttnCLI(NoCheckpointHparamsMerge, LightningCLI):
    complete: str | None = None  # a resume of a run that reached its end: the line that says so

    def __init__(self, *args: Any, parser_class: type = LitAttnParser, **kwargs: Any) -> None:
        # The project's parser by default, also for a CLI built from Python: the range types of the options
        # (lit_attn.bounds) are registered by it.
        super().__init__(*args, parser_class=parser_class, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        parser.short_help = True
        parser.add_argument("--help_all", action=FullHelp, help="Print every option and exit.")
        parser.add_argument(
            "--run", type=Optional[str], default=None,
            help="Run name. RUNS_DIR/RUN holds the run's TensorBoard events, config and checkpoints; "
                 "default: ATTENTION-DATE-TIME. Resume a run with --run RUN --ckpt_path last; with "
                 "--ckpt_path auto the same command starts the run or resumes it (for jobs a scheduler restarts).",
        )
        parser.add_argument("--runs_dir", type=str, default="runs", help="Directory that holds the run directories.")
        parser.add_argument(
            "--untrained", type=bool, default=False,
            help="validate/test/predict without --run or --ckpt_path: score the model's initial, untrained weights "
                 "(refused unless asked for, since such a score is no result).",
        )
        parser.add_argument(
            "--float32_matmul_precision", type=Literal["highest", "high", "medium"], default="high",
            help="torch.set_float32_matmul_precision on CUDA machines: 'high' lets float32 matmuls (precision "
                 "32-true, and the float32 parts of mixed precision) use TF32 tensor cores; 'highest' keeps "
                 "full float32. Ignored without CUDA.",
        )
        parser.add_argument(
            "--skip_attention_check", type=bool, default=False,
            help="Train an attention named by its import path without first checking that it is causal and "
                 "returns finite (B, T, C) outputs in the input's dtype (lit_attn.testing.check_before_training).",
        )
        for key, callback in FORCED_CALLBACKS.items():
            parser.add_lightning_class_args(callback, key)
        # One context length, set on the model, drives the data windows too.
        parser.link_arguments("model.block_size", "data.init_args.block_size")
        # The vocabulary is a property of the data, known once the datamodule exists.
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        # Before Lightning seeds from seed_everything (its refusal names no flag) and anything is built.
        subcommand = self.config.get("subcommand")
        cfg = self.config[subcommand] if subcommand else self.config
        check_attention_setting(cfg)  # before check_ranges, whose memory estimate builds the attention
        check_ranges(cfg, subcommand or "fit")
        check_resources(cfg)
        if cfg.get("trainer.barebones") is True:
            raise ValueError("--trainer.barebones true turns off the logger, checkpoints and callbacks that every "
                             "run keeps; time a model with lit-attn bench, or try settings with "
                             "--trainer.fast_dev_run 5")

    # ---- run directory and checkpoint, before anything is built or written ----

    def before_instantiate_classes(self) -> None:
        # run=False (building the objects from Python) has no subcommand: treat it as fit.
        self.stage = self.subcommand or "fit"
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        check_expected(cfg)
        check_user_attention(cfg, self.stage)
        self.runs_dir = Path(cfg.runs_dir).expanduser()
        run = cfg.run
        check_names(self.runs_dir, run)
        if torch.cuda.is_available():
            torch.set_float32_matmul_precision(cfg.float32_matmul_precision)
        if run is None and not _local_rank_zero():
            run = os.environ.get("LIT_ATTN_RUN")  # a DDP worker started by rank 0: same directory
        if run is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ValueError("a multi-process launch (torchrun, SLURM) needs --run NAME "
                             "so every process uses one run directory")
        path, run = resolve_checkpoint(cfg.get("ckpt_path"), run, self.runs_dir, self.stage)
        check_untrained(self.stage, path is not None, bool(cfg.get("untrained")))
        if run is None:
            run = unique_path(self.runs_dir / f"{cfg.model.attention}-{time.strftime('%Y%m%d-%H%M%S')}").name
        self.run_name = run
        self.run_dir = self.runs_dir / run
        global _invocation
        _invocation.release()  # a command run before in this process (main() called from Python) has ended
        if _local_rank_zero():
            # Before anything is read or written: a writable runs directory, and one fit at a time per run.
            _invocation = Invocation.begin(self.run_dir, cli=self, lock=self.stage == "fit" and global_rank_zero())
        self.checkpoint: dict[str, Any] | None = None
        if path is not None:
            self.checkpoint = load_checkpoint(path)
            check_format(self.checkpoint, path)
            # A run at its end: said (RunComplete) once the given settings are checked, before anything is written
            self.complete = complete_message(run, self.checkpoint, cfg.trainer) if self.stage == "fit" else None
            cfg.ckpt_path = str(path)
            if cfg.get("weights_only", "absent") is None:
                cfg.weights_only = True
        elif cfg.get("ckpt_path") is not None:
            cfg.ckpt_path = None  # auto, on a run that has no checkpoint yet: a fresh start

        resolve_data_seed(cfg, self.checkpoint)
        refuse_replaced_optimizer(cfg)
        ckpt_dir = self.run_dir / "checkpoints"
        if self.stage == "fit" and path is None and ckpt_dir.is_dir() and any(ckpt_dir.glob("*.ckpt")):
            raise ValueError(
                f"run {run!r} already has checkpoints in {ckpt_dir}; resume it with --ckpt_path last, "
                f"or start a new run with another --run name"
            )
        os.environ["LIT_ATTN_RUN"] = run
        if _local_rank_zero():
            _invocation.start_step = int(self.checkpoint["global_step"]) if self.checkpoint else 0
            for notice in [] if self.complete else _invocation.tidy(path, self.checkpoint):  # a killed attempt's
                print(f"run {run!r}: {notice}", file=sys.stderr, flush=True)
        # Never overwrite the config of an earlier invocation of this run.
        first = self.stage != "fit" or not (self.run_dir / "config.yaml").exists()  # evaluations: in their own dir
        name = "config.yaml" if first else unique_path(self.run_dir / f"config.{self.stage}.yaml").name
        self.save_config_kwargs = {**self.save_config_kwargs, "config_filename": name}
        if _local_rank_zero() and not self.complete:
            verb = "resuming from" if self.stage == "fit" else f"{self.stage} of"
            action = (f"{verb} {path.name} (step {self.checkpoint['global_step']})" if self.checkpoint
                      else "new run" if self.stage == "fit" else "untrained weights (--untrained true)")
            print(f"run {run!r} in {self.run_dir}: {action}", file=sys.stderr, flush=True)

    def instantiate_trainer(self, **kwargs: Any):
        if self.complete:  # a resume of a finished run: its settings checked, then one line, before a trainer exists
            self._check_compatible(self.checkpoint, world_size=None)
            raise RunComplete(self.complete)
        trainer_cfg = self.config_init.get(str(self.subcommand), self.config_init).get("trainer", {})
        listed = trainer_cfg.get("callbacks") or []
        for callback in listed if isinstance(listed, list) else [listed]:
            key = next((k for k, c in FORCED_CALLBACKS.items() if type(callback) is c), None)
            if key is not None:
                raise ValueError(
                    f"{type(callback).__name__} is always on; remove it from trainer.callbacks "
                    f"and set its options with --{key}.* (e.g. in the config's top-level '{key}:' section)"
                )
        # Every checkpoint (last, best, a user's ModelCheckpoint) is written atomically beside its
        # target with a digest, unless the user brought a CheckpointIO of their own.
        plugins = trainer_cfg.get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            kwargs["plugins"] = [*plugins, AtomicCheckpointIO()]
        if trainer_cfg.get("enable_checkpointing") is False:
            raise ValueError(
                "trainer.enable_checkpointing=false would drop last.ckpt, which every run keeps; "
                "save less often with --checkpoint.every_n_train_steps N (0: only at the end and on a stop)"
            )
        if trainer_cfg.get("logger") in (None, True) and self.stage != "fit":
            # An evaluation logs into a directory of its own, never into the run's training curves.
            step = int(self.checkpoint["global_step"]) if self.checkpoint is not None else 0
            kwargs["logger"] = EvaluationLogger(evaluation_dir(self.run_dir, self.stage), step)
        elif trainer_cfg.get("logger") in (None, True):
            after_earlier_event_files(self.run_dir)
            kwargs["logger"] = RunLogger(
                save_dir=str(self.runs_dir), name=self.run_name, version="", default_hp_metric=False,
                # TensorBoard hides events at or after this step from an interrupted earlier
                # attempt, so a resumed run's curves continue without repeats.
                purge_step=resume_purge_step(self.checkpoint) if self.checkpoint is not None else 0,
            )
        if trainer_cfg.get("default_root_dir") is None:
            kwargs["default_root_dir"] = str(self.run_dir)
        try:
            return super().instantiate_trainer(**kwargs)
        except ModuleNotFoundError as e:  # an accelerator or strategy whose package is not installed
            raise ValueError(f"{' '.join(str(e).split())}; or pick another --trainer.accelerator/strategy") from None
        except MisconfigurationException as e:
            # Lightning's device checks (an accelerator this machine lacks, devices=0, ...).
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(trainer_error_message(first, torch.cuda.is_available())) from None

    # ---- checkpoint compatibility, before Lightning restores anything ----

    def _check_checkpoint(self) -> None:
        ckpt, self.checkpoint = self.checkpoint, None
        if ckpt is None:
            return
        self._check_compatible(ckpt, self.trainer.world_size)
        saved = ckpt.get("hyper_parameters", {})
        if self.stage == "fit" and isinstance(self.model, GPT):
            self.model.check_resumable(saved)
        if self.stage == "fit" and _local_rank_zero():
            for k, now in self.model.hparams.items():
                if k not in ARCHITECTURE and k in saved and _comparable(saved[k]) != _comparable(now):
                    print(f"resume: model.{k} {saved[k]!r} -> {now!r} applies from step {ckpt['global_step']}",
                          file=sys.stderr, flush=True)

    def _check_compatible(self, ckpt: dict[str, Any], world_size: int | None) -> None:
        """One-line ValueErrors for a checkpoint of other data or another model; with `world_size`, also for a
        data order the resumed sampler cannot continue."""
        dm_key = type(self.datamodule).__qualname__
        if self.datamodule is not None and ckpt.get("datamodule_hparams_name") is not None:
            saved_dm = [k for k in ckpt if k.endswith("DataModule")]
            if saved_dm and dm_key not in saved_dm:
                raise ValueError(f"the checkpoint was trained with {saved_dm[0]}, this run uses {dm_key}; "
                                 "use the run's data settings")
            if dm_key in ckpt:
                self.datamodule.load_state_dict(ckpt[dm_key])  # raises on a different vocabulary/tokenizer
                if self.stage == "fit" and world_size is not None and hasattr(self.datamodule, "check_resume"):
                    self.datamodule.check_resume(ckpt[dm_key], world_size)
        saved = ckpt.get("hyper_parameters", {})
        if "vocab_size" in saved:  # a model's settings, those it predates at their defaults
            saved = {**ARCHITECTURE_DEFAULTS, **saved}
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
                raise ValueError(f"the checkpoint's {key} has shape {tuple(tensor.shape)}, this model's is {have}; "
                                 "use the run's settings")

    before_fit = before_validate = before_test = before_predict = _check_checkpoint

    def after_fit(self) -> None:
        """A fit that reached its end scores the data's held-out test split once, with the weights it ended with,
        into the run's own curves (test/loss, test/acc, test/ppl): the split a comparison reports on, never the
        one it chooses on."""
        if getattr(self.datamodule, "has_test_split", False) and self.trainer.state.status == TrainerStatus.FINISHED:
            self.trainer.test(self.model, datamodule=self.datamodule, verbose=False)

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
    check_config_files(sys.argv[1:] if args is None else args)
    if args is None:  # from the shell: LightningCLI warns when given args beside a command line
        sys.argv[1:] = with_run_config(sys.argv[1:])
    else:
        args = with_run_config(args)
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


def _user_error_message(e: BaseException) -> str | None:
    """The one line a user error ends in; None for an error that is a bug (its traceback is shown)."""
    if isinstance(e, USER_ERRORS):
        message = " ".join(str(e).split()) or type(e).__name__  # one line, whatever the library wrote
        if isinstance(e, NonFiniteLossError) and _invocation.run_dir is not None:
            message += after_non_finite_loss(_invocation.run_dir, e.advice)
        return message
    if isinstance(e, OSError) and e.errno in STORAGE_ERRORS:
        where = f" {e.filename}" if e.filename else ""
        return (f"cannot write{where}: {e.strerror}; every checkpoint already on disk is intact: free space "
                f"(or fix the permissions) and resume with --ckpt_path last")
    return None


def cli(args: list[str] | None = None) -> int:
    """Run the command line; a user error prints one `error: ...` line and returns 2.

    A command refused before it trained leaves no trace: the files and directories it
    created are removed (only those: not what another process wrote meanwhile). A run that
    failed while training (a non-finite loss) keeps its curves and config for diagnosis.
    The run's lock is given up whichever way the command ends.
    """
    global _invocation
    if signal.getsignal(signal.SIGINT) is interrupted_while_loading:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # from here, KeyboardInterrupt undoes what was made
    quiet_known_warnings()
    _invocation = Invocation()
    try:
        main(args)
    except RunComplete as e:  # a resume of a finished run: nothing to do, and nothing is left written
        _invocation.undo()
        print(str(e), file=sys.stderr)
        return 0
    except (*USER_ERRORS, OSError) as e:
        message = _user_error_message(e)
        if message is None or os.environ.get("LIT_ATTN_DEBUG"):
            raise
        if not _invocation.trained():
            _invocation.undo()
        print(f"error: {message}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, SystemExit) as e:
        # Lightning turns a Ctrl-C inside fit into SystemExit(1); one during training is reported by the stop itself
        if isinstance(e, SystemExit) and not isinstance(e.__context__, KeyboardInterrupt) or _invocation.trained():
            raise
        _invocation.undo()
        print("interrupted (Ctrl-C) before training started; nothing was written", file=sys.stderr)
        return 130
    finally:
        _invocation.release()
        _invocation.cli = None  # the trainer, model and data are not kept alive past the command
    return 0
