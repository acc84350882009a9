"""What `lit-attn probe` shows and writes: a progress bar over the work, a summary on stdout, and per probe
RUN/probe/PROBE/ with PROBE.json, PROBE.png and TensorBoard events (scalars under probe/PROBE/, the figure as
an image) at the checkpoint's step. A new probe of the same kind replaces the directory's earlier results."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lit_attn.tools import probe_plots
from lit_attn.tools.events import PROBE_DIR


@contextlib.contextmanager
def progress(work: dict[str, int]) -> Iterator[dict[str, Callable[[], None]]]:
    """A rich progress bar per probe on stderr; yields {probe: advance-by-one}."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description:<13}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        tasks = {name: bar.add_task(name, total=total) for name, total in work.items()}
        yield {name: (lambda task=task: bar.advance(task)) for name, task in tasks.items()}


def summary(run: str, results: dict[str, dict[str, Any]]) -> str:
    """The headline numbers as a few lines of text."""
    lines = []
    if "extrapolation" in results:
        for c in results["extrapolation"]["contexts"]:
            ratio = "" if c["multiple"] == 1 else f"  loss({c['multiple']}x)/loss(1x) = {c['ratio']:.3f}"
            lines.append(f"{run} extrapolation {c['multiple']}x ({c['context']} tokens, {c['windows']} windows): "
                         f"val loss {c['loss']:.4f}{ratio}")
    if "passkey" in results:
        p = results["passkey"]
        for length, row in zip(p["lengths"], p["accuracy"]):
            cells = "  ".join(f"{d:g}: " + ("n/a" if a is None else f"{a:.2f}") for d, a in zip(p["depths"], row))
            lines.append(f"{run} passkey length {length}: accuracy by depth  {cells}")
        mean = "n/a (no prompt fits a length)" if p["mean"] is None else f"{p['mean']:.3f}"
        lines.append(f"{run} passkey mean accuracy {mean} ({p['trials']} trials per cell)")
    return "\n".join(lines)


def scalars(name: str, result: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of one probe's result, by tag."""
    out = {}
    if name == "extrapolation":
        for c in result["contexts"]:
            out[f"probe/extrapolation/loss_{c['multiple']}x"] = c["loss"]
            if c["multiple"] != 1:
                out[f"probe/extrapolation/ratio_{c['multiple']}x"] = c["ratio"]
    else:
        if result["mean"] is not None:
            out["probe/passkey/accuracy"] = result["mean"]
        for length, row in zip(result["lengths"], result["accuracy"]):
            cells = [a for a in row if a is not None]
            if cells:
                out[f"probe/passkey/accuracy_{length}_tokens"] = sum(cells) / len(cells)
    return out


def write_results(run_dir: Path, run: str, results: dict[str, dict[str, Any]], step: int, checkpoint: str) -> int:
    """Write each probe's directory; 0, or 2 after a one-line error when it cannot be written."""
    figures = {"extrapolation": probe_plots.extrapolation_figure, "passkey": probe_plots.passkey_figure}
    written = []
    try:
        for name, result in results.items():
            where = run_dir / PROBE_DIR / name
            where.mkdir(parents=True, exist_ok=True)
            for old in where.glob("events.out.tfevents.*"):  # the earlier probe's events: replaced
                old.unlink()
            record = {"run": run, "checkpoint": checkpoint, "step": step, **result}
            (where / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
            figure = figures[name](result, run)
            figure.savefig(where / f"{name}.png", dpi=110)
            _write_events(where, name, result, figure, step)
            written += [where / f"{name}.json", where / f"{name}.png"]
    except OSError as e:
        print(f"error: cannot write into {run_dir / PROBE_DIR}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(str(p) for p in written)} (and TensorBoard events beside them)", file=sys.stderr)
    return 0


def _write_events(where: Path, name: str, result: dict[str, Any], figure: Any, step: int) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(where))
    try:
        for tag, value in scalars(name, result).items():
            writer.add_scalar(tag, value, step)
        writer.add_figure(f"probe/{name}/plot", figure, step, close=False)
    finally:
        writer.close()
