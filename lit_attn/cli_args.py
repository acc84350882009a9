"""What main.py reads from the raw command line before LightningCLI parses it.

Two things cannot wait for the parser: a `--config` file that does not exist (jsonargparse would
take its name for YAML text and report an empty value), and an evaluation of a run (`validate`,
`test`, `predict` with `--run NAME`), which must start from the run's own saved config rather than
the default one, or it would rebuild a model of another size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger

SUBCOMMANDS = ("fit", "validate", "test", "predict")
EVALUATIONS = ("validate", "test", "predict")


def flag_values(args: list[str], flag: str) -> list[str]:
    """The values given to `flag` (`--flag VALUE` or `--flag=VALUE`), in order."""
    values = []
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            values.append(args[i + 1])
        elif arg.startswith(flag + "="):
            values.append(arg[len(flag) + 1:])
    return values


def check_config_files(args: list[str]) -> None:
    """FileNotFoundError naming a `--config` file that does not exist.

    `--config` also takes inline YAML ('{trainer: {max_steps: 5}}'); a value with no YAML
    punctuation is taken for a file name.
    """
    for value in flag_values(args, "--config"):
        if not Path(value).expanduser().is_file() and not any(c in value for c in ":{}[]\n"):
            raise FileNotFoundError(f"config file not found: {value}; check --config")


def with_run_config(args: list[str]) -> list[str]:
    """`args`, with the run's saved config.yaml first for an evaluation of a run (`--run NAME`).

    The run's config comes right after the subcommand, so the user's own --config files and flags
    still override it; `--ckpt_path last` is added when no checkpoint is named, since evaluating a
    run means evaluating its trained weights.
    """
    stage = next((i for i, arg in enumerate(args) if arg in SUBCOMMANDS), None)
    if stage is None or args[stage] not in EVALUATIONS:
        return args
    runs = flag_values(args, "--run")
    if not runs:
        return args
    runs_dir = (flag_values(args, "--runs_dir") or ["runs"])[-1]
    saved = Path(runs_dir).expanduser() / runs[-1] / "config.yaml"
    if not saved.is_file():
        return args  # no such run, or one from before configs were saved: main.py says which
    defaults = ["--config", str(saved)]
    if not flag_values(args, "--ckpt_path"):
        defaults.append("--ckpt_path=last")
    return [*args[: stage + 1], *defaults, *args[stage + 1:]]


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


class EvaluationLogger(TensorBoardLogger):
    """TensorBoard for one evaluation of a checkpoint: every value at the checkpoint's training step.

    Lightning counts an evaluation's steps from 0; at the trained step the values line up with the
    run's training curves when TensorBoard shows both.
    """

    def __init__(self, where: Path, step: int) -> None:
        super().__init__(save_dir=str(where.parent), name="", version=where.name, default_hp_metric=False)
        self.step = step

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        super().log_metrics(metrics, self.step)
