"""PR-gate verdicts from timing samples (bootstrap CI of the speedup against a slowdown threshold)."""

from __future__ import annotations

import pytest

from pytest_kopt.prgate import verdict, verdict_shapes
from pytest_kopt.stats import geomean


def spread(center: float, n: int = 40, width: float = 0.002) -> list[float]:
    """n samples evenly spread over center * (1 +- width)."""
    return [center * (1 - width + 2 * width * i / (n - 1)) for i in range(n)]


@pytest.mark.parametrize(("base", "cand", "want"), [
    (spread(10.0), spread(5.0), "FASTER"),       # naive -> tiled
    (spread(10.0), spread(10.0), "SAME"),        # tiled -> tiled
    (spread(5.0), spread(10.0), "SLOWER"),       # tiled -> naive
    (spread(10.0), spread(10.2), "SAME"),        # 2% slower is inside a 3% threshold
    (spread(10.0, width=0.2), spread(10.5, width=0.2), "AMBIGUOUS"),  # too noisy to say
])
def test_verdicts(base, cand, want) -> None:
    v = verdict(base, cand, 3.0)
    assert v["verdict"] == want
    assert v["fails"] is (want == "SLOWER")
    assert v["speedup"] == pytest.approx(sorted(base)[19:21][0] / sorted(cand)[19:21][0], rel=0.01)
    lo, hi = v["ci95"]
    assert lo <= v["speedup"] <= hi


def test_slower_beyond_threshold_only() -> None:
    assert verdict(spread(10.0), spread(10.5), 3.0)["verdict"] == "SLOWER"   # 5% slower, threshold 3%
    assert verdict(spread(10.0), spread(10.5), 10.0)["verdict"] == "SAME"    # within a 10% threshold
    with pytest.raises(ValueError):
        verdict([], [1.0], 3.0)


def test_several_shapes_are_judged_on_the_geometric_mean() -> None:
    """Three shapes: 2x faster, 2x slower, the same: the geometric mean of the speedups is 1 (SAME within 3%), where
    the arithmetic mean (1.17) would call it faster; twice faster on all three is FASTER with speedup 2 and a CI
    around it; one shape's slowdown beyond the threshold with the others even is SLOWER overall only when it
    drags the geometric mean past the threshold."""
    even = verdict_shapes([(spread(10.0), spread(5.0)), (spread(5.0), spread(10.0)), (spread(7.0), spread(7.0))],
                          3.0)
    assert even["verdict"] == "SAME" and even["speedup"] == pytest.approx(1.0, rel=0.005) and even["shapes"] == 3
    fast = verdict_shapes([(spread(10.0), spread(5.0)), (spread(4.0), spread(2.0)), (spread(8.0), spread(4.0))], 3.0)
    assert fast["verdict"] == "FASTER" and fast["speedup"] == pytest.approx(2.0, rel=0.005)
    assert fast["ci95"][0] <= 2.0 <= fast["ci95"][1] + 1e-3
    slow = verdict_shapes([(spread(10.0), spread(13.0)), (spread(4.0), spread(4.0)), (spread(8.0), spread(8.0))],
                          3.0)
    assert slow["verdict"] == "SLOWER" and slow["speedup"] == pytest.approx((10 / 13) ** (1 / 3), rel=0.005)
    assert geomean([2.0, 0.5, 1.0]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        verdict_shapes([], 3.0)
