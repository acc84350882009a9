"""Decisions main.py takes about a command around LightningCLI's parsing, apart from the CLI class.

Before parsing: a `--config` file that does not exist is named (jsonargparse would take its name
for YAML text), and an evaluation of a run (`validate`, `test`, `predict` with `--run NAME`) starts
from the run's own saved config, or it would rebuild a model of another size. After parsing: the
data-order seed is resolved and written into the config, and settings that would silently
replace the model's optimizer are refused. Evaluations log into a directory of their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lit_attn.training.run_logger import RunLogger

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
    """FileNotFoundError naming a `--config` file that does not exist, ValueError naming one that is not
    UTF-8 YAML text, and ValueError for a data block size set apart from the model's (it is linked from it).

    `--config` also takes inline YAML ('{trainer: {max_steps: 5}}'); a value with no YAML
    punctuation is taken for a file name.
    """
    import yaml

    for given in ("--data.block_size", "--data.init_args.block_size"):
        if flag_values(args, given) or given in args:
            raise ValueError(f"{given} is set by --model.block_size (one context length for the model and the "
                             f"data windows); use --model.block_size")
    for value in flag_values(args, "--config"):
        path = Path(value).expanduser()
        if not path.is_file():
            if not any(c in value for c in ":{}[]\n"):
                raise FileNotFoundError(f"config file not found: {value}; check --config")
            continue
        try:
            config = yaml.safe_load(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ValueError(f"--config {value} is not UTF-8 text (byte {e.start}: {e.reason}); "
                             f"give a YAML config file") from None
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            line = f" at line {where.line + 1}" if where is not None else ""
            problem = getattr(e, "problem", None) or type(e).__name__
            raise ValueError(f"--config {value} is not valid YAML{line}: {problem}") from None
        data = config.get("data") if isinstance(config, dict) else None
        data = data.get("init_args", data) if isinstance(data, dict) else None
        model = config.get("model") if isinstance(config, dict) else None
        own = model.get("block_size") if isinstance(model, dict) else None
        if isinstance(data, dict) and "block_size" in data and data["block_size"] != own:
            raise ValueError(f"--config {value} sets data block_size {data['block_size']!r}, which --model.block_size "
                             f"sets (one context length for the model and the data windows); set model.block_size")


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
    # No config.yaml: no such run (refused by --ckpt_path last), or one that never started training.
    defaults = ["--config", str(saved)] if saved.is_file() else []
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
    saved = next((v.get("sampler", {}).get("seed") for k, v in (checkpoint or {}).items()
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
                             f"--model.lr, --model.weight_decay, --model.betas, --model.warmup_fraction, "
                             f"--model.min_lr_ratio")
