"""Parameter counts (measured and analytic) and attention FLOPs per token, at the start of fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from rich import get_console
from rich.table import Table
from torch import nn

from lit_attn.analytic import (
    attention_flops_per_token,
    attention_params,
    gpt_params,
    seed001_gpt_params,
    seed001_layout_differences,
)
from lit_attn.lightning_compat import tensorboard_event_file, tensorboard_purge_step

COMPONENTS = ("embeddings", "attention", "ffn", "norms", "head", "other")


def _modules(pl_module: L.LightningModule) -> dict[str, list[nn.Module]]:
    """The model's documented modules, grouped by component; missing ones are skipped."""
    blocks = list(getattr(pl_module, "blocks", []))
    groups = {
        "embeddings": [getattr(pl_module, "tok_emb", None), getattr(pl_module, "pos_emb", None)],
        "attention": [b.attn for b in blocks],
        "ffn": [b.ffn for b in blocks],
        "norms": [m for b in blocks for m in (b.norm1, b.norm2)] + [getattr(pl_module, "norm_f", None)],
        "head": [getattr(pl_module, "lm_head", None)],
    }
    return {k: [m for m in v if m is not None] for k, v in groups.items()}


def count_parameters(pl_module: L.LightningModule) -> dict[str, int]:
    """Parameters per component, total and trainable; shared tensors count once.

    A parameter belongs to the first component that holds it, in COMPONENTS order, so
    a head tied to the token embedding is counted under embeddings (head = 0) and
    the components sum to the total. Anything outside the known modules is "other".
    """
    seen: set[int] = set()
    counts = dict.fromkeys(COMPONENTS, 0)
    for name, modules in _modules(pl_module).items():
        for module in modules:
            for p in module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    counts[name] += p.numel()
    params = list(pl_module.parameters())  # unique tensors
    counts["other"] = sum(p.numel() for p in params if id(p) not in seen)
    counts["total"] = sum(p.numel() for p in params)
    counts["trainable"] = sum(p.numel() for p in params if p.requires_grad)
    return counts


def attention_per_layer(pl_module: L.LightningModule) -> list[int]:
    """Parameters of each block's attention module."""
    return [sum(p.numel() for p in block.attn.parameters()) for block in getattr(pl_module, "blocks", [])]


class ParameterCounts(L.Callback):
    """At fit start (rank zero): a console table and TensorBoard text/scalars of parameter counts.

    Measured: total, trainable, per component, attention per layer. Analytic
    (lit_attn.analytic): the same per component for the run's layout, seed 001's
    GPT formula with the model total minus position embeddings beside it, and the
    attention's forward FLOPs per token at the run's context length, split into the
    linear (projections) and quadratic (scores, weighted sum) terms.
    """

    def __init__(self, print_table: bool = True):
        self.print_table = print_table
        self.report: dict[str, Any] = {}

    @rank_zero_only
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Counted before the strategy wraps the model: FSDP would show only this rank's shards.
        if stage == "fit":
            self.report = build_report(pl_module)

    @rank_zero_only
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        report = self.report
        if self.print_table:
            get_console().print(rich_table(report))
        if any(_logged_before(logger) for logger in trainer.loggers):
            return  # a resumed run: its first attempt logged these at step 0 into the same directory
        scalars = {f"params/{k}": v for k, v in report["measured"].items()}
        scalars |= {f"params/analytic_{k}": v for k, v in (report["analytic"] or {}).items()}
        scalars |= {f"params/attention_layer_{i}": v for i, v in enumerate(report["attention_per_layer"])}
        scalars["params/seed001_formula"] = report["seed001"]
        if report["flops"] is not None:
            scalars["flops/attention_linear_per_token"] = report["flops"].linear
            scalars["flops/attention_quadratic_per_token"] = report["flops"].quadratic
        for logger in trainer.loggers:
            logger.log_metrics({k: float(v) for k, v in scalars.items()}, step=trainer.global_step)
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_text("params", markdown(report), trainer.global_step)


def _logged_before(logger: Any) -> bool:
    """Whether the TensorBoard logger's directory holds an event file of an earlier writer
    whose step-0 events stay visible.

    A resumed run's logger purges only the events at or after the checkpoint's step
    (main.py: purge_step), so the counts its first attempt logged at step 0 must not be
    written twice; a fresh fit purges from step 0 and logs them again.
    """
    if not isinstance(logger, TensorBoardLogger):
        return False
    purge_step = tensorboard_purge_step(logger)
    if purge_step is not None and purge_step <= 0:
        return False
    own = tensorboard_event_file(logger)
    files = {str(p) for p in Path(logger.log_dir).glob("events.out.tfevents.*")}
    if own is None:  # an unknown writer: count its own file (the newest) out
        return len(files) > 1
    return bool(files - {str(Path(own))})


def build_report(pl_module: L.LightningModule) -> dict[str, Any]:
    """Everything the table shows, as plain numbers."""
    hp = dict(pl_module.hparams)
    measured = count_parameters(pl_module)
    per_layer = attention_per_layer(pl_module)
    attn = pl_module.blocks[0].attn if per_layer else None
    n_embd, n_head, block_size = hp.get("n_embd"), hp.get("n_head"), hp.get("block_size")
    heads = (getattr(attn, "n_query_heads", n_head), getattr(attn, "n_kv_heads", n_head))
    pos_params = pl_module.pos_emb.weight.numel() if getattr(pl_module, "pos_emb", None) is not None else 0
    return {
        "attention": hp.get("attention"),
        "hparams": hp,
        "heads": heads,
        "measured": measured,
        "attention_per_layer": per_layer,
        "analytic": gpt_params(**hp),
        "analytic_attention_layer": attention_params(
            hp["attention"], n_embd, n_head, hp.get("n_query_heads"), hp.get("n_kv_heads"), block_size,
            hp.get("bias", True), hp.get("qkv_bias"), hp.get("attention_options"),
        ),
        "seed001": seed001_gpt_params(block_size, hp["vocab_size"], n_embd, n_head, hp["n_layer"]),
        "seed001_compare": measured["total"] - pos_params,
        "seed001_differences": seed001_layout_differences(**hp),
        "flops": attention_flops_per_token(
            hp["attention"], n_embd, n_head, block_size, hp.get("n_query_heads"), hp.get("n_kv_heads")
        ),
    }


def _rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, measured, analytic) rows shared by the console table and the TensorBoard text."""
    m, a = report["measured"], report["analytic"] or {}
    shown = [name for name in COMPONENTS if name != "other" or m[name]]
    rows = [(name, f"{m[name]:,}", f"{a[name]:,}" if name in a else "") for name in shown]
    per_layer, expected = report["attention_per_layer"], report["analytic_attention_layer"]
    expected_text = f"{expected:,}" if expected is not None else "n/a"
    if per_layer and len(set(per_layer)) == 1:
        rows.insert(2, (f"  per layer (x{len(per_layer)})", f"{per_layer[0]:,}", expected_text))
    else:
        for i, n in enumerate(per_layer):
            rows.insert(2 + i, (f"  layer {i}", f"{n:,}", expected_text))
    rows.append(("total", f"{m['total']:,}", f"{a['total']:,}" if a else "n/a"))
    rows.append(("trainable", f"{m['trainable']:,}", ""))
    rows.append(("seed 001 formula", f"{report['seed001_compare']:,} (total - pos. emb.)", f"{report['seed001']:,}"))
    flops = report["flops"]
    if flops is None:
        rows.append(("attn FLOPs/token", "", f"n/a for {report['attention']}"))
    else:
        rows.append(("attn FLOPs/token: linear", "", f"{flops.linear:,}"))
        rows.append(("attn FLOPs/token: quadratic", "", f"{flops.quadratic:,} ({flops.quadratic / flops.total:.0%})"))
    return rows


def _notes(report: dict[str, Any]) -> list[str]:
    """What the analytic rows mean, for the table's caption."""
    diffs = report["seed001_differences"]
    layout = "this run has its GPT-2 layout, so both must match" if not diffs else "layout differs: " + ", ".join(diffs)
    T = report["hparams"].get("block_size")
    return [
        f"seed 001: blocks + final norm + tied head, no embeddings; {layout}",
        f"attn FLOPs/token: forward, one layer, at T={T}; linear = projections (constant in T), "
        f"quadratic = QK^T and AV (doubles with T per token, x4 per sequence)",
    ]


def _title(report: dict[str, Any]) -> str:
    hp = report["hparams"]
    hq, hkv = report["heads"]
    return (f"Parameters: attention {report['attention']}, {hp.get('n_layer')} layers, d={hp.get('n_embd')}, "
            f"H={hp.get('n_head')} (Hq={hq}, Hkv={hkv}), T={hp.get('block_size')}, vocab {hp.get('vocab_size')}")


def rich_table(report: dict[str, Any]) -> Table:
    table = Table(title=_title(report), title_justify="left", caption="\n".join(_notes(report)), caption_justify="left")
    table.add_column("component")
    table.add_column("measured", justify="right")
    table.add_column("analytic", justify="right")
    for row in _rows(report):
        table.add_row(*row)
    return table


def markdown(report: dict[str, Any]) -> str:
    lines = [f"**{_title(report)}**", "", "| component | measured | analytic |", "|---|---:|---:|"]
    lines += [f"| {label.strip()} | {measured} | {analytic} |" for label, measured, analytic in _rows(report)]
    return "\n".join(lines + [""] + [f"- {note}" for note in _notes(report)])
