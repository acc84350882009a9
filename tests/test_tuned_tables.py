"""docs/results.md's tuned comparisons and the recipe's ablation come from the archived records of their runs
(docs/tuned_runs.tar.gz: config.yaml, hparams.yaml and the event files of every run, no checkpoints): each table
row the docs print is rebuilt here as `lit-attn compare --best-of` (or `--group-by`) computes it."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from lit_attn.tools import best_of as best
from lit_attn.tools import compare
from lit_attn.tools import time_to_loss as timed

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "results.md"
TW_TARGET, TW_AT = 1.9, 150.0  # the documented compare's --target-loss and --at-time
AB_MUON_LR, AB_TARGET = "0.005", 2.0  # the recipe's chosen muon_lr for MHA, the ablation's --target-loss


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tuned")
    with tarfile.open(ROOT / "docs" / "tuned_runs.tar.gz") as archive:
        archive.extractall(out, filter="data")
    return out / "tuned_runs"


@pytest.fixture(scope="module")
def documented() -> str:
    return DOC.read_text(encoding="utf-8")


def _stats(run_dirs: list[Path], *, best_of: str | None = None, group_by: str = "attention",
           reference: str = "mha", target: float | None = None, at: float | None = None
           ) -> tuple[dict[str, dict], dict[str, list], dict[str, tuple], str]:
    """(group -> group_stats, group -> grid values tried on seed 1, group -> chosen point, split), as compare."""
    rows = [compare.read_run(d) for d in run_dirs]
    timed.annotate(rows, target, at)
    groups: dict[str, list[dict]] = {}
    for r, d in zip(rows, run_dirs):
        groups.setdefault(compare._group_of(r, d, group_by), []).append(r)
        if best_of:
            r["grid_point"] = best.grid_point(d, [best_of])
    tried, split = {}, "val"
    if best_of:
        tried = {name: sorted({r["grid_point"][0] for r in group if r["seed"] == 1}) for name, group in groups.items()}
        groups, _, split = compare.best_points(groups, [best_of], group_by)
    table = compare.group_stats(groups, reference, split)
    chosen = {name: group[0].get("grid_point") for name, group in groups.items()}
    return {g["group"]: g for g in table}, tried, chosen, split


def _loss(g: dict) -> str:
    s = g["loss"]
    return f"{s.mean:.4f}" + ("" if s.std is None else f" ± {s.std:.4f}") + f" ({s.n})"


def _delta(g: dict) -> str:
    d = g["paired"]
    if d is None:
        return "– | reference"
    return f"{d.mean:+.4f}" + ("" if d.ci is None else f" [{d.ci[0]:+.4f}, {d.ci[1]:+.4f}]") + f" | {d.verdict}"


def _tuned_rows(run_dirs: list[Path], key: str, **measures) -> list[str]:
    table, tried, chosen, split = _stats(run_dirs, best_of=key, **measures)
    assert split == "test"  # every chosen run scored the held-out split
    return [f"| {name} | {', '.join(map(best.show, tried[name]))} | {best.show(chosen[name][0])} | {_loss(g)} | "
            f"{_delta(g)} |" for name, g in table.items()]


@pytest.mark.parametrize("prefix, key", [("tw", "model.lr"), ("rd", "model.lr"), ("rm", "model.muon_lr")])
def test_the_tuned_tables_come_from_the_archived_runs(runs, documented, prefix, key):
    run_dirs = sorted(runs.glob(f"{prefix}-*-s?"))
    rows = _tuned_rows(run_dirs, key)
    assert len(rows) == 7
    for row in rows:
        assert row in documented, row


# The recipe minus one option (configs/recipe_modern.yaml's MHA at its chosen muon_lr, 3 seeds each):
# (sweep prefix, the setting it changes, the recipe's value, the ablated value)
ABLATIONS = [("ab-adamw", "optimizer", "muon", "adamw"), ("ab-cosine", "schedule", "trapezoidal", "cosine"),
             ("ab-noqknorm", "qk_norm", "auto", "false"), ("ab-gelu", "ffn", "relu2", "gelu"),
             ("ab-nosoftcap", "logit_softcap", "15.0", "null"), ("ab-tied", "tie_embeddings", "false", "true")]


def ablation_rows(runs: Path, muon_lr: str, target: float) -> list[str]:
    """The ablation table's rows: the recipe, then each option taken out, paired with the recipe by seed."""
    recipe = sorted(runs.glob(f"rm-mha-muon_lr{muon_lr}-s?"))
    rows = []
    for prefix, key, full, ablated in ABLATIONS:
        table, *_ = _stats(recipe + sorted(runs.glob(f"{prefix}-mha-s?")), group_by=key, reference=full,
                           target=target)
        (m,) = timed.measures(target, None)
        if not rows:
            rows.append(f"| the recipe | {_loss(table[full])} | – | reference | {timed.cell(m, table[full])} |")
        g = table[ablated]
        rows.append(f"| `--model.{key} {ablated}` | {_loss(g)} | {_delta(g)} | {timed.cell(m, g)} |")
    return rows


def _measure(m: timed.Measure, g: dict) -> str:
    """'value ± std (n of N reached) | Δ [95% CI]' of one measure, the difference paired with the reference's."""
    k, diff = m.key, m.fmt.replace("{:", "{:+")
    low, high = g[k + "_diff_ci_low"], g[k + "_diff_ci_high"]
    paired = "–" if g[k + "_diff"] is None else (
        diff.format(g[k + "_diff"]) + ("" if low is None else f" [{diff.format(low)}, {diff.format(high)}]"))
    return f"{timed.cell(m, g)} | {paired}"


def time_rows(run_dirs: list[Path], key: str, target: float, at: float) -> list[str]:
    """The tuned comparison's training-cost rows: time to `target` and val loss at `at` seconds, paired with MHA."""
    table, *_ = _stats(run_dirs, best_of=key, target=target, at=at)
    measures = timed.measures(target, at)
    return [f"| {name} | " + " | ".join(_measure(m, g) for m in measures) + " |" for name, g in table.items()]


def test_the_worked_comparisons_training_cost_comes_from_the_archived_runs(runs, documented):
    rows = time_rows(sorted(runs.glob("tw-*-s?")), "model.lr", TW_TARGET, TW_AT)
    assert len(rows) == 7
    for row in rows:
        assert row in documented, row


def test_the_ablation_comes_from_the_archived_runs(runs, documented):
    rows = ablation_rows(runs, AB_MUON_LR, AB_TARGET)
    assert len(rows) == len(ABLATIONS) + 1
    for row in rows:
        assert row in documented, row
