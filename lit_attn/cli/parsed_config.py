"""Decisions on a command's parsed config, apart from the CLI class: an evaluation of untrained weights is refused
unless asked for, and evaluations log into a directory of their own; the data-order seed is resolved and written
into the config; settings that would silently replace the model's optimizer are refused, and Lightning's refusal to
build the Trainer names the machine's GPUs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lit_attn.cli.run_config import EVALUATIONS
from lit_attn.training.run_logger import RunLogger


def check_untrained(stage: str, checkpoint: bool, untrained: bool) -> None:
    """A one-line ValueError for an evaluation of untrained weights not asked for with --untrained true
    (its score would one day be compared as a result), and for --untrained with a checkpoint or with fit."""
    if stage not in EVALUATIONS:
        if untrained:
            raise ValueError("--untrained is for validate, test and predict; fit always trains")
    elif checkpoint and untrained:
        raise ValueError("--untrained true scores the initial weights, but a checkpoint is named (--run or "
                         "--ckpt_path); drop one of them")
    elif not checkpoint and not untrained:
        raise ValueError(f"{stage} without --run NAME or --ckpt_path FILE would score untrained weights; name the "
                         f"run (--run NAME) or checkpoint to {stage}, or pass --untrained true to score the initial "
                         f"weights on purpose")


def evaluation_dir(run_dir: Path, stage: str) -> Path:
    """A new directory RUN/eval/STAGE-N for one evaluation's events and config, claimed atomically.

    Evaluations log beside the run's training curves, never into them: TensorBoard shows each as
    a run of its own (RUN/eval/validate-1, ...), and the training record stays as training wrote it.
    """
    parent = run_dir / "eval"
    parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        path = parent / f"{stage}-{n}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1


class EvaluationLogger(RunLogger):
    """TensorBoard for one evaluation of a checkpoint: every value at the checkpoint's training step.

    Lightning counts an evaluation's steps from 0; at the trained step the values line up with the
    run's training curves when TensorBoard shows both.
    """

    def __init__(self, where: Path, step: int) -> None:
        super().__init__(save_dir=str(where.parent), name="", version=where.name, default_hp_metric=False)
        self.step = step

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        super().log_metrics(metrics, self.step)


def trainer_error_message(first: str, has_gpu: bool) -> str:
    """Lightning's refusal to build the Trainer, with the machine's GPUs named where devices are the cause."""
    if not any(word in first.lower() for word in ("gpu", "cuda", "mps", "accelerator", "device")):
        return first
    return (f"{first} (this machine has {'a GPU' if has_gpu else 'no GPU'}); check --trainer.accelerator and "
            f"--trainer.devices (e.g. --trainer.accelerator cpu --trainer.devices 1, or auto)")


def resolve_data_seed(cfg: Any, checkpoint: dict[str, Any] | None) -> None:
    """Write the data-order seed into the config: the checkpoint's when resuming, else seed_everything."""
    if cfg.get("data.init_args.seed", "absent") is not None:
        return  # set by the user, or a data class without one
    saved = next((v.get("data", {}).get("seed") for k, v in (checkpoint or {}).items()
                  if k.endswith("DataModule") and isinstance(v, dict)), None)
    seed = cfg.get("seed_everything")
    if saved is not None:
        cfg.data.init_args.seed = int(saved)
    elif isinstance(seed, int) and not isinstance(seed, bool):
        cfg.data.init_args.seed = seed


def refuse_replaced_optimizer(cfg: Any) -> None:
    """ValueError for --optimizer/--lr_scheduler: LightningCLI would silently replace the model's own.

    The parser keeps both options, since every run's saved config names them (as null).
    """
    for key in ("optimizer", "lr_scheduler"):
        if cfg.get(key) is not None:
            raise ValueError(f"--{key} would replace the model's AdamW and warm-up/cosine schedule; set them with "
                             f"--model.lr, --model.weight_decay, --model.decay_all, --model.betas, --model.schedule, "
                             f"--model.warmup_fraction, --model.min_lr_ratio")
