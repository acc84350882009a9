"""lit_attn.tools.stats against values computed by hand (t quantiles from tables)."""

from __future__ import annotations

import math

import pytest

from lit_attn.tools import stats


def test_t_quantiles():
    assert stats.t_quantile(1) == pytest.approx(12.706205, abs=1e-6)
    assert stats.t_quantile(2) == pytest.approx(4.302653, abs=1e-6)
    assert stats.t_quantile(4) == pytest.approx(2.776445, abs=1e-6)
    assert stats.t_quantile(2, level=0.9) == pytest.approx(2.919986, abs=1e-6)


def test_summary_of_three():
    s = stats.summarize([1.0, 2.0, 3.0])
    assert (s.n, s.mean, s.std) == (3, 2.0, 1.0)
    # 2 ± t(0.975, 2) * 1 / sqrt(3) = 2 ± 4.302653 / 1.732051
    assert s.ci == pytest.approx((2 - 2.484138, 2 + 2.484138), abs=1e-6)


def test_summary_of_five():
    s = stats.summarize([2.0, 4.0, 4.0, 5.0, 5.0])  # mean 4, squared deviations 4+0+0+1+1 = 6, var 6/4
    assert s.mean == 4.0 and s.std == pytest.approx(math.sqrt(1.5))
    half = 2.776445 * math.sqrt(1.5) / math.sqrt(5)
    assert s.ci == pytest.approx((4 - half, 4 + half), abs=1e-6)


def test_one_value_has_no_spread_and_none_has_no_mean():
    assert stats.summarize([2.5]) == stats.Summary(1, 2.5, None, None)
    assert stats.summarize([]) == stats.Summary(0, None, None, None)
    assert stats.summarize([3.0, 3.0]) == stats.Summary(2, 3.0, 0.0, (3.0, 3.0))


def test_paired_difference_uses_matching_seeds_only():
    values = {1: 1.0, 2: 2.0, 3: 3.5, 7: 0.0}  # seed 7 has no reference run
    reference = {3: 4.0, 1: 2.0, 2: 3.0, 4: 9.0}  # seed 4 has no run to compare
    d = stats.paired_difference(values, reference)
    # differences -1, -1, -0.5: mean -5/6, std sqrt(1/12), half-width 4.302653 * sqrt(1/12) / sqrt(3) = 4.302653 / 6
    assert d.n == 3 and d.mean == pytest.approx(-5 / 6)
    assert d.ci == pytest.approx((-5 / 6 - 0.717109, -5 / 6 + 0.717109), abs=1e-6)
    assert d.verdict == "better"


def test_verdicts():
    ref = {1: 2.0, 2: 2.0, 3: 2.0}
    assert stats.paired_difference({1: 2.1, 2: 2.2, 3: 2.15}, ref).verdict == "worse"
    assert stats.paired_difference({1: 1.9, 2: 2.1, 3: 2.0}, ref).verdict == "indistinguishable at this budget"
    assert stats.paired_difference({1: 2.0, 2: 2.0, 3: 2.0}, ref).verdict == "indistinguishable at this budget"
    one = stats.paired_difference({1: 1.0, 5: 1.0}, ref)
    assert (one.n, one.mean, one.ci, one.verdict) == (1, -1.0, None, "n/a (fewer than 2 paired seeds)")
    none = stats.paired_difference({5: 1.0}, ref)
    assert (none.n, none.mean, none.verdict) == (0, None, "n/a (fewer than 2 paired seeds)")
    assert stats.paired_difference({1: math.nan, 2: 2.0, 3: 2.0}, ref).verdict == "n/a (a loss is not finite)"


def test_median():
    assert stats.median([3.0, 1.0, 2.0]) == 2.0
    assert stats.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert stats.median([]) is None
