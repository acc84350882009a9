"""Time to a target validation loss and the validation loss at a training-time budget (`--target-loss`,
`--at-time` of `lit-attn compare` and `lit-attn cost-card`), read off each run's validation curve, with their
statistics over seeds and paired with a reference's.

The time is the run's training clock (val/train_time, run_record.CurvePoint.train_time): seconds from the start of
the first training batch, the first batches' warm-up (compilation, first allocations) included, each validation and
what follows it (samples, checkpoints) excluded. Between the two evaluations that bracket the target or the budget,
loss is taken as linear in that time. Nothing is extrapolated: a run has no value before its first evaluation or
past its last, and a note says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from lit_attn.cli.toolcli import ToolParser
from lit_attn.tools import stats
from lit_attn.tools.run_record import TRAIN_CLOCK_TAG, CurvePoint

TARGET_FLAG, BUDGET_FLAG = "--target-loss", "--at-time"
TIME_KEY, LOSS_KEY = "time_to_target_s", "loss_at_time"  # a row's values (None: see its notes)
TARGET_KEY, BUDGET_KEY = "target_loss", "time_budget_s"  # the flags' values, on each row and in the CSVs
NO_CURVE = "compare.csv holds no validation curve (give the run directories with --runs)"
# A group's statistics of one measure: CSV header suffix -> value (see group_stats)
STAT_SUFFIXES = ("_runs", "_mean", "_std", "_ci_low", "_ci_high", "_pairs", "_diff", "_diff_ci_low",
                 "_diff_ci_high", "_verdict")


class Reading(NamedTuple):
    """A run's value of a measure, or None and why."""

    value: float | None
    why: str | None


def parse_positive(flag: str, text: str | None, what: str) -> float | None:
    """`text` as a finite number > 0 (None stays None); ValueError naming `flag` otherwise."""
    if text is None:
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{flag} takes a finite number > 0 ({what}), got {text!r}")
    return value


def add_flags(p: ToolParser) -> None:
    """--target-loss and --at-time on a tool's parser (compare's, the cost card's); read_flags reads them."""
    p.add_argument(TARGET_FLAG, "--target_loss", dest="target_loss", type=str, default=None, metavar="LOSS",
                   help="also each run's training time (s, warm-up included, validation excluded) to first reach "
                        "this val loss, interpolated between evaluations; 'not reached' where it never does")
    p.add_argument(BUDGET_FLAG, "--at_time", dest="at_time", type=str, default=None, metavar="SECONDS",
                   help="also each run's val loss after this many seconds of training, interpolated between "
                        "evaluations; not extrapolated past a run's last evaluation")


def read_flags(p: ToolParser, args: Any) -> Any:
    """`args` with --target-loss and --at-time as numbers; p.error (one line, exit 2) for a value that is not a
    finite number > 0."""
    try:
        args.target_loss = parse_positive(TARGET_FLAG, args.target_loss, "a val loss in nats/token, e.g. 1.9")
        args.at_time = parse_positive(BUDGET_FLAG, args.at_time, "seconds of training, e.g. 600")
    except ValueError as e:
        p.error(str(e))
    return args


def _clocked(curve: Sequence[CurvePoint]) -> Reading | list[CurvePoint]:
    """The curve's points in step order, or why its times cannot be read."""
    if not curve:
        return Reading(None, "no validation was logged")
    if any(p.train_time is None for p in curve):
        return Reading(None, f"no training clock ({TRAIN_CLOCK_TAG} not logged: a run of an older version)")
    return sorted(curve, key=lambda p: p.step)


def time_to_target(curve: Sequence[CurvePoint], target: float) -> Reading:
    """The training time at which the loss first reaches `target` (<=), interpolated between the last evaluation
    above it and the first at or below it. Reached at the first evaluation (or just after one without a finite
    loss): that evaluation's time, an upper bound, said in `why`."""
    points = _clocked(curve)
    if isinstance(points, Reading):
        return points
    for i, p in enumerate(points):
        if p.loss <= target:
            before = points[i - 1] if i else None
            if before is None or not math.isfinite(before.loss):
                where = "the first evaluation" if before is None else "an evaluation after a non-finite loss"
                return Reading(p.train_time, f"reached by {where} (step {p.step}): the time is an upper bound")
            share = (before.loss - target) / (before.loss - p.loss)
            return Reading(before.train_time + share * (p.train_time - before.train_time), None)
    finite = [p for p in points if math.isfinite(p.loss)]
    lowest = min(finite, key=lambda p: p.loss) if finite else None
    best = "" if lowest is None else f"; lowest {lowest.loss:.4f} at step {lowest.step}, {lowest.train_time:.2f} s"
    return Reading(None, f"not reached in {points[-1].train_time:.2f} s of training{best}")


def loss_at_time(curve: Sequence[CurvePoint], budget: float) -> Reading:
    """The loss after `budget` seconds of training, interpolated between the evaluations before and after it; None
    when the budget lies before the first evaluation or past the last (not extrapolated)."""
    points = _clocked(curve)
    if isinstance(points, Reading):
        return points
    if budget > points[-1].train_time:
        return Reading(None, f"the run's last evaluation is at {points[-1].train_time:.2f} s of training, before "
                             f"the budget: not extrapolated")
    i = next(i for i, p in enumerate(points) if p.train_time >= budget)
    p = points[i]
    if p.train_time == budget:
        return Reading(p.loss, None)
    if i == 0:
        return Reading(None, f"its first evaluation is at {p.train_time:.2f} s of training, after the budget")
    before = points[i - 1]
    share = (budget - before.train_time) / (p.train_time - before.train_time)
    return Reading(before.loss + share * (p.loss - before.loss), None)


class Measure(NamedTuple):
    """What a flag asks of each run: its row key, its headers, how it is read off a curve, its number format."""

    key: str
    setting: float  # the target loss or the budget in seconds
    label: str  # Markdown header
    what: str  # in sentences
    sooner: str  # what a negative difference from the reference means
    count: str  # what a run with a value did
    fmt: str
    read: Callable[[Sequence[CurvePoint], float], Reading]


def measures(target: float | None, budget: float | None) -> list[Measure]:
    """The measures the flags ask for, time to target first."""
    out = []
    if target is not None:
        out.append(Measure(TIME_KEY, target, f"time to {target:g} (s)", f"training time to val loss {target:g} (s)",
                           "reaches it sooner than {ref}", "reached", "{:.2f}", time_to_target))
    if budget is not None:
        out.append(Measure(LOSS_KEY, budget, f"val loss at {budget:g} s", f"val loss at {budget:g} s of training",
                           "lower loss than {ref} at that time", "ran that long", "{:.4f}", loss_at_time))
    return out


def annotate(rows: Sequence[dict[str, Any]], target: float | None, budget: float | None) -> list[Measure]:
    """Set each row's measures (None where it has none, with a note saying why) and the flags' values, in place;
    return the measures. A row without a curve (read from compare.csv) gets NO_CURVE."""
    chosen = measures(target, budget)
    for r in rows:
        r |= {TARGET_KEY: target, BUDGET_KEY: budget} if chosen else {}
        for m in chosen:
            got = m.read(r["curve"], m.setting) if "curve" in r else Reading(None, NO_CURVE)
            r[m.key] = got.value
            if got.why:
                r["notes"].append(f"{m.what.removesuffix(' (s)')}: {got.why}")
    return chosen


def from_rows(rows: Sequence[dict[str, Any]]) -> list[Measure]:
    """The measures `rows` were annotated with."""
    return measures(*(rows[0].get(k) for k in (TARGET_KEY, BUDGET_KEY))) if rows else []


def columns(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, tuple[str, ...], str]]:
    """compare's per-run columns (as run_record.COLUMNS) of the measures `rows` were annotated with."""
    return [(m.label, m.key, (), m.fmt) for m in from_rows(rows)]


def settings(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The flags' values (TARGET_KEY, BUDGET_KEY) `rows` were annotated with: columns of compare.csv and
    stats.csv."""
    keys = {TIME_KEY: TARGET_KEY, LOSS_KEY: BUDGET_KEY}
    return {keys[m.key]: m.setting for m in from_rows(rows)}


def by_seed(runs: Sequence[dict[str, Any]], key: str) -> dict[int, float]:
    """seed -> the runs' `key`; runs without a seed or a value, and seeds held twice, are left out (compare warns
    of those for the final val loss)."""
    seeds = [r["seed"] for r in runs if r.get("seed") is not None and r.get(key) is not None]
    return {r["seed"]: r[key] for r in runs
            if r.get("seed") is not None and r.get(key) is not None and seeds.count(r["seed"]) == 1}


def group_stats(m: Measure, runs: Sequence[dict[str, Any]], reference: Sequence[dict[str, Any]] | None,
                paired: stats.Paired | None = None) -> dict[str, Any]:
    """One group's statistics of `m` as {m.key + suffix: value} (STAT_SUFFIXES, and "_of": its runs). `reference` None:
    the group is the reference (verdict "reference"); `paired` given: used as it is (a group on other data)."""
    s = stats.summarize([r[m.key] for r in runs if r.get(m.key) is not None])
    if paired is None and reference is not None:
        paired = stats.paired_difference(by_seed(runs, m.key), by_seed(reference, m.key))
    d = paired or stats.Paired(None, None, None, "reference")
    values = (s.n, s.mean, s.std, *(s.ci or (None, None)), d.n, d.mean, *(d.ci or (None, None)), d.verdict)
    return {m.key + "_of": len(runs)} | {m.key + suffix: v for suffix, v in zip(STAT_SUFFIXES, values)}


def cell(m: Measure, g: dict[str, Any]) -> str:
    """'12.34 ± 0.56 (2 of 3 reached)': mean ± sample std over the runs with a value, and how many had one."""
    mean, std, n = g[m.key + "_mean"], g[m.key + "_std"], g[m.key + "_runs"]
    number = "" if mean is None else m.fmt.format(mean) + ("" if std is None else " ± " + m.fmt.format(std)) + " "
    return f"{number}({n} of {g[m.key + '_of']} {m.count})"


def markdown(m: Measure, table: Sequence[tuple[str, dict[str, Any]]], key: str, reference: str) -> str:
    """One measure's table: per group (name, group_stats), its value over the runs that have one with the 95% t
    interval, and its difference from the reference's over the seeds where both have one."""
    diff = m.fmt.replace("{:", "{:+")

    def num(value: Any, fmt: str) -> str:
        return "" if value is None else fmt.format(value)

    def interval(low: float | None, high: float | None, fmt: str) -> str:
        return "" if low is None else f"[{fmt.format(low)}, {fmt.format(high)}]"

    lines = [f"{m.what[0].upper() + m.what[1:]}, over each {key}'s runs that have it (warm-up included, evaluation "
             f"excluded, interpolated between evaluations, never extrapolated): mean ± sample std, 95% CI of the "
             f"mean (Student's t); minus {reference}'s over the seeds where both have it (negative: "
             f"{m.sooner.format(ref=reference)}).", "",
             f"| {key} | {m.label} | 95% CI | pairs | Δ {m.label} | Δ 95% CI | verdict |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for name, g in table:
        k = m.key
        lines.append(f"| {name} | {cell(m, g)} | {interval(g[k + '_ci_low'], g[k + '_ci_high'], m.fmt)} | "
                     f"{num(g[k + '_pairs'], '{}')} | {num(g[k + '_diff'], diff)} | "
                     f"{interval(g[k + '_diff_ci_low'], g[k + '_diff_ci_high'], diff)} | {g[k + '_verdict']} |")
    return "\n".join(lines) + "\n"


def csv_headers(chosen: Sequence[Measure]) -> list[str]:
    """The statistics' CSV headers of `chosen`, after the flags' values."""
    keys = {TIME_KEY: TARGET_KEY, LOSS_KEY: BUDGET_KEY}
    return [keys[m.key] for m in chosen] + [m.key + s for m in chosen for s in STAT_SUFFIXES]


def csv_cells(chosen: Sequence[Measure], g: dict[str, Any]) -> list[Any]:
    """A group's cells under csv_headers(chosen); None where nothing could be computed."""
    return [m.setting for m in chosen] + [g.get(m.key + s) for m in chosen for s in STAT_SUFFIXES]


def by_group(groups: dict[str, Sequence[dict[str, Any]]], chosen: Sequence[Measure],
             reference: str | None) -> tuple[str | None, dict[str, dict[str, Any]]]:
    """(the reference, group -> group_stats of every measure in `chosen`): each group paired with `reference`
    (default: the first group)."""
    ref = reference if reference in groups else next(iter(groups), None)
    out: dict[str, dict[str, Any]] = {name: {} for name in groups}
    for m in chosen:
        for name, runs in groups.items():
            out[name] |= group_stats(m, runs, None if name == ref else groups[ref])
    return ref, out


def row_values(run: dict[str, Any], chosen: Sequence[Measure]) -> dict[str, Any]:
    """A group's group_stats values of `chosen` (None where it has none), for the cost card's row."""
    return {m.key + suffix: run.get(m.key + suffix) for m in chosen for suffix in ("_of", *STAT_SUFFIXES)}
