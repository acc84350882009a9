"""benchmarks.bench_variants: its variant syntax, the rotating order and the report's arithmetic."""

from __future__ import annotations

import pytest
from helpers import ROOT  # noqa: F401  (puts the repository root on sys.path)

from benchmarks.bench_variants import parse_variant, rotated, summarize


@pytest.mark.parametrize(("text", "expected"), [
    ("mha=", ("mha", [])),
    ('swa=--model.attention_options {"window": 16, "sinks": 4}',
     ("swa", ["--model.attention_options", '{"window": 16, "sinks": 4}'])),
    ('w=--model.attention_options={"window": 16} --model.n_layer=2',
     ("w", ['--model.attention_options={"window": 16}', "--model.n_layer=2"])),
    ("SL=--model.layer_pattern SL  --model.local_window 64 --model.qk_norm",
     ("SL", ["--model.layer_pattern", "SL", "--model.local_window", "64", "--model.qk_norm"])),
])
def test_variant_flags_split_before_each_flag(text, expected):
    assert parse_variant(text) == expected


@pytest.mark.parametrize("text", ["mha", "=--model.lr=1", "a b=--x", "x=model.lr=1"])
def test_malformed_variant_is_refused(text):
    with pytest.raises(ValueError, match="--variant takes NAME=FLAGS"):
        parse_variant(text)


def test_every_variant_leads_a_round_in_turn():
    names = ["a", "b", "c"]
    assert [rotated(names, i) for i in range(4)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"],
                                                     ["a", "b", "c"]]


def test_report_pairs_each_repetition_with_the_reference():
    # 2 repetitions of 3 steps; per-repetition medians: a 0.010, 0.020; b 0.015, 0.020.
    times = {"a": [0.010, 0.009, 0.011, 0.020, 0.030, 0.010], "b": [0.015, 0.016, 0.014, 0.020, 0.020, 0.021]}
    lines = summarize(times, steps=3, repeats=2)
    a, b = lines[1].split(), lines[2].split()
    assert a[:2] == ["a", "15.00"] and a[2:4] == ["[10.00,", "20.00]"] and a[4] == "1.000"
    # b's ratios 1.5 and 1.0: median 1.25, min 1.0, max 1.5
    assert b[:2] == ["b", "17.50"] and b[4:] == ["1.250", "[1.000,", "1.500]"]
