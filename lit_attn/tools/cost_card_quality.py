"""The cost card's quality side, per attention over its runs: each quality metric (MQAR accuracy, passkey accuracy,
the extrapolation loss ratios at 2x and 4x context) as mean ± sample std, the number of runs and the 95% t interval
of the mean, and paired with a reference attention's over matching seeds (lit_attn.tools.stats); each lm-eval
metric of `lit-attn evaluate` (mean over the evaluated runs); and why a value is blank."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from lit_attn.tools import stats
from lit_attn.tools.compare import NO_TEST, by_seed
from lit_attn.tools.run_record import LM_EVAL_KEY, PROBE_HEADERS

BLANK = "–"


class Metric(NamedTuple):
    """A quality metric: its CSV header (the prefix of its other columns), Markdown header, name in sentences,
    direction, what "better" means against a reference (in the paired table's heading) and number format."""

    key: str
    label: str
    what: str
    higher_is_better: bool
    better: str
    fmt: str
    optional: bool = False  # a column only on cards where some run has it


ACCURATE = "more accurate than {ref}"
DEGRADES_LESS = "degrades less than {ref} past the training context"
METRICS = (
    Metric("mqar_acc", "MQAR acc", "MQAR accuracy", True, ACCURATE, "{:.4f}"),
    Metric("passkey_acc", "passkey acc", "passkey accuracy", True, ACCURATE, "{:.3f}"),
    Metric("loss_ratio_2x", "loss 2x/1x", "loss ratio 2x/1x", False, DEGRADES_LESS, "{:.3f}"),
    Metric("loss_ratio_4x", "loss 4x/1x", "loss ratio 4x/1x", False, DEGRADES_LESS, "{:.3f}"),
    # the held-out split's loss, scored once at the end of fit (--data.test_fraction)
    Metric("test_loss", "test loss", "test loss", False, "lower test loss than {ref}", "{:.4f}", optional=True),
)
# Per metric: mean, sample std, runs and the 95% t interval of the mean; then its difference from the reference's
# over matching seeds (pairs, mean, 95% t interval, verdict). MQAR's are the card's original columns.
SUMMARY = ("", "_std", "_runs", "_ci_low", "_ci_high")
PAIRED = ("_pairs", "_diff", "_diff_ci_low", "_diff_ci_high", "_verdict")
QUALITY_COLUMNS = [m.key + s for m in METRICS for s in SUMMARY]
PAIRED_COLUMNS = [m.key + s for m in METRICS for s in PAIRED]
LABELS = {m.key: m.label for m in METRICS}
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


def _why(run: dict[str, Any], key: str) -> str:
    """Why `run` lacks `key`: MQAR accuracy comes from the training events, the rest from lit-attn probe's JSON."""
    if key == "test_loss":
        return NO_TEST
    if key not in PROBE_HEADERS:
        return NO_MQAR
    return (run.get("probe_notes") or {}).get(key, FROM_COMPARE)


def summarize(runs: Sequence[dict[str, Any]], quiet: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """One attention's quality columns over its runs (read_run rows), and "quality_notes": why a value is blank or
    over fewer than all its runs (none for the headers in `quiet`)."""
    out: dict[str, Any] = {}
    reasons: dict[str, list[str]] = {}  # header -> why its runs lack it
    for m in METRICS:
        s = stats.summarize([r[m.key] for r in runs if r.get(m.key) is not None])
        out |= dict(zip((m.key + suffix for suffix in SUMMARY),
                        (s.mean, s.std, s.n or None, s.ci and s.ci[0], s.ci and s.ci[1])))
        if s.n < len(runs) and m.key not in quiet:
            reasons[m.key] = [f"run {r['run']}: {_why(r, m.key)}" for r in runs if r.get(m.key) is None]
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


def paired(groups: dict[str, Sequence[dict[str, Any]]],
           reference: str | None) -> tuple[dict[str, str], dict[str, dict], list[str]]:
    """(metric key -> its reference, attention -> PAIRED_COLUMNS values, notes): per metric, each attention's value
    minus the reference's over matching seeds, its 95% t interval and verdict. `reference` None: per metric, the
    first attention with it. A named reference is ValueError if no run is of that attention, or if it has none of
    the metrics that other attentions have; a metric it lacks gets no pairs and a note, as does a reference when no
    run has any of the metrics (language-modelling runs: nothing to pair)."""
    have = {m.key: [name for name, runs in groups.items() if any(r.get(m.key) is not None for r in runs)]
            for m in METRICS}
    if reference is not None and reference not in groups:
        raise ValueError(f"--reference {reference!r} is none of the runs' attentions: {', '.join(groups) or 'none'}")
    if reference is not None and not any(have.values()):
        return {}, {}, [f"--reference {reference}: no paired table, no run has MQAR accuracy, passkey accuracy or "
                        "loss ratios (lit-attn probe); lit-attn compare --reference pairs val loss over seeds"]
    if reference is not None and not any(reference in names for names in have.values()):
        raise ValueError(f"--reference {reference!r} has " + "; ".join(
            f"no {m.what}; attentions with one: {', '.join(have[m.key]) or 'none'}" for m in METRICS
            if have[m.key] or not m.optional))
    references: dict[str, str] = {}
    out: dict[str, dict] = {}
    notes = []
    for m in METRICS:
        ref = next(iter(have[m.key]), None) if reference is None else reference
        if ref not in have[m.key]:
            if have[m.key]:  # a metric no attention has is noted by absent()
                notes.append(f"{m.label}: no paired table, --reference {reference} has no {m.what} "
                             f"(attentions with one: {', '.join(have[m.key])})")
            continue
        references[m.key] = ref
        # stats' verdict reads lower as better (a loss): a higher-is-better metric is negated, so that "better"
        # means more accurate, and the difference and interval are negated back.
        sign = -1 if m.higher_is_better else 1
        ref_values = _signed(groups[ref], m.key, ref, sign)
        out.setdefault(ref, {})[m.key + "_verdict"] = "reference"
        for name in have[m.key]:
            if name == ref:
                continue
            d = stats.paired_difference(_signed(groups[name], m.key, name, sign), ref_values)
            low, high = (None, None) if d.ci is None else sorted((sign * d.ci[0], sign * d.ci[1]))
            out.setdefault(name, {}).update(dict(zip(
                (m.key + suffix for suffix in PAIRED),
                (d.n, None if d.mean is None else sign * d.mean, low, high, d.verdict))))
    return references, out, notes


def _signed(runs: Sequence[dict[str, Any]], key: str, name: str, sign: int) -> dict[int, float]:
    """seed -> `sign` times the runs' `key` (compare.by_seed)."""
    return {s: sign * v for s, v in by_seed(runs, key, name).items()}


def cell(row: dict[str, Any], m: Metric) -> str:
    """'0.8500 ± 0.0100 (3)': mean ± sample std (number of runs) in the metric's format; no std for one run."""
    if row.get(m.key) is None:
        return BLANK
    std = row.get(m.key + "_std")
    return m.fmt.format(row[m.key]) + ("" if std is None else " ± " + m.fmt.format(std)) + f" ({row[m.key + '_runs']})"


def lm_eval_keys(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The lm-eval metrics ("lm_eval/TASK/METRIC", from `lit-attn evaluate`) any of `rows` has, sorted."""
    return sorted({k for r in rows for k in r if k.startswith(LM_EVAL_KEY)})


def shown(rows: Sequence[dict[str, Any]]) -> list[Metric]:
    """The quality metrics the card's table shows: every one but an optional one no row has."""
    return [m for m in METRICS if not m.optional or any(r.get(m.key) is not None for r in rows)]


def quality_cells(row: dict[str, Any], metrics: Sequence[Metric], lm_eval: Sequence[str] = ()) -> list[str]:
    """The Markdown cells of `metrics` (shown), then of the lm-eval metrics `lm_eval`."""
    return [cell(row, m) for m in metrics] + [BLANK if row.get(k) is None else f"{row[k]:.4g}" for k in lm_eval]


def quality_heads(metrics: Sequence[Metric], lm_eval: Sequence[str] = ()) -> list[str]:
    """The Markdown headers of `metrics` (shown), then of the lm-eval metrics `lm_eval` (TASK/METRIC)."""
    return [m.label for m in metrics] + [k.removeprefix(LM_EVAL_KEY) for k in lm_eval]


def paired_table(rows: Sequence[dict[str, Any]], m: Metric, reference: str) -> str:
    """Metric `m` per attention with its 95% interval, and its difference from `reference`'s over matching seeds."""
    def num(value: float | None, fmt: str) -> str:
        return BLANK if value is None else fmt.format(value)

    diff_fmt = m.fmt.replace("{:", "{:+")
    lines = [f"{m.what} over each attention's runs (mean ± sample std, 95% CI of the mean, Student's t), and "
             f"minus {reference}'s over matching seeds ({'positive' if m.higher_is_better else 'negative'}: "
             f"{m.better.format(ref=reference)}).", "",
             f"| attention | runs | {m.label} | 95% CI | pairs | Δ {m.label} | Δ 95% CI | verdict |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r[m.key] is None:
            continue
        low, high = r[m.key + "_ci_low"], r[m.key + "_ci_high"]
        ci = BLANK if low is None else f"[{m.fmt.format(low)}, {m.fmt.format(high)}]"
        low, high = r[m.key + "_diff_ci_low"], r[m.key + "_diff_ci_high"]
        diff_ci = BLANK if low is None else f"[{diff_fmt.format(low)}, {diff_fmt.format(high)}]"
        lines.append(f"| {r['attention']} | {r[m.key + '_runs']} | {cell(r, m)} | {ci} | "
                     f"{num(r[m.key + '_pairs'], '{}')} | {num(r[m.key + '_diff'], diff_fmt)} | {diff_ci} | "
                     f"{r[m.key + '_verdict'] or BLANK} |")
    return "\n".join(lines) + "\n"


def paired_markdown(rows: Sequence[dict[str, Any]], references: dict[str, str]) -> str:
    """One paired table per metric that has a reference (metric key -> reference, as `paired` returns)."""
    return "\n".join(paired_table(rows, m, references[m.key]) for m in METRICS if m.key in references)
