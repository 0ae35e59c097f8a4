"""Tests for pytest_kopt.stats: median, MAD, robust CV = 1.4826*MAD/median and SKILL.md's stability classes."""

from __future__ import annotations

import pytest

from pytest_kopt.stats import BORDERLINE_CV, MAD_TO_SIGMA, STABLE_CV, TimingStats, stability_class, summarize


def test_constants():
    assert (STABLE_CV, BORDERLINE_CV, MAD_TO_SIGMA) == (0.05, 0.10, 1.4826)


def test_summarize_odd_count():
    # sorted: 1.0 1.0 1.1 1.2 5.0 -> median 1.1; |x - 1.1|: 0.1 0.1 0.0 0.1 3.9 -> MAD 0.1 (float: 0.1000...009)
    s = summarize([1.2, 1.0, 5.0, 1.1, 1.0])
    assert s.n == 5
    assert s.median_ms == 1.1
    assert s.mean_ms == pytest.approx(9.3 / 5, rel=1e-15)
    assert s.min_ms == 1.0
    assert s.max_ms == 5.0
    assert s.mad_ms == pytest.approx(0.1, rel=1e-12)
    assert s.robust_cv == pytest.approx(1.4826 * 0.1 / 1.1, rel=1e-12)  # 0.134782
    assert s.stability == "unstable"


def test_summarize_even_count_uses_mean_of_middle_pair():
    # sorted: 2 4 6 8 -> median 5; deviations 3 1 1 3 -> MAD 2; CV = 1.4826*2/5
    s = summarize([8.0, 2.0, 6.0, 4.0])
    assert s == TimingStats(n=4, median_ms=5.0, mean_ms=5.0, min_ms=2.0, max_ms=8.0, mad_ms=2.0,
                            robust_cv=1.4826 * 2.0 / 5.0, stability="unstable")


def test_summarize_outlier_does_not_move_the_robust_cv():
    # sorted 1.9375 2 2 2.0625 100 -> median 2.0; deviations sorted 0 0 0.0625 0.0625 98 -> MAD 0.0625
    s = summarize([2.0, 2.0625, 1.9375, 2.0, 100.0])
    assert s.median_ms == 2.0
    assert s.mad_ms == 0.0625
    assert s.robust_cv == 1.4826 * 0.0625 / 2.0  # 0.04633125
    assert s.stability == "stable"
    assert s.max_ms == 100.0


def test_summarize_borderline():
    # median 1.0, MAD 0.0625 -> CV 0.0926625
    s = summarize([0.9375, 1.0, 1.0625])
    assert s.mad_ms == 0.0625
    assert s.robust_cv == 1.4826 * 0.0625
    assert s.stability == "borderline"


def test_summarize_constant_samples():
    s = summarize([0.5, 0.5, 0.5])
    assert (s.median_ms, s.mad_ms, s.robust_cv, s.stability) == (0.5, 0.0, 0.0, "stable")


def test_summarize_single_sample():
    s = summarize([3.0])
    assert (s.n, s.median_ms, s.mean_ms, s.min_ms, s.max_ms, s.mad_ms, s.robust_cv) == (1, 3.0, 3.0, 3.0, 3.0, 0.0, 0.0)


@pytest.mark.parametrize("cv, expected", [
    (0.0, "stable"),
    (0.049, "stable"),
    (0.05, "stable"),
    (0.0500001, "borderline"),
    (0.07, "borderline"),
    (0.10, "borderline"),
    (0.1000001, "unstable"),
    (0.5, "unstable"),
    (float("inf"), "unstable"),
])
def test_stability_class_boundaries(cv, expected):
    assert stability_class(cv) == expected


def test_summarize_empty_raises():
    with pytest.raises(ValueError, match="no timing samples"):
        summarize([])


@pytest.mark.parametrize("samples, shown", [([0.0, 0.0, 1.0], "0.0"), ([-1.0], "-1.0"), ([-2.0, 0.0], "-1.0")])
def test_summarize_non_positive_median_raises(samples, shown):
    with pytest.raises(ValueError, match=f"non-positive median {shown} ms"):
        summarize(samples)


@pytest.mark.parametrize(("rse", "expected"), [
    (0.0, "stable"),
    (0.0198, "stable"),       # 0.0198 * sqrt(10) / 1.2533 = 0.04996 <= 0.05
    (0.0199, "borderline"),   # 0.05021
    (0.0396, "borderline"),   # 0.09992
    (0.0397, "unstable"),     # 0.10017
])
def test_graph_stability_is_judged_on_the_medians_rse(rse, expected):
    """Graph samples are differences of two replays; their stability class comes from the median's RSE, carried
    from SKILL.md's CV thresholds at 10 samples (2% / 4%)."""
    from pytest_kopt.stats import stability_class_rse

    assert stability_class_rse(rse) == expected
    assert stability_class_rse(rse / 2, min_samples=40) == expected  # sqrt(40) = 2 sqrt(10)
