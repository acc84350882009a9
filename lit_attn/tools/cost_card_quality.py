"""The cost card's quality side, per attention over its runs: MQAR accuracy (mean ± sample std and the number of
runs), passkey accuracy and the extrapolation loss ratios at 2x and 4x context (means over the probed runs), each
lm-eval metric of `lit-attn evaluate` (mean over the evaluated runs), MQAR accuracy paired with a reference
attention's over matching seeds (lit_attn.tools.stats), and why a value is blank."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lit_attn.tools import stats
from lit_attn.tools.compare import by_seed
from lit_attn.tools.run_record import LM_EVAL_KEY, PROBE_HEADERS

BLANK = "–"
# (CSV header, Markdown header, Markdown format); MQAR's mean, std and runs are one Markdown cell, its 95% CI
# (Student's t) is in the paired table.
QUALITY_COLUMNS: list[tuple[str, str, str]] = [
    ("mqar_acc", "MQAR acc", "{:.4f}"),
    ("mqar_acc_std", "", "{:.4f}"),
    ("mqar_acc_runs", "", "{}"),
    ("mqar_acc_ci_low", "", "{:.4f}"),
    ("mqar_acc_ci_high", "", "{:.4f}"),
    ("passkey_acc", "passkey acc", "{:.3f}"),
    ("loss_ratio_2x", "loss 2x/1x", "{:.3f}"),
    ("loss_ratio_4x", "loss 4x/1x", "{:.3f}"),
]
PAIRED_COLUMNS = ("mqar_acc_pairs", "mqar_acc_diff", "mqar_acc_diff_ci_low", "mqar_acc_diff_ci_high",
                  "mqar_acc_verdict")
LABELS = {"mqar_acc": "MQAR acc", "passkey_acc": "passkey acc", "loss_ratio_2x": "loss 2x/1x",
          "loss_ratio_4x": "loss 4x/1x"}
NO_MQAR = "no val/mqar_acc logged (not trained on MQAR data)"
FROM_COMPARE = "compare.csv holds no probe results (give the run directories with --runs)"


def absent(records: Sequence[dict[str, Any]]) -> tuple[set[str], list[str]]:
    """The quality values no run has at all (e.g. no MQAR run, no probe yet), and a note for each kind: said once
    for the card rather than once per attention."""
    missing = {h for h in LABELS if all(r.get(h) is None for r in records)}
    notes = []
    if "mqar_acc" in missing:
        notes.append("MQAR acc blank: no run logged val/mqar_acc (none was trained on MQAR data)")
    if missing & set(PROBE_HEADERS):
        labels = " and ".join(LABELS[h] for h in PROBE_HEADERS if h in missing)
        from_compare = all("probe_notes" not in r for r in records)  # compare.csv rows: read_run adds probe_notes
        why = FROM_COMPARE if from_compare else "no run has these lit-attn probe results (RUN/probe/PROBE/PROBE.json)"
        notes.append(f"{labels} blank: {why}")
    return missing, notes


def summarize(runs: Sequence[dict[str, Any]], quiet: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """One attention's quality columns over its runs (read_run rows), and "quality_notes": why a value is blank or
    over fewer than all its runs (none for the headers in `quiet`)."""
    mqar = stats.summarize([r["mqar_acc"] for r in runs if r.get("mqar_acc") is not None])
    out: dict[str, Any] = {"mqar_acc": mqar.mean, "mqar_acc_std": mqar.std, "mqar_acc_runs": mqar.n or None,
                           "mqar_acc_ci_low": mqar.ci and mqar.ci[0], "mqar_acc_ci_high": mqar.ci and mqar.ci[1]}
    reasons: dict[str, list[str]] = {}  # header -> why its runs lack it
    if mqar.n < len(runs) and "mqar_acc" not in quiet:
        reasons["mqar_acc"] = [f"run {r['run']}: {NO_MQAR}" for r in runs if r.get("mqar_acc") is None]
    for header in PROBE_HEADERS:
        present = [r[header] for r in runs if r.get(header) is not None]
        out[header] = stats.summarize(present).mean
        if len(present) < len(runs) and header not in quiet:
            reasons[header] = [f"run {r['run']}: {(r.get('probe_notes') or {}).get(header, FROM_COMPARE)}"
                               for r in runs if r.get(header) is None]
    for key in lm_eval_keys(runs):  # lit-attn evaluate's metrics: means over the runs that have them
        out[key] = stats.summarize([r[key] for r in runs if r.get(key) is not None]).mean
    # Values missing for the same reasons share one note: "loss 2x/1x and loss 4x/1x blank: ...".
    grouped: dict[tuple[str, ...], list[str]] = {}
    for header, why in reasons.items():
        grouped.setdefault(tuple(why), []).append(header)
    out["quality_notes"] = [
        f"{' and '.join(LABELS[h] for h in headers)} "
        f"{'blank' if out[headers[0]] is None else f'over {len(runs) - len(why)} of {len(runs)} runs'}: "
        f"{'; '.join(why)}" for why, headers in grouped.items()]
    return out


def paired(groups: dict[str, Sequence[dict[str, Any]]], reference: str | None) -> tuple[str | None, dict[str, dict]]:
    """(the reference, attention -> PAIRED_COLUMNS values): each attention's MQAR accuracy minus the reference's over
    matching seeds, its 95% t interval and verdict. `reference` None: the first attention with an MQAR accuracy
    (None and no pairs when none has one); ValueError if the named one has none."""
    with_mqar = [name for name, runs in groups.items() if any(r.get("mqar_acc") is not None for r in runs)]
    if reference is None:
        reference = next(iter(with_mqar), None)
    elif reference not in with_mqar:
        raise ValueError(f"--reference {reference!r} has no MQAR accuracy; attentions with one: "
                         f"{', '.join(with_mqar) or 'none'}")
    if reference is None:
        return None, {}
    ref = {s: -a for s, a in by_seed(groups[reference], "mqar_acc", reference).items()}
    out = {reference: dict.fromkeys(PAIRED_COLUMNS) | {"mqar_acc_verdict": "reference"}}
    for name in with_mqar:
        if name == reference:
            continue
        # stats' verdict reads lower as better (a loss): on negated accuracies, "better" means more accurate.
        d = stats.paired_difference({s: -a for s, a in by_seed(groups[name], "mqar_acc", name).items()}, ref)
        ci = None if d.ci is None else (-d.ci[1], -d.ci[0])
        out[name] = {"mqar_acc_pairs": d.n, "mqar_acc_diff": None if d.mean is None else -d.mean,
                     "mqar_acc_diff_ci_low": ci and ci[0], "mqar_acc_diff_ci_high": ci and ci[1],
                     "mqar_acc_verdict": d.verdict}
    return reference, out


def mqar_cell(row: dict[str, Any]) -> str:
    """'0.8500 ± 0.0100 (3)': mean ± sample std (number of runs); no std for one run."""
    if row["mqar_acc"] is None:
        return BLANK
    std = "" if row["mqar_acc_std"] is None else f" ± {row['mqar_acc_std']:.4f}"
    return f"{row['mqar_acc']:.4f}{std} ({row['mqar_acc_runs']})"


def lm_eval_keys(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The lm-eval metrics ("lm_eval/TASK/METRIC", from `lit-attn evaluate`) any of `rows` has, sorted."""
    return sorted({k for r in rows for k in r if k.startswith(LM_EVAL_KEY)})


def quality_cells(row: dict[str, Any], lm_eval: Sequence[str] = ()) -> list[str]:
    """The Markdown cells of the quality columns, then of the lm-eval metrics `lm_eval`."""
    rest = [(h, fmt) for h, md, fmt in QUALITY_COLUMNS[1:] if md] + [(k, "{:.4g}") for k in lm_eval]
    return [mqar_cell(row)] + [BLANK if row.get(h) is None else fmt.format(row[h]) for h, fmt in rest]


def quality_heads(lm_eval: Sequence[str] = ()) -> list[str]:
    """The Markdown headers of the quality columns, then of the lm-eval metrics `lm_eval` (TASK/METRIC)."""
    return [md for _, md, _ in QUALITY_COLUMNS if md] + [k.removeprefix(LM_EVAL_KEY) for k in lm_eval]


def paired_markdown(rows: Sequence[dict[str, Any]], reference: str) -> str:
    """MQAR accuracy per attention with its 95% interval, and its difference from `reference`'s over matching seeds."""
    def num(value: float | None, fmt: str) -> str:
        return BLANK if value is None else fmt.format(value)

    lines = [f"MQAR accuracy over each attention's runs (mean ± sample std, 95% CI of the mean, Student's t), and "
             f"minus {reference}'s over matching seeds (positive: more accurate than {reference}).", "",
             "| attention | runs | MQAR acc | 95% CI | pairs | Δ MQAR acc | Δ 95% CI | verdict |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["mqar_acc"] is None:
            continue
        ci = BLANK if r["mqar_acc_ci_low"] is None else f"[{r['mqar_acc_ci_low']:.4f}, {r['mqar_acc_ci_high']:.4f}]"
        low, high = r["mqar_acc_diff_ci_low"], r["mqar_acc_diff_ci_high"]
        diff_ci = BLANK if low is None else f"[{low:+.4f}, {high:+.4f}]"
        lines.append(f"| {r['attention']} | {r['mqar_acc_runs']} | {mqar_cell(r)} | {ci} | "
                     f"{num(r['mqar_acc_pairs'], '{}')} | {num(r['mqar_acc_diff'], '{:+.4f}')} | {diff_ci} | "
                     f"{r['mqar_acc_verdict'] or BLANK} |")
    return "\n".join(lines) + "\n"
