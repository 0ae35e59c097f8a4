"""PR-gate verdicts from timing samples (bootstrap CI of the speedup against a slowdown threshold)."""

from __future__ import annotations

import pytest

from pytest_kopt.prgate import verdict


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
