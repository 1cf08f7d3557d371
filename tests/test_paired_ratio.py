"""The A/B benchmarks' paired ratio: per-round ratios combined in log space, with a 95 % interval (pure logic)."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from benchmarks.alternating import paired_ratio
from benchmarks.text_sentences import sentences
from benchmarks.wide import Cell, spread_sentences, summarise


def test_a_constant_ratio_is_exact_and_certain() -> None:
    old = [250.0, 300.0, 220.0, 280.0]  # the machine drifts between rounds
    paired = paired_ratio([x * 0.97 for x in old], old)
    assert paired.ratio == pytest.approx(0.97)
    assert paired.low == pytest.approx(0.97) and paired.high == pytest.approx(0.97)
    assert paired.rounds == 4


def test_the_interval_is_students_t_on_the_log_ratios() -> None:
    new, old = [105.0, 96.0, 101.0], [100.0, 100.0, 100.0]
    logs = [math.log(n / o) for n, o in zip(new, old, strict=True)]
    half = 4.303 * statistics.stdev(logs) / math.sqrt(3)  # t(0.975, 2 degrees of freedom)
    paired = paired_ratio(new, old)
    assert paired.ratio == pytest.approx(math.exp(statistics.fmean(logs)))
    assert paired.low == pytest.approx(math.exp(statistics.fmean(logs) - half))
    assert paired.high == pytest.approx(math.exp(statistics.fmean(logs) + half))
    assert paired.low < 1.0 < paired.high  # a noisy +0.6 % is not told from no change
    assert "3 rounds" in paired.describe()


def test_one_round_has_no_interval_and_mismatched_rounds_are_refused() -> None:
    one = paired_ratio([110.0], [100.0])
    assert one.ratio == pytest.approx(1.1) and math.isnan(one.low) and math.isnan(one.high)
    with pytest.raises(ValueError):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="no round"):
        paired_ratio([0.0], [100.0])  # a round that answered nothing says nothing


def test_the_wide_benchmark_pairs_cells_of_the_same_round() -> None:
    cells = [
        Cell("predict", "onnxpool", 8, 0, 300.0, 1.0, 2.0, 0, 6.0),
        Cell("predict", "main", 8, 0, 200.0, 1.0, 2.0, 0, 9.0),
        Cell("predict", "main", 8, 1, 400.0, 1.0, 2.0, 0, 4.5),
        Cell("predict", "onnxpool", 8, 1, 600.0, 1.0, 2.0, 0, 3.0),
    ]
    rows = {name: rows[0] for name, rows in summarise(cells)["predict"].items()}
    assert rows["onnxpool"]["vs_main_paired"]["ratio"] == pytest.approx(1.5)  # 1.5x in each round
    assert rows["main"]["vs_main_paired"] is None


def test_the_short_sentences_are_the_same_set_spread_out() -> None:
    spread, fixed = spread_sentences(), sentences()
    assert sorted(spread) == sorted(fixed) and spread != fixed
    long_at = [i for i, text in enumerate(spread) if len(text.split()) >= 40]
    assert max(b - a for a, b in itertools.pairwise(long_at)) < 40  # no window without one
