"""Parameter counts (measured and analytic) and attention FLOPs per token, at the start of fit."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from rich import get_console
from rich.table import Table
from torch import nn

from lit_attn.analytic import (
    cache_values_per_token,
    gpt_params,
    layer_flops_per_token,
    layer_params,
    nanogpt_layout_differences,
    nanogpt_params,
)
from lit_attn.config import GPTConfig
from lit_attn.pattern import layer_label, pattern_label

from .dashboard import logged_before

COMPONENTS = ("embeddings", "attention", "ffn", "norms", "head", "other")


def _modules(pl_module: L.LightningModule) -> dict[str, list[nn.Module]]:
    """The network's modules (lit_attn.Transformer), grouped by component; missing ones are skipped."""
    net = getattr(pl_module, "transformer", pl_module)
    blocks = list(getattr(net, "blocks", []))
    groups = {
        "embeddings": [getattr(net, "tok_emb", None), getattr(net, "pos_emb", None)],
        "attention": [b.attn for b in blocks],
        "ffn": [b.ffn for b in blocks],
        "norms": [m for b in blocks for m in (b.norm1, b.norm2)] + [getattr(net, "norm_f", None)],
        "head": [getattr(net, "lm_head", None)],
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
    return [sum(p.numel() for p in attn.parameters()) for attn in _modules(pl_module)["attention"]]


class ParameterCounts(L.Callback):
    """At fit start (rank zero): a table of parameter counts on the console and as TensorBoard
    text ("params", once per run directory).

    Measured: total, trainable, per component, attention per layer. Analytic
    (lit_attn.analytic): the same per component for the run's layout, nanoGPT's
    scaling-law formula for its MHA GPT-2 layout (beside it the model total minus position
    embeddings when the run has that layout, else "n/a"), and the attention's forward FLOPs
    per token at the run's context length, split into the linear (projections) and
    quadratic (scores, weighted sum) terms: one row per layer, and per kind of layer, where a
    layer pattern gives layers different attentions.
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
        if any(logged_before(logger) for logger in trainer.loggers):
            return  # a resumed run: its first attempt wrote the table at step 0 into the same directory
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_text("params", markdown(report), trainer.global_step)


def build_report(pl_module: L.LightningModule) -> dict[str, Any]:
    """Everything the table shows, as plain numbers, for a model with a GPTConfig (`pl_module.config`)."""
    config: GPTConfig = pl_module.config
    measured = count_parameters(pl_module)
    pos_emb = getattr(pl_module.transformer, "pos_emb", None)
    c = config  # short, for the formula's arguments
    return {
        "config": config,
        "heads": sorted({layer.heads for layer, _ in config.layer_kinds()}),  # one (Hq, Hkv) unless layers differ
        "measured": measured,
        "attention_per_layer": attention_per_layer(pl_module),
        "analytic": gpt_params(config),
        "analytic_attention_layer": layer_params(config),
        "layer_labels": [layer_label(layer.attention, layer.attention_options) for layer in config.layers],
        "nanogpt": nanogpt_params(c.block_size, c.vocab_size, c.n_embd, c.n_head, c.n_layer),
        "nanogpt_compare": measured["total"] - (pos_emb.weight.numel() if pos_emb is not None else 0),
        "nanogpt_differences": nanogpt_layout_differences(config),
        "flops": layer_flops_per_token(config),
        "cache": cache_values_per_token(config),
    }


def _rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, measured, analytic) rows shared by the console table and the TensorBoard text."""
    m, a = report["measured"], report["analytic"]
    shown = [name for name in COMPONENTS if name != "other" or m[name]]
    rows = [(name, f"{m[name]:,}", f"{a[name]:,}" if name in a else "") for name in shown]
    per_layer, expected, labels = report["attention_per_layer"], report["analytic_attention_layer"], \
        report["layer_labels"]
    if per_layer and len(set(zip(per_layer, expected, labels))) == 1:
        rows.insert(2, (f"  per layer (x{len(per_layer)})", f"{per_layer[0]:,}", f"{expected[0]:,}"))
    else:
        kinds = len(set(labels)) > 1  # a layer pattern: each layer's attention named
        for i, (n, e) in enumerate(zip(per_layer, expected)):
            rows.insert(2 + i, (f"  layer {i}" + (f" {labels[i]}" if kinds else ""), f"{n:,}", f"{e:,}"))
    rows.append(("total", f"{m['total']:,}", f"{a['total']:,}"))
    rows.append(("trainable", f"{m['trainable']:,}", ""))
    rows.append(_nanogpt_row(report))
    flops = dict(zip(labels, report["flops"]))  # per kind of layer, in layer order
    for label, split in flops.items():
        kind = "" if len(flops) == 1 else f" ({label}, x{labels.count(label)})"
        rows.append((f"attn FLOPs/token{kind}: linear", "", f"{split.linear:,}"))
        rows.append((f"attn FLOPs/token{kind}: quadratic", "",
                     f"{split.quadratic:,} ({split.quadratic / split.total:.0%})"))
    cache = report["cache"]  # None: the attention declares no cache, decoding recomputes the prefix
    rows.append(("decoding cache/token", "", "none (uncached decoding)" if cache is None else f"{cache:,} values"))
    return rows


NANOGPT_LABEL = "nanoGPT formula (MHA, GPT-2 layout)"


def _nanogpt_row(report: dict[str, Any]) -> tuple[str, str, str]:
    """The formula is comparable only for its own layout; for another it is a reference value."""
    diffs = report["nanogpt_differences"]
    if not diffs:
        return NANOGPT_LABEL, f"{report['nanogpt_compare']:,} (total - pos. emb.)", f"{report['nanogpt']:,}"
    short = ", ".join(diff.split(" (")[0] for diff in diffs)
    return NANOGPT_LABEL, f"n/a: layout differs ({short})", f"{report['nanogpt']:,} (reference)"


def _notes(report: dict[str, Any]) -> list[str]:
    """What the analytic rows mean, for the table's caption."""
    diffs = report["nanogpt_differences"]
    layout = ("this run has that layout, so measured and formula must match" if not diffs
              else "a reference only, this run's layout differs: " + ", ".join(diffs))
    T = report["config"].block_size
    return [
        f"nanoGPT formula: blocks + final norm + tied head, no embeddings, for MHA in the GPT-2 layout; {layout}",
        f"attn FLOPs/token: forward, one layer, at T={T}; linear = projections (constant in T), "
        f"quadratic = QK^T and AV (doubles with T per token, x4 per sequence)",
        "decoding cache/token: what generation keeps per past token, all layers (e.g. K and V)",
    ] + _window_notes(report["config"])


def _window_notes(config: Any) -> list[str]:
    """A sliding window shorter than the context (of any layer): the counts are the algorithm's, not the dense
    kernel's."""
    windows = {(layer.attention_options or {}).get("window") for layer, _ in config.layer_kinds()}
    layers = " of the windowed layers" if config.layer_pattern is not None else ""
    return [f"window {window} < T={config.block_size}: quadratic{layers} counts the {window} keys a query attends to; "
            f"the dense masked SDPA computes all {config.block_size}, so FLOP/s and MFU count the algorithm's work, "
            f"not the kernel's; the cache{layers} keeps the last {window} tokens: at most {window} x their cache/token "
            "per sequence"
            for window in sorted(w for w in windows if isinstance(w, int) and w < config.block_size)]


def _title(report: dict[str, Any]) -> str:
    c = report["config"]
    (hq, hkv), *others = report["heads"]
    heads = f"Hq={hq}, Hkv={hkv}" if not others else "Hq/Hkv by layer kind " + ", ".join(
        f"{hq}/{hkv}" for hq, hkv in report["heads"])
    attention = pattern_label(c.attention, c.layer_pattern, c.local_window)
    return (f"Parameters: attention {attention}, {c.n_layer} layers, d={c.n_embd}, "
            f"H={c.n_head} ({heads}), T={c.block_size}, vocab {c.vocab_size}")


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
