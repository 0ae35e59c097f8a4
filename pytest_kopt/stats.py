"""Timing statistics for the reports: robust CV and SKILL.md's stability classes, bootstrap intervals, geometric
means, quantiles, the roofline floor, through numpy (imported where used: the plugin imports this module and must
not import numpy). The sampling statistics a timing process uses (the grouped median, the stopping rule) are
:mod:`pytest_kopt.child.samples`, re-exported here; they stay in plain Python there, where the candidate's own
process runs them and :mod:`~pytest_kopt.child.sentinels` guards the standard library's entry points they use."""

from __future__ import annotations

import math

import statistics
from dataclasses import dataclass
from typing import Any

#: SKILL.md / upstream: robust CV <= 0.05 is stable, <= 0.10 borderline, above that unstable.
STABLE_CV = 0.05
BORDERLINE_CV = 0.10
from .child.samples import (MAD_TO_SIGMA, MEDIAN_SE_FACTOR, grid, grid_tick, median, median_rse,  # noqa: F401
                            should_stop)


def fmt_ms(x: float) -> str:
    """A duration given in ms, for messages: ``12.34 µs`` below 0.1 ms, else ``1.2345 ms``."""
    return f"{x * 1e3:.2f} µs" if x < 0.1 else f"{x:.4f} ms"


@dataclass(frozen=True, slots=True)
class TimingStats:
    """Summary of timing samples in ms: ``robust_cv`` = 1.4826 * MAD / median (dimensionless)."""

    n: int
    median_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    mad_ms: float
    robust_cv: float
    stability: str


def stability_class(robust_cv: float) -> str:
    """``stable`` (<= 0.05), ``borderline`` (<= 0.10) or ``unstable`` (SKILL.md's thresholds)."""
    if robust_cv <= STABLE_CV:
        return "stable"
    if robust_cv <= BORDERLINE_CV:
        return "borderline"
    return "unstable"


def stability_class_rse(median_rse: float, min_samples: int = 10) -> str:
    """Stability class judged on the median's relative standard error instead of the per-sample robust CV, for the
    graph method, where each sample is the difference of two replays (pairs minus flushes), so its spread is the
    L2 flush's noise, not the kernel's. The thresholds are SKILL.md's 0.05/0.10 robust CV carried to the median's
    RSE at ``min_samples`` (the fewest samples a timing may stop at): RSE = 1.2533 * CV / sqrt(min_samples), i.e.
    2.0% / 4.0% at 10 samples. Returns ``stable``, ``borderline`` or ``unstable``."""
    return stability_class(median_rse * min_samples ** 0.5 / MEDIAN_SE_FACTOR)


def _medians(base: Any, idx: Any) -> Any:
    """The median of each resample ``base[idx[r]]`` (``base``: 1-D array of samples; ``idx``: 2-D array of indices
    into it, one row per resample), vectorised. On ``base``'s grid (:func:`grid`) each is the grouped median on that
    grid, the clock's: it equals :func:`median` of the row wherever the row shows the same grid (a row holding only
    some of the ticks may show a coarser one). Counted per grid point of ``base``, so a far outlier costs one
    column, and the values are classed once, not per resample."""
    import numpy as np

    g = grid(base.tolist())
    if g is None:
        return np.median(base[idx], axis=1)
    tick, origin = g
    steps, inverse = np.unique(np.rint((base - origin) / tick).astype(np.int64), return_inverse=True)
    cls = inverse.reshape(-1)[idx]
    rows, n = idx.shape
    width = steps.size
    counts = np.bincount((cls + width * np.arange(rows)[:, None]).ravel(), minlength=rows * width)
    counts = counts.reshape(rows, width)
    below = np.cumsum(counts, axis=1)
    j = np.argmax(below > n // 2, axis=1)  # the class of each row's element n // 2 (median_grouped's x)
    f = counts[np.arange(rows), j]
    cf = below[np.arange(rows), j] - f
    return origin + tick * (steps[j] - 0.5 + (n / 2 - cf) / f)


def quantile(samples: list[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1), numpy's linear interpolation between order statistics. Raises ValueError on an
    empty list."""
    import numpy as np

    if not samples:
        raise ValueError("no samples")
    return float(np.quantile(np.asarray(samples, dtype=float), q))


def mad_about(samples: list[float], center: float) -> float:
    """The median absolute deviation of ``samples`` about ``center`` (the grouped median: a tick grid's MAD is about
    the median the report shows, not the sample one)."""
    import numpy as np

    return float(np.median(np.abs(np.asarray(samples, dtype=float) - center)))


def summarize(samples_ms: list[float]) -> TimingStats:
    """Summarize samples (ms); the median is :func:`median` (grouped on a tick grid). Raises ValueError on an empty
    list or a non-positive median."""
    if not samples_ms:
        raise ValueError("no timing samples")
    med = median(samples_ms)
    if med <= 0:
        raise ValueError(f"non-positive median {med} ms")
    mad = mad_about(samples_ms, med)
    cv = MAD_TO_SIGMA * mad / med
    return TimingStats(n=len(samples_ms), median_ms=med, mean_ms=statistics.fmean(samples_ms),
                       min_ms=min(samples_ms), max_ms=max(samples_ms), mad_ms=mad, robust_cv=cv,
                       stability=stability_class(cv))


def bootstrap_median_ci(samples: list[float], level: float = 0.95, n_boot: int = 2000,
                        seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the median (ms in, ms out), ``n_boot`` resamples with a fixed
    ``seed`` so the report is reproducible. Raises ValueError on an empty list."""
    import numpy as np

    if not samples:
        raise ValueError("no samples")
    a = np.asarray(samples, dtype=np.float64)
    rng = np.random.default_rng(seed)
    meds = _medians(a, rng.integers(0, a.size, size=(n_boot, a.size)))
    alpha = (1 - level) / 2
    return float(np.quantile(meds, alpha)), float(np.quantile(meds, 1 - alpha))


def bootstrap_ratio_ci(num: list[float], den: list[float], level: float = 0.95, n_boot: int = 2000,
                       seed: int = 0) -> tuple[float, float, float]:
    """median(num) / median(den) (:func:`median`) with a percentile-bootstrap CI, resampling both lists
    independently. Returns (ratio, low, high). A speedup of B over A is ``bootstrap_ratio_ci(times_A, times_B)``.
    Raises ZeroDivisionError when median(den) is 0 (timing samples are positive)."""
    import numpy as np

    a, b = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    rng = np.random.default_rng(seed)
    ra = _medians(a, rng.integers(0, a.size, size=(n_boot, a.size)))
    rb = _medians(b, rng.integers(0, b.size, size=(n_boot, b.size)))
    ratios = ra / rb
    alpha = (1 - level) / 2
    return (median(num) / median(den), float(np.quantile(ratios, alpha)),
            float(np.quantile(ratios, 1 - alpha)))


def bootstrap_geomean_ratio_ci(pairs: list[tuple[list[float], list[float]]], level: float = 0.95,
                               n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """The geometric mean over shapes of median(num)/median(den), with a percentile-bootstrap CI that resamples
    every shape's two sample lists independently in each replicate (the shapes are fixed, their timings are not).
    ``pairs``: one (num samples, den samples) per shape, in ms. Returns (geomean ratio, low, high); one pair gives
    :func:`bootstrap_ratio_ci`'s figures. Raises ValueError on no pairs, an empty list or a ratio <= 0. The geometric mean is
    how GPU MODE ranks a kernel over its benchmark shapes: a 2x gain on one shape and a 2x loss on another cancel."""
    import numpy as np

    if not pairs or any(not a or not b for a, b in pairs):
        raise ValueError("every shape needs timing samples of both kernels")
    rng = np.random.default_rng(seed)
    logs = np.zeros(n_boot)
    point = 0.0
    for num, den in pairs:
        a, b = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
        ra = _medians(a, rng.integers(0, a.size, size=(n_boot, a.size)))
        rb = _medians(b, rng.integers(0, b.size, size=(n_boot, b.size)))
        logs += np.log(ra / rb)
        point += math.log(median(num) / median(den))
    k = len(pairs)
    alpha = (1 - level) / 2
    return (float(np.exp(point / k)), float(np.exp(np.quantile(logs / k, alpha))),
            float(np.exp(np.quantile(logs / k, 1 - alpha))))


def geomean(values: list[float]) -> float:
    """Geometric mean of positive numbers; raises ValueError on an empty list or a value <= 0."""
    import numpy as np

    if not values or any(v <= 0 for v in values):
        raise ValueError("the geometric mean needs positive values")
    return float(np.exp(np.mean(np.log(np.asarray(values, dtype=float)))))


@dataclass(frozen=True, slots=True)
class Distribution:
    """Full description of timing samples (ms): SKILL.md's median/robust CV plus p10/p90, IQR, the median's relative
    standard error and its bootstrap 95% CI."""

    n: int
    median_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    p10_ms: float
    p90_ms: float
    iqr_ms: float
    robust_cv: float
    stability: str
    median_rse: float
    ci95_low_ms: float
    ci95_high_ms: float


def describe(samples_ms: list[float]) -> Distribution:
    """Describe samples (ms): the median is :func:`median` (grouped on a clock's tick), p10, p90 and the IQR are
    sample quantiles. Raises ValueError on an empty list or a non-positive median."""
    s = summarize(samples_ms)
    lo, hi = bootstrap_median_ci(samples_ms)
    return Distribution(n=s.n, median_ms=s.median_ms, mean_ms=s.mean_ms, min_ms=s.min_ms, max_ms=s.max_ms,
                        p10_ms=quantile(samples_ms, 0.10), p90_ms=quantile(samples_ms, 0.90),
                        iqr_ms=quantile(samples_ms, 0.75) - quantile(samples_ms, 0.25), robust_cv=s.robust_cv,
                        stability=s.stability, median_rse=median_rse(samples_ms), ci95_low_ms=lo, ci95_high_ms=hi)


#: A measured time below the roofline floor computed from peaks scaled by this headroom is physically implausible
#: (measured peaks are what torch achieves; a hand kernel can beat them by a little, not by 25%).
FLOOR_HEADROOM = 1.25


def roofline_floor_ms(flops: float | None, bytes_min: float | None, peak_flops: float | None,
                      peak_bytes_per_s: float | None) -> float | None:
    """The physics floor in ms: max(flops / peak FLOP/s, bytes_min / peak bytes/s), each peak raised by
    FLOOR_HEADROOM. None when neither term is known; a 0-FLOP workload (a transpose) uses bytes only."""
    terms = []
    if flops and peak_flops:
        terms.append(flops / (peak_flops * FLOOR_HEADROOM))
    if bytes_min and peak_bytes_per_s:
        terms.append(bytes_min / (peak_bytes_per_s * FLOOR_HEADROOM))
    return max(terms) * 1e3 if terms else None
