"""The pull-request gate: is a candidate kernel faster, the same or slower than the baseline, with confidence?

From the timing gate's samples of both kernels (same GPU, same dims, same inputs plan): the speedup
median(baseline) / median(candidate) with a percentile-bootstrap 95% CI (as nvbench's compare reports a
confidence interval rather than one number), classified against a slowdown threshold.
"""

from __future__ import annotations

from typing import Any

from .stats import bootstrap_geomean_ratio_ci, bootstrap_ratio_ci


def verdict(baseline_ms: list[float], candidate_ms: list[float], threshold_pct: float) -> dict[str, Any]:
    """Classify the candidate against the baseline (samples in ms).

    speedup = median(baseline)/median(candidate) with its 95% CI [lo, hi]; t = threshold_pct/100.
    SLOWER: hi < 1/(1+t) (confidently slower by more than the threshold: the gate fails);
    FASTER: lo > 1 (confidently faster); SAME: the whole CI within [1/(1+t), 1+t]; AMBIGUOUS otherwise (more
    samples or a quieter GPU needed). Raises ValueError on an empty sample list or a negative threshold."""
    if not baseline_ms or not candidate_ms:
        raise ValueError("both kernels need timing samples")
    if threshold_pct < 0:
        raise ValueError("threshold must be >= 0")
    ratio, lo, hi = bootstrap_ratio_ci(baseline_ms, candidate_ms)
    return classify(ratio, lo, hi, threshold_pct)


def verdict_shapes(shapes: list[tuple[list[float], list[float]]], threshold_pct: float) -> dict[str, Any]:
    """:func:`verdict` over several benchmark shapes: the speedup is the geometric mean of the per-shape speedups
    (baseline samples, candidate samples per shape, ms), its CI a bootstrap over every shape's samples
    (:func:`pytest_kopt.stats.bootstrap_geomean_ratio_ci`), classified as :func:`verdict` does. Raises ValueError
    on no shapes, an empty sample list or a negative threshold."""
    if threshold_pct < 0:
        raise ValueError("threshold must be >= 0")
    ratio, lo, hi = bootstrap_geomean_ratio_ci(shapes)
    return {**classify(ratio, lo, hi, threshold_pct), "shapes": len(shapes), "geomean": True}


def classify(ratio: float, lo: float, hi: float, threshold_pct: float) -> dict[str, Any]:
    """SLOWER/FASTER/SAME/AMBIGUOUS of a speedup ``ratio`` with 95% CI [lo, hi] against ``threshold_pct`` (see
    :func:`verdict`)."""
    t = threshold_pct / 100.0
    if hi < 1 / (1 + t):
        v = "SLOWER"
    elif lo > 1:
        v = "FASTER"
    elif lo >= 1 / (1 + t) and hi <= 1 + t:
        v = "SAME"
    else:
        v = "AMBIGUOUS"
    return {"verdict": v, "speedup": ratio, "ci95": [lo, hi], "threshold_pct": threshold_pct,
            "fails": v == "SLOWER"}
