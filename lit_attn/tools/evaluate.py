"""Evaluate a trained run with the lm-evaluation-harness: `lit-attn evaluate --run RUN --tasks t1,t2`.

Any lm-eval task runs on the run's own network and codec (lit_attn.tools.evaluate_lm); tasks in local YAML files
over local data (--include_path DIR) need no network. Each evaluation gets a new directory RUN/eval/lm-eval-N/
(never one written before) with results.json, the harness's results dict, and TensorBoard scalars eval/TASK/METRIC
at the checkpoint's step, beside the run's training curves, never into them. User errors end in one
`error: ...` line and exit code 2.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentParser, Namespace

from lit_attn.cli.toolcli import ToolParser, check_device, csv_list
from lit_attn.codec import one_line
from lit_attn.tools.events import EVAL_DIR
from lit_attn.tools.run_record import LM_EVAL_DIR, lm_eval_metrics

# torch, lm-eval and the run reader (which loads Lightning) are imported where they are used, after the arguments
# are parsed: `--help` and a mistyped flag answer at once.

INSTALL = 'lm-eval is not installed: pip install -e ".[eval]"'


def build_parser() -> ArgumentParser:
    p = ToolParser(prog="lit-attn evaluate", description=__doc__.splitlines()[0])
    p.add_argument("--run", type=str, required=True, help="the run's name (its directory under --runs_dir)")
    p.add_argument("--runs_dir", type=str, default="runs", help="where the run is")
    p.add_argument("--tasks", type=str, required=True, help="lm-eval task (or group) names, comma-separated")
    p.add_argument("--include_path", type=str | None, default=None,
                   help="a directory of task YAML files, searched before lm-eval's own tasks")
    p.add_argument("--limit", type=float | None, default=None,
                   help="examples per task: a count, or a fraction of the task below 1 (for a quick look)")
    p.add_argument("--num_fewshot", type=int | None, default=None, help="few-shot examples (default: the task's)")
    p.add_argument("--batch_size", type=int, default=16, help="sequences per forward pass")
    p.add_argument("--bootstrap_iters", type=int, default=1000,
                   help="resamples for the standard errors that need them (0: none)")
    p.add_argument("--ckpt", type=str, default="last", help="last, best, or a checkpoint file")
    p.add_argument("--device", type=str | None, default=None,
                   help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    return p


def check_args(args: Namespace) -> None:
    """The flags as the evaluation uses them; one-line ValueErrors for values it cannot use."""
    args.tasks = csv_list(args.tasks)
    if not args.tasks:
        raise ValueError("--tasks names no task, e.g. --tasks lambada_openai,hellaswag")
    if args.batch_size < 1:
        raise ValueError(f"--batch_size must be >= 1, got {args.batch_size}")
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise ValueError(f"--num_fewshot must be >= 0, got {args.num_fewshot}")
    if args.bootstrap_iters < 0:
        raise ValueError(f"--bootstrap_iters must be >= 0, got {args.bootstrap_iters}")
    if args.limit is not None:
        if args.limit <= 0:
            raise ValueError(f"--limit must be > 0, got {args.limit:g}")
        if args.limit >= 1 and args.limit != int(args.limit):
            raise ValueError(f"--limit is a count (>= 1, whole) or a fraction (< 1), got {args.limit:g}")
        args.limit = int(args.limit) if args.limit >= 1 else args.limit
    if args.include_path is not None and not Path(args.include_path).is_dir():
        raise ValueError(f"--include_path {args.include_path} is not a directory")


def task_manager(tasks: list[str], include_path: str | None) -> Any:
    """A TaskManager that knows every task named: --include_path's alone when it holds them all (indexing
    lm-eval's thousands of tasks takes seconds), else both. ValueError naming the tasks neither knows."""
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path, include_defaults=False) if include_path else None
    if manager is None or any(t not in manager.all_tasks for t in tasks):
        manager = TaskManager(include_path=include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        broken = unreadable_task_file(include_path) if include_path else None
        if broken is not None:  # lm-eval skips a task file it cannot read, so its task reads as unknown
            raise ValueError(f"--tasks {', '.join(unknown)}: not found, and the task file {broken}; fix the file")
        where = f"{include_path} or " if include_path else ""
        raise ValueError(f"unknown task {', '.join(unknown)}: not in {where}lm-eval's tasks (lm-eval ls tasks lists "
                         f"them; a local task is a YAML file under --include_path)")
    return manager


def unreadable_task_file(include_path: str) -> str | None:
    """'FILE is not ...' for the first YAML file under `include_path` that is not a task's mapping, else None."""
    import yaml

    class Loader(yaml.SafeLoader):  # lm-eval's own tags (!function) are not this check's concern
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    for path in sorted(Path(include_path).rglob("*.yaml")):
        try:
            content = yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)
        except UnicodeDecodeError:
            return f"{path} is not UTF-8 text"
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark is not None else ""
            return f"{path} is not valid YAML{where}: {one_line(getattr(e, 'problem', None) or e, 120)}"
        if not isinstance(content, dict) or not any(k in content for k in ("task", "group", "tag", "include")):
            return f"{path} is not an lm-eval task (a mapping with 'task:')"
    return None


def offline_message(error: Exception, tasks: list[str]) -> str:
    """The one line for a task whose data is on the Hugging Face Hub when the Hub cannot be reached."""
    offline = [v for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if os.environ.get(v, "") not in ("", "0")]
    why = f"{' and '.join(offline)} set" if offline else "no network"
    return (f"--tasks {','.join(tasks)}: a task's data must come from the Hugging Face Hub, which cannot be reached "
            f"({why}: {one_line(error, 160)}); run once online to cache it, or evaluate a local task (--include_path)")


def evaluate(args: Namespace, model: Any, codec: Any, info: dict[str, Any]) -> dict[str, Any]:
    """lm_eval.simple_evaluate of the network on args.tasks: the harness's results dict."""
    import datasets
    from lm_eval import simple_evaluate

    from lit_attn.tools.evaluate_lm import LitAttnLM

    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    datasets.disable_progress_bars()
    manager = task_manager(args.tasks, args.include_path)
    lm = LitAttnLM(model, codec, batch_size=args.batch_size, info=info)
    try:
        return simple_evaluate(model=lm, tasks=args.tasks, num_fewshot=args.num_fewshot, limit=args.limit,
                               batch_size=args.batch_size, task_manager=manager, log_samples=False,
                               bootstrap_iters=args.bootstrap_iters)
    except ConnectionError as e:  # datasets: the Hub cannot be reached (offline, or no network)
        raise ValueError(offline_message(e, args.tasks)) from None
    except ValueError as e:  # random.sample's, drawing more few-shot examples than a task has
        if args.num_fewshot and "larger than population" in str(e):
            raise ValueError(f"--num_fewshot {args.num_fewshot}: more few-shot examples than a task of "
                             f"--tasks {','.join(args.tasks)} has; give a smaller --num_fewshot") from None
        raise


def results_dir(run_dir: Path) -> Path:
    """A new directory RUN/eval/lm-eval-N, claimed atomically: an earlier evaluation's results stay as they are."""
    parent = run_dir / EVAL_DIR
    parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        try:
            (parent / f"{LM_EVAL_DIR}-{n}").mkdir()
            return parent / f"{LM_EVAL_DIR}-{n}"
        except FileExistsError:
            n += 1


# The evaluation's scalars, single points at the checkpoint's step: TensorBoard's TIME SERIES groups tags by the part
# before the first "/", in alphabetical order, opening the first two; under `whole_run` they sort after the run's
# `train` and `val` curves, with the run's other single values (the HParams record's).
TAG_PREFIX = "whole_run/lm_eval/"


def write_results(run_dir: Path, results: dict[str, Any], step: int) -> Path:
    """results.json (JSON-safe) and TensorBoard scalars whole_run/lm_eval/TASK/METRIC at `step` in a new
    results_dir."""
    from lm_eval.utils import handle_non_serializable
    from torch.utils.tensorboard import SummaryWriter

    where = results_dir(run_dir)
    text = json.dumps(results, indent=1, default=handle_non_serializable, ensure_ascii=False)
    (where / "results.json").write_text(text + "\n", encoding="utf-8")
    writer = SummaryWriter(log_dir=str(where))
    try:
        for name, value in lm_eval_metrics(results).items():
            writer.add_scalar(TAG_PREFIX + name, value, step)
    finally:
        writer.close()
    return where / "results.json"


def main(argv: list[str] | None = None) -> int:
    """Evaluate, print the harness's table and write the results; 0, or 2 after a one-line error."""
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
        try:
            import lm_eval  # noqa: F401
        except ImportError:
            raise ValueError(INSTALL) from None
        import torch

        device = check_device(args.device) if args.device else "cuda" if torch.cuda.is_available() else "cpu"
        from lit_attn.cli.runs import find_run, run_checkpoint
        from lit_attn.load import load_run

        run_dir = find_run(args.run, args.runs_dir)
        run = load_run(run_checkpoint(run_dir, args.ckpt), device)
        step = run.step
        info = {"run": args.run, "checkpoint": str(run.path), "step": step}
        results = evaluate(args, run.network, run.codec, info)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    try:
        written = write_results(run_dir, results, step)
    except OSError as e:
        print(f"error: cannot write the results into {run_dir / EVAL_DIR}: {e.strerror or e}", file=sys.stderr)
        return 2
    from lm_eval.utils import make_table

    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))
    print(f"wrote {written} (and TensorBoard events beside it)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
