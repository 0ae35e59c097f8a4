"""Tests for pytest_kopt.stats: median, MAD, robust CV = 1.4826*MAD/median and SKILL.md's stability classes."""

from __future__ import annotations

import statistics

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


# --- timing samples on a timer's tick grid (stats.grid_tick, stats.median) ----------------------------------------

TICK = 0.032  # µs: the H200's CUPTI timestamps step in 32 ns


def ticked(counts: dict[int, int], tick: float = TICK, seed: int = 1) -> list[float]:
    """Spans as kernel_times computes them from a ticked clock: ``counts`` maps a number of ticks to how many calls
    read it; each span is the difference of two float µs timestamps (ns since a session's start over 1e3) at a
    random start up to 100 s in, so equal spans differ in their last bits as real ones do."""
    import random

    rng = random.Random(seed)
    out = []
    for k, n in counts.items():
        for _ in range(n):
            start_ns = 32 * rng.randrange(100_000_000_000 // 32)
            out.append((start_ns + round(k * tick * 1e3)) / 1e3 - start_ns / 1e3)
    rng.shuffle(out)
    return out


def test_ticked_spans_differ_in_their_last_bits_as_cupti_spans_do():
    spans = ticked({44: 120, 45: 80})
    assert len(set(spans)) > 2 and max(spans) - min(spans) == pytest.approx(TICK, rel=1e-6)


def test_grid_tick_finds_the_timers_step_and_nothing_in_continuous_samples():
    from pytest_kopt.stats import grid_tick

    assert grid_tick(ticked({44: 120, 45: 70, 46: 10})) == pytest.approx(TICK, rel=1e-6)
    assert grid_tick(ticked({44: 120, 46: 80})) == pytest.approx(2 * TICK, rel=1e-6)  # only even steps seen
    assert grid_tick([1.0 + 0.001 * i ** 1.5 for i in range(200)]) is None  # 200 distinct values
    assert grid_tick(ticked({44: 12, 45: 7})) is None  # under 20 samples
    assert grid_tick(ticked({44: 100})) is None  # one value: no step to see
    # a 32 ns step on a 2.7 ms span is 1.2e-5 of it: under TICK_MATTERS, so the plain median stands
    assert grid_tick(ticked({84_000: 100, 84_001: 100})) is None
    # two modes of a kernel, not a clock's neighbouring ticks: the step is over TICK_AT_MOST of the median
    assert grid_tick([1.0] * 51 + [3.0] * 49) is None and grid_tick([1.0] * 90 + [2.0] * 10) is None
    # ticked values among continuous ones: gaps of every size
    assert grid_tick(ticked({44: 100, 45: 50}) + [1.408 + 0.0007 * i ** 1.3 for i in range(50)]) is None


def test_grid_tick_survives_a_far_outlier_in_float32_milliseconds():
    """CUDA-event-like float32 ms on a 32 ns grid and one call preempted 4000 ticks out: the smallest gap's float32
    error, multiplied by 4000 steps, would put the outlier off the grid; the tick is refined over the whole range."""
    import numpy as np

    from pytest_kopt.stats import grid_tick

    f32 = [float(np.float32(k * 3.2e-5)) for k in [44] * 120 + [45] * 70 + [46] * 10 + [4000]]
    assert grid_tick(f32) == pytest.approx(3.2e-5, rel=1e-5)


def test_grouped_median_interpolates_within_the_tick():
    from pytest_kopt.stats import median

    # 200 spans, 125 at 44 ticks, 75 at 45: element 100 is in the 44 class, [43.5, 44.5) ticks; 100 of its 125
    # below the middle: 43.5 + 100/125 = 44.3 ticks (the plain median says 44)
    assert median(ticked({44: 125, 45: 75})) == pytest.approx(44.3 * TICK, rel=1e-7)
    assert statistics.median(ticked({44: 125, 45: 75})) == pytest.approx(44 * TICK, rel=1e-7)


def test_grouped_median_does_not_jump_a_tick_when_the_counts_barely_change():
    """The plain median of 99/101 vs 101/99 calls jumps a whole tick (2.3% of 1.4 µs); the grouped one moves 0.02
    of a tick."""
    from pytest_kopt.stats import median

    a, b = ticked({44: 99, 45: 101}), ticked({44: 101, 45: 99})
    assert statistics.median(a) - statistics.median(b) == pytest.approx(TICK, rel=1e-6)
    assert median(a) == pytest.approx((44.5 + 1 / 101) * TICK, rel=1e-7)
    assert median(b) == pytest.approx((43.5 + 100 / 101) * TICK, rel=1e-7)
    assert (median(a) - median(b)) / TICK == pytest.approx(1 / 101 + 1 / 101, rel=1e-6)


def test_bootstrap_resamples_use_the_same_median():
    """The vectorised medians of the bootstrap agree with :func:`median` row by row, and a ratio's point is the
    ratio of the two medians."""
    import numpy as np

    from pytest_kopt.stats import _medians, bootstrap_ratio_ci, median

    rng = np.random.default_rng(3)
    base = np.asarray(ticked({43: 20, 44: 110, 45: 60, 47: 10}))
    idx = rng.integers(0, base.size, size=(50, base.size))
    assert _medians(base, idx) == pytest.approx([median(list(base[r])) for r in idx], rel=1e-7)
    cont = np.asarray([1.0 + 0.001 * i ** 1.5 for i in range(200)])
    assert _medians(cont, np.arange(200)[None, :])[0] == statistics.median(cont.tolist())
    other = ticked({88: 150, 89: 50})
    ratio, lo, hi = bootstrap_ratio_ci(other, base.tolist())
    assert ratio == pytest.approx(median(other) / median(base.tolist()), rel=1e-12)
    assert lo < ratio < hi


def test_bootstrap_of_ticked_samples_with_a_far_outlier():
    """One call preempted for 1.4 ms among 1.4 µs spans, all on the 32 ns grid (44,000 steps apart): the resamples'
    medians are counted per distinct value, and agree with :func:`median`."""
    import numpy as np

    from pytest_kopt.stats import _medians, bootstrap_median_ci, grid_tick, median

    base = ticked({44: 130, 45: 69, 44_000: 1})
    assert grid_tick(base) == pytest.approx(TICK, rel=1e-6)
    a = np.asarray(base)
    idx = np.random.default_rng(0).integers(0, a.size, size=(40, a.size))
    assert _medians(a, idx) == pytest.approx([median(list(a[r])) for r in idx], rel=1e-7)
    lo, hi = bootstrap_median_ci(base)
    assert 44 * TICK < lo <= median(base) <= hi < 45 * TICK


#: The 14 lowest values of 100 kernel-only spans (µs) of a 64 K-element torch add through cupti-python, with how
#: many calls read each (H200, 2026-12-03, a one-off probe of kernel_times): 32 ns steps, each value up to 1 ns off
#: its step
H200_ADD_64K = {1.248: 1, 1.28: 1, 1.312: 1, 1.344: 5, 1.375: 6, 1.376: 13, 1.377: 4, 1.407: 3, 1.408: 32, 1.409: 2,
                1.44: 17, 1.472: 5, 1.473: 1, 1.504: 3}


def test_grid_of_real_cupti_spans_with_a_nanosecond_of_jitter():
    """The 1 ns jitter is grouped, the tick is 32 ns, and the median is the grouped one: element 47 of 95 is in the
    1.408 group (31 below it, 37 in it): 1.392 + 0.032 * (47.5 - 31) / 37 = 1.40627 µs (the plain median 1.408)."""
    from pytest_kopt.stats import grid, median

    spans = [v for v, n in H200_ADD_64K.items() for _ in range(n)]
    tick, origin = grid(spans)
    assert tick == pytest.approx(0.032, abs=2e-4)
    assert (origin - 1.248) / tick == pytest.approx(round((origin - 1.248) / tick), abs=0.05)
    assert statistics.median(spans) == 1.408
    # within 0.6 ns: the grid is fitted to the groups' means (1.40797 for the 1.408 group), not to round figures
    assert median(spans) == pytest.approx(1.392 + 0.032 * 16.5 / 37, abs=6e-4)


def test_a_two_nanosecond_gap_is_jitter_still():
    """Among 400 spans a sparse group can read 1.633 and 1.635 µs without 1.634 between: that 2 ns gap is over
    TICK_MATTERS of 1.4 µs (1.4 ns), but only 2x the 1 ns ones below it, so it is jitter; the tick is the 30-odd ns
    gaps above."""
    from pytest_kopt.stats import grid

    spans = [v for v, n in H200_ADD_64K.items() for _ in range(n)] + [1.633, 1.635, 1.665]
    tick, _ = grid(spans)
    assert tick == pytest.approx(0.032, abs=2e-4)
