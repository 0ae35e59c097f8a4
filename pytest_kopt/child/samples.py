"""The statistics a timing process needs while it samples: the median of ticked samples, quantiles, the median's
relative standard error and the adaptive stopping rule. Pure Python (a harness process decides when to stop between
samples); :mod:`pytest_kopt.stats` builds the reports' statistics on these."""

from __future__ import annotations

import math
import statistics

#: 1.4826 * MAD estimates the standard deviation of a normal distribution (consistency constant).
MAD_TO_SIGMA = 1.4826

#: A timer's tick counts (:func:`grid`) when it is at least this fraction of the median: a 32 ns tick is 2.3% of
#: a 1.4 µs kernel's span (one tick moves a plain median that much) but 0.05% of a 60 µs one's
TICK_MATTERS = 1e-3
#: ...and at most this fraction: two values far apart are two modes of a kernel, not one clock's neighbouring ticks
#: (a 0.5 µs CUDA-event tick on a 1.4 µs kernel is 36%: those samples keep the sample median)
TICK_AT_MOST = 0.1
#: Samples lie on a tick grid only when there are at least GRID_MIN_SAMPLES of them (the kernel-only timing's own
#: minimum), they fall in at most GRID_DISTINCT of their count of ticks (a 1.4 µs kernel's spans: 6 to 10 ticks over
#: 100 calls on an H200), and every value is within GRID_SNAP of a tick of its grid point. CUPTI's timestamps,
#: carried onto the host's clock, sit up to 1 ns off the H200's 32 ns steps (spans of 1.375, 1.376 and 1.377 µs)
GRID_MIN_SAMPLES = 20
GRID_DISTINCT = 0.25
GRID_SNAP = 0.2
#: Gaps between distinct values that jump by at least this factor separate the jitter around each tick (below) from
#: the ticks (above)
JITTER_JUMP = 4.0


def grid(samples: list[float]) -> tuple[float, float] | None:
    """(tick, origin) of the clock grid ``samples`` visibly lie on (same unit: every value within
    :data:`GRID_SNAP` of a tick of ``origin + k * tick``), or None.

    A GPU's timestamps (CUPTI activity records, CUDA events) count in ticks of tens of ns to 0.5 µs, so the spans of
    a short kernel take a few values only, each with a little jitter. The values are grouped: sorted, neighbours
    closer than the jitter are one group, whose mean stands for it. The jitter is the gaps below the first gap of at
    least :data:`TICK_MATTERS` of the median that is :data:`JITTER_JUMP` times the gap below it (gaps of every size
    are no clock's ticks). The tick and origin are the least-squares line through the groups' means
    against their tick counts, counted from the smallest gap between means and refined as the range grows. The grid
    is seen when: at least :data:`GRID_MIN_SAMPLES` samples, all finite; at most :data:`GRID_DISTINCT` of them
    groups; the tick between :data:`TICK_MATTERS` and :data:`TICK_AT_MOST` of the median; and every value on it."""
    if len(samples) < GRID_MIN_SAMPLES or not all(map(math.isfinite, samples)):
        return None
    med = abs(statistics.median(samples))
    values = sorted(set(samples))
    if len(values) < 2:
        return None
    gaps = sorted(b - a for a, b in zip(values, values[1:]))
    # the smallest gap that could be a tick and stands JITTER_JUMP above the gap below it (jitter, or float rounding
    # of timestamps): a 2 ns gap among 1 ns ones is jitter still, 30 ns above them a tick
    i = next((j for j, d in enumerate(gaps) if d >= TICK_MATTERS * med and (j == 0 or d >= JITTER_JUMP * gaps[j - 1])),
             None)
    if i is None or gaps[i] > TICK_AT_MOST * med:
        return None  # gaps of every size: no clock's ticks
    join = (gaps[i - 1] * gaps[i]) ** 0.5 if i else 0.5 * gaps[i]  # nothing below it: no two values are one
    counts: dict[float, int] = {}
    for x in samples:
        counts[x] = counts.get(x, 0) + 1
    groups: list[list[float]] = [[values[0]]]
    for a, b in zip(values, values[1:]):
        if b - a <= join:
            groups[-1].append(b)
        else:
            groups.append([b])
    if len(groups) < 2 or len(groups) > GRID_DISTINCT * len(samples):
        return None
    means = [g[0] + sum((x - g[0]) * counts[x] for x in g) / sum(counts[x] for x in g) for g in groups]
    tick, origin = min(b - a for a, b in zip(means, means[1:])), means[0]
    steps = [0]
    for i in range(1, len(means)):
        steps.append(steps[-1] + max(1, round((means[i] - means[i - 1]) / tick)))
        k, m = steps, means[: i + 1]  # the least-squares line through the means so far
        mk, mm = sum(k) / len(k), sum(m) / len(m)
        tick = sum((a - mk) * (b - mm) for a, b in zip(k, m)) / sum((a - mk) ** 2 for a in k)
        origin = mm - tick * mk
    if not TICK_MATTERS * med <= tick <= TICK_AT_MOST * med:
        return None
    if any(abs((x - origin) / tick - round((x - origin) / tick)) > GRID_SNAP for x in values):
        return None
    return tick, origin


def grid_tick(samples: list[float]) -> float | None:
    """The tick of :func:`grid` (same unit as ``samples``), or None where the samples show no grid."""
    g = grid(samples)
    return None if g is None else g[0]


def median(samples: list[float]) -> float:
    """The median of timing samples (same unit). On a visible tick grid (:func:`grid`) it is the grouped median
    (:func:`statistics.median_grouped`, each grid point standing for the tick-wide interval around it), which moves
    with the counts on each side instead of jumping a whole tick: the median of the continuous times the ticked
    samples were rounded from; it stays within half a tick of the middle sample (``sorted(samples)[n // 2]``), and
    may lie beyond the sample p10 or p90 when nearly all samples read one tick. Otherwise the sample median.
    Raises ValueError on an empty list."""
    if not samples:
        raise ValueError("no samples")
    g = grid(samples)
    if g is None:
        return statistics.median(samples)
    tick, origin = g
    return origin + tick * statistics.median_grouped([round((x - origin) / tick) for x in samples], 1)


#: Asymptotic standard error of the sample median of a normal population: sqrt(pi/2) * sigma / sqrt(n).
MEDIAN_SE_FACTOR = 1.2533


def quantile(samples: list[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) by linear interpolation between order statistics (numpy's default method).
    Raises ValueError on an empty list."""
    if not samples:
        raise ValueError("no samples")
    xs = sorted(samples)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median_rse(samples: list[float]) -> float:
    """Relative standard error of the median: 1.2533 * (1.4826 * MAD) / (median * sqrt(n)) (dimensionless);
    inf for fewer than 2 samples. The robust sigma keeps one outlier from stalling the stopping rule."""
    if len(samples) < 2:
        return float("inf")
    med = statistics.median(samples)
    mad = statistics.median(abs(x - med) for x in samples)
    return MEDIAN_SE_FACTOR * MAD_TO_SIGMA * mad / (med * len(samples) ** 0.5) if med > 0 else float("inf")


#: The host's gap (ms: :func:`host_gap_ms`) over which a call is taken to do work its events did not see: the larger
#: of 20 µs and a quarter of the event median. Honest branches' gaps in three closes of 32 (Triton softmax at ~12 µs,
#: SGEMM at 0.18-0.32 ms; H100, 2026-12-07) ran from -30 to +10 µs.
HOST_GAP_MIN_MS = 0.02
HOST_GAP_SHARE = 0.25


def host_gap_ms(host_median_ms: float, events_median_ms: float, launch_ms: float, overhead_ms: float) -> float:
    """The host's time of one synchronised call (ms, the side-stream probe's median) less what it should hold: the
    event median, the call's launch on the host and a launch + synchronise round trip (both calibrated in the
    timing process). Work on another stream or a background thread makes it positive."""
    return host_median_ms - events_median_ms - launch_ms - overhead_ms


#: A probe whose median synchronised call is under this share of the timed calls' event median did less work than
#: the timed calls (a synchronised call holds its kernels, its launch and the round trip): honest calls' ratio was
#: 0.996 at least over 460 timings of H100 runs, up to 8.3 (0.012 ms kernels), 2026-12-07.
HOST_UNDER_EVENTS = 0.8


def host_gap_exceeds(gap_ms: float, events_median_ms: float) -> bool:
    """Whether a host gap (ms) shows work the events did not see (:data:`HOST_GAP_MIN_MS`,
    :data:`HOST_GAP_SHARE`)."""
    return gap_ms > max(HOST_GAP_MIN_MS, HOST_GAP_SHARE * events_median_ms)


def should_stop(samples: list[float], elapsed_s: float, *, target_rse: float = 0.005, min_samples: int = 10,
                min_time_s: float = 0.0, budget_s: float = 2.0, max_samples: int = 2000) -> str | None:
    """Adaptive stopping rule; returns why to stop (``converged``, ``budget``, ``max_samples``) or None.

    Converged: at least ``min_samples`` samples and ``min_time_s`` seconds, and the median's relative standard error
    below ``target_rse`` (default 0.5%, nvbench's default noise target). ``budget_s`` caps the measurement time and
    ``max_samples`` the count, once ``min_samples`` exist."""
    n = len(samples)
    if n >= max_samples:
        return "max_samples"
    if n < min_samples:
        return None
    if elapsed_s >= min_time_s and median_rse(samples) < target_rse:
        return "converged"
    if elapsed_s >= budget_s:
        return "budget"
    return None
