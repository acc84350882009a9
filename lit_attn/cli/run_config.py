"""A command's config before parsing: its `--config` files and, for an evaluation or a resume of a run, the
run's own saved config.

A `--config` file that does not exist, or is not UTF-8 YAML, is named (jsonargparse would take its name for YAML
text), and an evaluation of a run (`validate`, `test`, `predict` with `--run NAME`) or a resume starts from the
run's own saved config, or it would rebuild a model of another size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from lit_attn.cli.runs import fit_configs

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
    """A one-line error naming a `--config` file that does not exist, is not UTF-8 text or is not YAML, and
    ValueError for a data block size set apart from the model's (it is linked from it).

    `--config` also takes inline YAML ('{trainer: {max_steps: 5}}'); a value with no YAML
    punctuation is taken for a file name.
    """
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
        config = _read_yaml(path, "--config")
        data = config.get("data") if isinstance(config, dict) else None
        data = data.get("init_args", data) if isinstance(data, dict) else None
        model = config.get("model") if isinstance(config, dict) else None
        own = model.get("block_size") if isinstance(model, dict) else None
        if isinstance(data, dict) and "block_size" in data and data["block_size"] != own:
            raise ValueError(f"--config {value} sets data block_size {data['block_size']!r}, which --model.block_size "
                             f"sets (one context length for the model and the data windows); set model.block_size")


def _read_yaml(path: Path, what: str) -> Any:
    """The YAML in `path`; a one-line ValueError naming the file if it is not UTF-8 text or not YAML."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); "
                         f"give a YAML file") from None
    try:
        return yaml.load(text, Loader=_AnyTagLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ValueError(f"{what} {path} is not valid YAML{where}: {e.problem or e.context}; fix or replace "
                         f"the file") from None


class _AnyTagLoader(yaml.SafeLoader):
    """SafeLoader that reads tags it does not know (e.g. !!python/tuple) as plain YAML: only the syntax is checked."""


_AnyTagLoader.add_multi_constructor("", lambda loader, suffix, node: (
    loader.construct_sequence(node) if isinstance(node, yaml.SequenceNode)
    else loader.construct_mapping(node) if isinstance(node, yaml.MappingNode) else loader.construct_scalar(node)))


def run_config(run_dir: Path, saves: bool = False) -> Path | None:
    """The config the run's latest fit saved (config.yaml, or a resume's config.fit-N.yaml), checked to be one:
    a one-line ValueError naming the file if it is not UTF-8 YAML holding a model section, or, for a command that
    `saves` checkpoints with the config's callbacks, if they save outside the run; None if there is none."""
    saved = fit_configs(run_dir)
    if not saved:
        return None
    config = _read_yaml(saved[-1], "the run's config")
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        what = "is empty" if config is None else "holds no model section"
        raise ValueError(f"the run's config {saved[-1]} {what}, so the run's model cannot be rebuilt; restore the "
                         f"file from a copy of the run, or give the run's settings with --config FILE")
    if saves:
        _refuse_saves_elsewhere(config, saved[-1], run_dir)
    return saved[-1]


def _refuse_saves_elsewhere(config: dict[str, Any], path: Path, run_dir: Path) -> None:
    """A one-line ValueError for a checkpoint callback whose saved `dirpath` lies in the run's directory as it was
    when trained, now another place (the run was copied or moved): its best-k rotation would delete files there."""
    trained_in = Path(str(config.get("runs_dir") or "runs")).expanduser() / str(config.get("run"))
    if config.get("run") is None or trained_in.resolve() == run_dir.resolve():
        return
    callbacks = (config.get("trainer") or {}).get("callbacks") or []
    for callback in callbacks if isinstance(callbacks, list) else [callbacks]:
        dirpath = ((callback or {}).get("init_args") or {}).get("dirpath") if isinstance(callback, dict) else None
        where = Path(str(dirpath)).expanduser().resolve() if dirpath else None
        if where is not None and trained_in.resolve() in (where, *where.parents):
            raise ValueError(f"the run's config {path} saves checkpoints into {dirpath}, in the directory the run was "
                             f"trained in ({trained_in}), not in {run_dir}; give --trainer.callbacks again with a "
                             f"dirpath inside {run_dir} (or none: RUN/checkpoints)")


def _runs_dir(args: list[str]) -> str:
    """The runs directory `args` name: the last --runs_dir flag or --config file that sets one, else 'runs'."""
    runs_dir = "runs"
    for i, arg in enumerate(args):
        if arg == "--runs_dir" and i + 1 < len(args) or arg.startswith("--runs_dir="):
            runs_dir = args[i + 1] if arg == "--runs_dir" else arg.split("=", 1)[1]
        elif arg == "--config" and i + 1 < len(args) or arg.startswith("--config="):
            value = args[i + 1] if arg == "--config" else arg.split("=", 1)[1]
            try:
                config = _read_yaml(Path(value).expanduser(), "") if Path(value).expanduser().is_file() \
                    else yaml.safe_load(value)
            except (ValueError, yaml.YAMLError):
                continue  # the parser reports it
            if isinstance(config, dict) and isinstance(config.get("runs_dir"), str):
                runs_dir = config["runs_dir"]
    return runs_dir


def with_run_config(args: list[str]) -> list[str]:
    """`args`, with the run's saved config first for an evaluation of a run (`--run NAME`) and for a
    resume (`fit --run NAME --ckpt_path last|auto` of a run that has a checkpoint).

    The saved config is the latest fit's (config.yaml, or a resume's config.fit-N.yaml). It comes right
    after the subcommand, so the user's own --config files and flags still override it. A run is the
    directory the user names: the settings that say where a run lives (runs_dir, trainer.default_root_dir;
    for an evaluation also the logger) are set again after it, so a copied or moved run never acts on
    the place it was copied from. An evaluation gets `--ckpt_path last` when no checkpoint is named,
    since evaluating a run means evaluating its trained weights.
    """
    stage = next((i for i, arg in enumerate(args) if arg in SUBCOMMANDS), None)
    runs = flag_values(args, "--run")
    if stage is None or not runs:
        return args
    runs_dir = _runs_dir(args)
    run_dir = Path(runs_dir).expanduser() / runs[-1]
    ckpt = flag_values(args, "--ckpt_path")
    if args[stage] == "fit":
        resume = bool(ckpt) and ckpt[-1] in ("last", "auto") and (run_dir / "checkpoints" / "last.ckpt").is_file()
        if not resume:
            return args
    elif not run_dir.is_dir():
        return [*args[: stage + 1], *([] if ckpt else ["--ckpt_path=last"]), *args[stage + 1:]]  # no such run
    saved = run_config(run_dir, saves=args[stage] == "fit" and not flag_values(args, "--trainer.callbacks"))
    if saved is None and not flag_values(args, "--config"):
        raise FileNotFoundError(f"{run_dir / 'config.yaml'} is missing, so the run's settings (its model, its "
                                f"data) are unknown; restore the file from a copy of the run, or give them with "
                                f"--config FILE")
    defaults = ["--config", str(saved)] if saved is not None else []
    defaults += [f"--runs_dir={runs_dir}", "--trainer.default_root_dir=null"]
    if args[stage] in EVALUATIONS:
        defaults.append("--trainer.logger=null")  # an evaluation logs into RUN/eval/, see evaluation_dir
        if not ckpt:
            defaults.append("--ckpt_path=last")
    return [*args[: stage + 1], *defaults, *args[stage + 1:]]
