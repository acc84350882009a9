"""Statistics over seeds: mean, sample standard deviation, Student's t confidence intervals of the mean, and the
paired difference of two settings over the seeds they share, with a verdict in words (lower loss is better)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

LEVEL = 0.95
BETTER, WORSE = "better", "worse"
INDISTINGUISHABLE = "indistinguishable at this budget"
TOO_FEW = "n/a (fewer than 2 paired seeds)"
NOT_FINITE = "n/a (a loss is not finite)"


class Summary(NamedTuple):
    """n values: their mean, sample standard deviation and 95% t interval of the mean (None where n is too small)."""

    n: int
    mean: float | None  # None for no values
    std: float | None  # None for fewer than 2 values
    ci: tuple[float, float] | None  # None for fewer than 2 values


class Paired(NamedTuple):
    """A setting minus the reference over matching seeds: n pairs, the mean difference, its 95% t interval."""

    n: int
    mean: float | None
    ci: tuple[float, float] | None
    verdict: str


def t_quantile(df: int, level: float = LEVEL) -> float:
    """The two-sided Student's t critical value: t(1 - (1 - level) / 2, df), e.g. 4.302653 for df=2."""
    from scipy.stats import t

    return float(t.ppf(1 - (1 - level) / 2, df))


def summarize(values: Sequence[float], level: float = LEVEL) -> Summary:
    """Mean, sample standard deviation (n - 1 in the denominator) and the t interval of the mean, n - 1 d.o.f."""
    n = len(values)
    if n == 0:
        return Summary(0, None, None, None)
    mean = math.fsum(values) / n
    if n == 1:
        return Summary(1, mean, None, None)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(n - 1, level) * std / math.sqrt(n)
    return Summary(n, mean, std, (mean - half, mean + half))


def paired_difference(values: Mapping[int, float], reference: Mapping[int, float], level: float = LEVEL) -> Paired:
    """values[seed] - reference[seed] over the seeds both have, summarized, with the verdict on the interval."""
    seeds = sorted(set(values) & set(reference))
    s = summarize([values[k] - reference[k] for k in seeds], level)
    return Paired(s.n, s.mean, s.ci, verdict(s.ci, s.n))


def verdict(ci: tuple[float, float] | None, n: int) -> str:
    """"better" / "worse" where the interval of (setting - reference) loss excludes 0, else "indistinguishable"."""
    if n < 2 or ci is None:
        return TOO_FEW
    lo, hi = ci
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return NOT_FINITE
    if hi < 0:
        return BETTER
    if lo > 0:
        return WORSE
    return INDISTINGUISHABLE


def median(values: Sequence[float]) -> float | None:
    """The median (the mean of the middle two for an even count); None for no values."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return None
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
