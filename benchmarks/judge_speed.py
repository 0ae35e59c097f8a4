"""The correctness verdict's cost in the pytest process, per seed of one fp32 output (the naive SGEMM's C at
4096 x 4096 by default): ``compare`` of one call against the reference, and the whole ``judge`` of a seed's four
candidate calls (set A twice, set B in the same and in new buffers). Prints the median of 7 runs (seconds).

    python3 benchmarks/judge_speed.py [--elements 16777216]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from pytest_kopt.child.verdict import compare, judge


def median_s(fn, runs: int = 7) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=4096 * 4096)
    n = ap.parse_args().elements
    rng = np.random.default_rng(0)
    ref, ref_b = (rng.standard_normal(n, dtype=np.float32) * 30 for _ in range(2))
    noise = rng.standard_normal(n, dtype=np.float32) * 1e-5
    arrays = {"ref__C": ref, "refB__C": ref_b, "cand1__C": ref + noise, "cand2__C": ref + noise,
              "candB__C": ref_b + noise, "candC__C": ref_b + noise}
    print(f"verdict of {n} fp32 elements per output, {os.cpu_count()} CPUs, median of 7 runs")
    print(f"{'step':<34} {'seconds':>8}")
    print(f"{'compare (one call)':<34} {median_s(lambda: compare('C', arrays['cand1__C'], ref, 1e-3, 1e-3)):>8.3f}")
    v = judge(["C"], arrays, {"C": (1e-3, 1e-3)}, check_tolerance=False)
    assert v.ok, v.message
    print(f"{'judge (a seed: four calls)':<34} "
          f"{median_s(lambda: judge(['C'], arrays, {'C': (1e-3, 1e-3)}, check_tolerance=False)):>8.3f}")


if __name__ == "__main__":
    main()
