"""Timing statistics: median, robust CV and SKILL.md's stability classes."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

#: SKILL.md / upstream: robust CV <= 0.05 is stable, <= 0.10 borderline, above that unstable.
STABLE_CV = 0.05
BORDERLINE_CV = 0.10
#: 1.4826 * MAD estimates the standard deviation of a normal distribution (consistency constant).
MAD_TO_SIGMA = 1.4826


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


def summarize(samples_ms: list[float]) -> TimingStats:
    """Summarize samples (ms). Raises ValueError on an empty list or a non-positive median."""
    if not samples_ms:
        raise ValueError("no timing samples")
    med = statistics.median(samples_ms)
    if med <= 0:
        raise ValueError(f"non-positive median {med} ms")
    mad = statistics.median(abs(x - med) for x in samples_ms)
    cv = MAD_TO_SIGMA * mad / med
    return TimingStats(n=len(samples_ms), median_ms=med, mean_ms=statistics.fmean(samples_ms),
                       min_ms=min(samples_ms), max_ms=max(samples_ms), mad_ms=mad, robust_cv=cv,
                       stability=stability_class(cv))
