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
    cache_values_per_sequence,
    cache_values_per_token,
    decode_state_kind,
    gpt_params,
    layer_flops_per_token,
    layer_params,
    nanogpt_layout_differences,
    nanogpt_params,
)
from lit_attn.config import GPTConfig
from lit_attn.pattern import layer_label, pattern_label

from .tensorboard_layout import logged_before

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
    embeddings when the run has that layout, else "n/a"), the attention's forward FLOPs
    per token at the run's context length, split into the linear (projections) and
    quadratic (scores, weighted sum; "context (capped)" where it stops growing: a window or a chunked
    recurrence) terms, one row per layer and per kind of layer where a layer pattern gives layers different
    attentions, and the decoding state: values per past token where it grows per token, one sequence's at the
    context.
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
        # Per token at twice the context: equal for a term that stops growing (a window, a chunked recurrence).
        "flops_2t": layer_flops_per_token(config, 2 * config.block_size),
        "cache": cache_values_per_token(config),
        "state": cache_values_per_sequence(config, config.block_size),
        "state_kind": decode_state_kind(config),
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
    flops = dict(zip(labels, zip(report["flops"], report["flops_2t"])))  # per kind of layer, in layer order
    for label, (split, split_2t) in flops.items():
        kind = "" if len(flops) == 1 else f" ({label}, x{labels.count(label)})"
        # the context term grows per token with T (T^2 per sequence) unless a window or a chunk caps it
        context = "quadratic" if split_2t.quadratic > split.quadratic else "context (capped)"  # as _quadratic
        rows.append((f"attn FLOPs/token{kind}: linear", "", f"{split.linear:,}"))
        rows.append((f"attn FLOPs/token{kind}: {context}", "",
                     f"{split.quadratic:,} ({split.quadratic / split.total:.0%})"))
    return rows + _state_rows(report)


def _quadratic(report: dict[str, Any]) -> list[bool]:
    """Per kind of layer, whether its per-token context term still grows at the run's context (T^2 per sequence)."""
    return [twice.quadratic > once.quadratic for once, twice in zip(report["flops"], report["flops_2t"])]


def _state_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """What decoding keeps: values per past token where the state grows per token, one sequence's state at T."""
    kind, T, state = report["state_kind"], report["config"].block_size, report["state"]
    if kind is None:  # the attention declares no decoding state: its decoding recomputes the prefix
        return [("decode state", "", "none (uncached decoding)")]
    per_sequence = (f"decode state/sequence at T={T}", "", f"{state:,} values ({4 * state:,} B in float32), {kind}")
    if kind == "fixed":
        return [per_sequence]
    return [(f"decode state/token{' (last W)' if kind == 'window' else ''}", "", f"{report['cache']:,} values"),
            per_sequence]


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
        f"attn FLOPs/token: forward, one layer, at T={T}; linear = projections (constant in T), " + (
            "quadratic = the work against every earlier token, QK^T and AV (doubles with T per token, x4 per sequence)"
            if any(_quadratic(report)) else "context = the work against earlier tokens, capped (a window, or a chunked "
            "recurrence's chunk): the same per token at 2T, linear per sequence"),
        _state_note(report["state_kind"]),
    ] + _window_notes(report["config"])


STATE_NOTES = {
    None: "decode state: none declared; generation recomputes the prefix for every token",
    "per token": "decode state: what generation keeps, all layers: K/V (or their latent) of every past token, so it "
                 "grows with the context",
    "window": "decode state: K/V of the last W tokens per layer (a ring buffer): it grows per token up to the "
              "window, then stays flat",
    "fixed": "decode state: a fixed-size recurrent state per sequence, all layers: the same at any context length",
    "mixed": "decode state: part of it grows per past token, part does not (fixed or windowed layers)",
}


def _state_note(kind: str | None) -> str:
    return STATE_NOTES[kind]


def _window_notes(config: Any) -> list[str]:
    """A sliding window shorter than the context (of any layer): the counts are the algorithm's, not the dense
    kernel's."""
    windows = {(layer.attention_options or {}).get("window") for layer, _ in config.layer_kinds()}
    layers = " of the windowed layers" if config.layer_pattern is not None else ""
    return [f"window {window} < T={config.block_size}: the context term{layers} counts the {window} keys a query "
            f"attends to; the dense masked SDPA computes all {config.block_size}, so FLOP/s and MFU count the "
            f"algorithm's work, not the kernel's; the decode state{layers} keeps the last {window} tokens: at most "
            f"{window} x state/token per sequence"
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
