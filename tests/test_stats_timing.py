"""Tests for the timing-gate statistics in pytest_kopt.stats: quantiles, the median's relative standard error, the
adaptive stopping rule, bootstrap CIs, ``describe`` and the roofline floor."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from pytest_kopt.stats import (FLOOR_HEADROOM, MEDIAN_SE_FACTOR, Distribution, bootstrap_median_ci,
                               bootstrap_ratio_ci, describe, median_rse, quantile, roofline_floor_ms, should_stop,
                               summarize)

#: Median 1.5, MAD 0.5: median_rse = 1.2533*1.4826*0.5/(1.5*sqrt(n)), about 0.29 for n = 10; never converges at 0.5%.
NOISY = [1.0, 2.0] * 5
#: MAD 0: median_rse 0, converged as soon as the other conditions allow.
STEADY = [1.0] * 10


# -- quantile ------------------------------------------------------------------------------------------------------

def test_constants():
    assert (MEDIAN_SE_FACTOR, FLOOR_HEADROOM) == (1.2533, 1.25)


@pytest.mark.parametrize(("q", "expected"), [
    (0.0, 1.0),     # the minimum
    (0.25, 1.75),   # pos 0.75: 1 + (2 - 1) * 0.75
    (0.5, 2.5),     # pos 1.5: halfway between 2 and 3
    (0.75, 3.25),   # pos 2.25: 3 + (4 - 3) * 0.25
    (1.0, 4.0),     # the maximum
])
def test_quantile_interpolates_between_order_statistics(q, expected):
    assert quantile([4.0, 1.0, 3.0, 2.0], q) == expected


def test_quantile_uneven_gaps():
    # sorted 10 20 40 80 160; q=0.6 -> pos 2.4 -> 40 + (80 - 40) * 0.4 = 56
    assert quantile([160.0, 10.0, 80.0, 20.0, 40.0], 0.6) == pytest.approx(56.0, rel=1e-15)


@pytest.mark.parametrize("q", [0.0, 0.1, 0.3, 0.5, 0.9, 1.0])
def test_quantile_matches_numpy_default_method(q):
    xs = [3.0, 0.5, 7.25, 1.5, 9.0, 2.0, 4.5]
    assert quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)), rel=1e-15)


@pytest.mark.parametrize("q", [0.0, 0.5, 1.0])
def test_quantile_single_sample(q):
    assert quantile([7.5], q) == 7.5


def test_quantile_empty_raises():
    with pytest.raises(ValueError, match="no samples"):
        quantile([], 0.5)


def test_quantile_does_not_reorder_the_callers_list():
    xs = [3.0, 1.0, 2.0]
    quantile(xs, 0.5)
    assert xs == [3.0, 1.0, 2.0]


# -- median_rse ----------------------------------------------------------------------------------------------------

def test_median_rse_by_hand():
    # sorted 1 2 3 4 10 -> median 3; |x - 3| = 2 1 0 1 7 -> MAD 1
    expected = 1.2533 * 1.4826 * 1.0 / (3.0 * math.sqrt(5))  # 0.2769955...
    assert median_rse([10.0, 1.0, 3.0, 2.0, 4.0]) == pytest.approx(expected, rel=1e-12)
    assert median_rse([10.0, 1.0, 3.0, 2.0, 4.0]) == pytest.approx(0.2769955, rel=1e-6)


def test_median_rse_even_count():
    # median 1.5, MAD 0.5, n = 10
    assert median_rse(NOISY) == pytest.approx(1.2533 * 1.4826 * 0.5 / (1.5 * math.sqrt(10)), rel=1e-12)


def test_median_rse_shrinks_with_sqrt_n():
    # the same spread with four times the samples: half the standard error
    assert median_rse([1.0, 2.0] * 20) == pytest.approx(median_rse(NOISY) / 2, rel=1e-12)


def test_median_rse_ignores_one_outlier():
    # MAD is robust: replacing the largest sample by a huge one leaves median and MAD unchanged
    assert median_rse([1.0, 2.0, 3.0, 4.0, 1e6]) == median_rse([1.0, 2.0, 3.0, 4.0, 5.0])


def test_median_rse_constant_samples_is_zero():
    assert median_rse(STEADY) == 0.0


@pytest.mark.parametrize("samples", [[], [1.0]])
def test_median_rse_needs_two_samples(samples):
    assert median_rse(samples) == math.inf


def test_median_rse_non_positive_median_is_inf():
    assert median_rse([-1.0, 0.0, 1.0]) == math.inf


# -- should_stop ---------------------------------------------------------------------------------------------------

def test_should_stop_none_below_min_samples_even_past_budget():
    assert should_stop(STEADY[:9], elapsed_s=100.0) is None
    assert should_stop(NOISY[:9], elapsed_s=100.0) is None


def test_should_stop_converged():
    assert should_stop(STEADY, elapsed_s=0.0) == "converged"


def test_should_stop_converged_needs_rse_strictly_below_target():
    rse = median_rse(NOISY)
    assert should_stop(NOISY, elapsed_s=0.0, target_rse=rse * 1.01) == "converged"
    assert should_stop(NOISY, elapsed_s=0.0, target_rse=rse) is None


def test_should_stop_min_time_blocks_convergence():
    assert should_stop(STEADY, elapsed_s=0.5, min_time_s=1.0) is None
    assert should_stop(STEADY, elapsed_s=1.0, min_time_s=1.0) == "converged"


def test_should_stop_budget_without_convergence():
    assert should_stop(NOISY, elapsed_s=1.99) is None
    assert should_stop(NOISY, elapsed_s=2.0) == "budget"
    assert should_stop(NOISY, elapsed_s=5.0, budget_s=5.0) == "budget"
    assert should_stop(NOISY, elapsed_s=4.9, budget_s=5.0) is None


def test_should_stop_budget_caps_min_time():
    # converged statistically but min_time_s not reached: the budget still ends the measurement
    assert should_stop(STEADY, elapsed_s=2.5, min_time_s=3.0, budget_s=2.0) == "budget"


def test_should_stop_max_samples():
    assert should_stop([1.0, 2.0] * 1000, elapsed_s=0.0) == "max_samples"
    # 1999 samples, median 1.5, MAD 0.5: rse about 0.014, not converged
    assert should_stop([1.0, 2.0] * 999 + [1.5], elapsed_s=0.0) is None
    assert should_stop(NOISY * 2, elapsed_s=0.0, max_samples=20) == "max_samples"
    assert should_stop(NOISY * 2, elapsed_s=0.0, max_samples=21) is None


def test_should_stop_custom_min_samples():
    assert should_stop(STEADY[:3], elapsed_s=0.0, min_samples=3) == "converged"
    assert should_stop(STEADY[:3], elapsed_s=0.0, min_samples=4) is None


# -- bootstrap_median_ci -------------------------------------------------------------------------------------------

SAMPLES = [1.00, 1.02, 0.98, 1.05, 0.97, 1.01, 1.03, 0.99, 1.10, 0.95, 1.00, 1.04]


def test_bootstrap_median_ci_deterministic_for_a_seed():
    # few resamples of many distinct values: an unseeded bootstrap would give a different interval each call
    xs = [1.0 + 0.001 * ((i * 37) % 101) for i in range(41)]
    assert bootstrap_median_ci(xs, n_boot=30, seed=3) == bootstrap_median_ci(xs, n_boot=30, seed=3)
    assert bootstrap_median_ci(xs, n_boot=30) == bootstrap_median_ci(list(xs), n_boot=30)


def test_bootstrap_median_ci_seed_is_used():
    runs = {bootstrap_median_ci(SAMPLES, n_boot=200, seed=s) for s in range(5)}
    assert len(runs) > 1


def test_bootstrap_median_ci_contains_the_median():
    lo, hi = bootstrap_median_ci(SAMPLES)
    assert isinstance(lo, float) and isinstance(hi, float)
    assert min(SAMPLES) <= lo <= statistics.median(SAMPLES) <= hi <= max(SAMPLES)
    assert lo < hi


def test_bootstrap_median_ci_narrower_at_lower_level():
    lo95, hi95 = bootstrap_median_ci(SAMPLES, level=0.95)
    lo50, hi50 = bootstrap_median_ci(SAMPLES, level=0.50)
    assert lo95 <= lo50 <= hi50 <= hi95
    assert hi50 - lo50 < hi95 - lo95


@pytest.mark.parametrize(("level", "expected"), [(0.90, (1.0, 5.0)), (0.80, (2.0, 4.0))])
def test_bootstrap_median_ci_percentiles_by_hand(level, expected):
    # resampling 1..5, the median is the 3rd of 5 draws: P(median = 1) = P(>= 3 of 5 draws are 1) = 0.05792 and
    # P(median <= 2) = 0.31744 (binomial, p = 0.2 and 0.4); 5 and 4 likewise by symmetry. So the 5% quantile of
    # the bootstrap medians is 1 and the 10% quantile 2 (20000 resamples keep the empirical 5.8% well above 5%).
    assert bootstrap_median_ci([3.0, 1.0, 4.0, 5.0, 2.0], level=level, n_boot=20000) == expected


def test_bootstrap_median_ci_constant_samples():
    assert bootstrap_median_ci([2.5] * 8) == (2.5, 2.5)


def test_bootstrap_median_ci_empty_raises():
    with pytest.raises(ValueError, match="no samples"):
        bootstrap_median_ci([])


# -- bootstrap_ratio_ci --------------------------------------------------------------------------------------------

def test_bootstrap_ratio_exact_ratio_of_medians():
    ratio, lo, hi = bootstrap_ratio_ci([6.0, 2.0, 4.0, 5.0], [1.0, 3.0, 2.0])
    assert ratio == 4.5 / 2.0  # median 4.5 over median 2
    assert lo <= ratio <= hi


def test_bootstrap_ratio_ci_brackets_the_ratio():
    den = [x * 0.5 for x in SAMPLES]
    ratio, lo, hi = bootstrap_ratio_ci(SAMPLES, den)
    assert ratio == pytest.approx(2.0, rel=1e-12)
    assert lo <= ratio <= hi
    assert lo < hi


def test_bootstrap_ratio_ci_deterministic_for_a_seed():
    den = [x * 0.9 + 0.01 * i for i, x in enumerate(SAMPLES)]
    assert bootstrap_ratio_ci(SAMPLES, den, seed=7) == bootstrap_ratio_ci(SAMPLES, den, seed=7)


def test_bootstrap_ratio_ci_separated_distributions_exclude_one():
    rng = np.random.default_rng(1)
    slow = (10.0 + rng.normal(0.0, 0.3, 50)).tolist()
    fast = (5.0 + rng.normal(0.0, 0.3, 50)).tolist()
    ratio, lo, hi = bootstrap_ratio_ci(slow, fast)  # speedup of fast over slow, about 2
    assert 1.0 < lo <= ratio <= hi
    assert ratio == pytest.approx(float(np.median(slow) / np.median(fast)), rel=1e-15)
    inv, ilo, ihi = bootstrap_ratio_ci(fast, slow)
    assert ilo <= inv <= ihi < 1.0


def test_bootstrap_ratio_ci_overlapping_distributions_include_one():
    rng = np.random.default_rng(2)
    a = (5.0 + rng.normal(0.0, 0.5, 40)).tolist()
    b = (5.0 + rng.normal(0.0, 0.5, 40)).tolist()
    _, lo, hi = bootstrap_ratio_ci(a, b)
    assert lo < 1.0 < hi


# -- describe ------------------------------------------------------------------------------------------------------

def test_describe_fields_match_the_separate_computations():
    d = describe(SAMPLES)
    s = summarize(SAMPLES)
    lo, hi = bootstrap_median_ci(SAMPLES)
    assert isinstance(d, Distribution)
    assert (d.n, d.median_ms, d.mean_ms, d.min_ms, d.max_ms) == (12, s.median_ms, s.mean_ms, 0.95, 1.10)
    assert d.median_ms == statistics.median(SAMPLES)
    assert d.p10_ms == quantile(SAMPLES, 0.10)
    assert d.p90_ms == quantile(SAMPLES, 0.90)
    assert d.iqr_ms == quantile(SAMPLES, 0.75) - quantile(SAMPLES, 0.25)
    assert (d.robust_cv, d.stability) == (s.robust_cv, s.stability)
    assert d.median_rse == median_rse(SAMPLES)
    assert (d.ci95_low_ms, d.ci95_high_ms) == (lo, hi)


def test_describe_by_hand():
    # sorted 1..10: median 5.5, p10 at pos 0.9 -> 1.9, p90 at pos 8.1 -> 9.1, IQR 7.75 - 3.25 = 4.5; MAD 2.5
    d = describe([float(x) for x in (7, 2, 9, 1, 10, 4, 3, 8, 6, 5)])
    assert d.median_ms == 5.5
    assert d.p10_ms == pytest.approx(1.9, rel=1e-12)
    assert d.p90_ms == pytest.approx(9.1, rel=1e-12)
    assert d.iqr_ms == pytest.approx(4.5, rel=1e-12)
    assert d.robust_cv == pytest.approx(1.4826 * 2.5 / 5.5, rel=1e-12)
    assert d.stability == "unstable"
    assert d.median_rse == pytest.approx(1.2533 * 1.4826 * 2.5 / (5.5 * math.sqrt(10)), rel=1e-12)


def test_describe_empty_raises():
    with pytest.raises(ValueError):
        describe([])


# -- roofline_floor_ms ---------------------------------------------------------------------------------------------

def test_roofline_flops_term():
    # 2e12 FLOP / (1e15 FLOP/s * 1.25) = 1.6e-3 s = 1.6 ms
    assert roofline_floor_ms(2e12, None, 1e15, None) == pytest.approx(1.6, rel=1e-12)


def test_roofline_bytes_term_wins_when_larger():
    # flops: 1.6 ms; bytes: 1e10 B / (2e12 B/s * 1.25) = 4e-3 s = 4 ms
    assert roofline_floor_ms(2e12, 1e10, 1e15, 2e12) == pytest.approx(4.0, rel=1e-12)


def test_roofline_flops_term_wins_when_larger():
    # bytes: 1e9 / 2.5e12 = 0.4 ms < 1.6 ms
    assert roofline_floor_ms(2e12, 1e9, 1e15, 2e12) == pytest.approx(1.6, rel=1e-12)


@pytest.mark.parametrize("args", [
    (None, None, None, None),
    (2e12, None, None, 2e12),     # flops without a FLOP/s peak
    (None, 1e9, 1e15, None),      # bytes without a bandwidth peak
    (0.0, 0.0, 1e15, 2e12),
])
def test_roofline_none_when_nothing_known(args):
    assert roofline_floor_ms(*args) is None


def test_roofline_zero_flop_workload_uses_bytes_only():
    # a transpose: 0 FLOP; 5e9 B / (4e12 B/s * 1.25) = 1e-3 s = 1 ms
    assert roofline_floor_ms(0.0, 5e9, 1e15, 4e12) == pytest.approx(1.0, rel=1e-12)
    assert roofline_floor_ms(0.0, 5e9, None, 4e12) == pytest.approx(1.0, rel=1e-12)


# -- the timing basis (pytest_kopt.gates.timing) ------------------------------------------------------------------

def _party(events: list[float], spans_us: list[float] | None, **cupti) -> dict:
    c = dict(cupti)
    if spans_us is not None:
        c["spans_us"] = spans_us
    return {"event_ms": events, "method": "events", "cupti": c or None}


def _ctx(method: str):
    from types import SimpleNamespace

    return SimpleNamespace(settings=SimpleNamespace(timing_method=method))


def test_the_basis_is_cupti_for_every_party_or_events_for_all():
    """Under cupti the kernel, its reference and a PR baseline are all read from their CUPTI spans (ms), so no ratio
    mixes two clocks; one party without spans puts all of them on events, saying which and why; under events the
    spans are ignored."""
    from pytest_kopt.gates.timing import timing_basis

    k, r, b = _party([0.012, 0.013], [9.0, 9.5]), _party([0.030], [28.0]), _party([0.02], [18.0])
    got = timing_basis(_ctx("cupti"), k, r, b)
    assert got["basis"] == "cupti" and got["kernel"] == pytest.approx([0.009, 0.0095], rel=1e-12)
    assert got["reference"] == pytest.approx([0.028]) and got["baseline"] == pytest.approx([0.018])
    assert got["note"] is None
    r_bad = _party([0.030], None, error="the profiler delivered no CUDA records")
    got = timing_basis(_ctx("cupti"), k, r_bad, b)
    assert got["basis"] == "events" and got["kernel"] == [0.012, 0.013] and got["baseline"] == [0.02]
    assert "reference (the profiler delivered no CUDA records)" in got["note"]
    assert timing_basis(_ctx("events"), k, r)["basis"] == "events"


def test_a_kernel_that_launches_nothing_is_never_timed_by_events_instead():
    """Every profiled call empty: the cupti basis with no samples (the gate fails it), not a fall back to the
    events, whose median of an empty call is the event pair's own noise."""
    from pytest_kopt.gates.timing import timing_basis

    k = _party([0.002, 0.002], [], empty_calls=50, calls=0, error="no kernel of the call was recorded")
    got = timing_basis(_ctx("cupti"), k, _party([0.03], [28.0]))
    assert got["basis"] == "cupti" and got["kernel"] == [] and "no GPU work" in got["note"]


def test_cupti_suspects_name_skipped_and_varying_calls():
    from pytest_kopt.gates.timing import cupti_suspects

    assert cupti_suspects({"calls": 50, "empty_calls": 0, "launch_sets": [{"kernels": ["k"], "calls": 50}]}) == []
    (empty,) = cupti_suspects({"calls": 25, "empty_calls": 25, "launch_sets": [{"kernels": ["k"], "calls": 25}]})
    assert empty[0].startswith("25 of 50 profiled calls launched no GPU work")
    (vary,) = cupti_suspects({"calls": 30, "empty_calls": 0,
                              "launch_sets": [{"kernels": ["k"], "calls": 20}, {"kernels": ["extra", "k"], "calls": 10}]})
    assert "different kernels from call to call (k in 20 call(s); extra, k in 10 call(s))" in vary[0]
    assert "--kopt-timing events" in vary[1]


def test_a_short_kernels_spans_need_three_batches_before_they_converge() -> None:
    """Kernel-only sampling (child/cupti.cupti_stop): 50 calls of an 11.7 µs kernel on a 32 ns clock whose median's
    standard error reads under the 0.25% target within the batch still take a second and third batch (on the H200
    the medians of single batches spread over 1.36%); a 2.3 ms kernel's converge at once; the time budget and the
    sample cap still end a short kernel's sampling."""
    from pytest_kopt.child.cupti import CUPTI, cupti_stop

    ticks = [0, 0, 0, 1, 1, 1, 2, -1, -2, 4]
    spans = [11.7 + 0.032 * ticks[i % len(ticks)] for i in range(50)]
    assert cupti_stop(spans, 0.1, 1) is None
    assert cupti_stop(spans, 0.1, 2) is None
    assert cupti_stop(spans, 0.1, 3) == "converged"
    assert cupti_stop([x * 200 for x in spans], 0.1, 1) == "converged"
    assert cupti_stop(spans, CUPTI["budget_s"], 1) == "budget"
    assert cupti_stop(spans * 20, 0.1, 1) == "max_samples"
    assert cupti_stop(spans[:10], 0.1, 3) is None  # under min_samples
