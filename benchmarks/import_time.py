"""How long importing the plugin takes, and what it imports (every pytest session pays this through the entry
point). Prints a table: wall time of ``import pytest_kopt.plugin`` in a fresh interpreter (median of N), the
same for ``import pytest`` alone, and which heavy modules came along.

Usage: python3 benchmarks/import_time.py [--repeat 9]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CODE = ("import sys, time; t = time.perf_counter(); import {mod}; dt = time.perf_counter() - t; "
        "heavy = [m for m in ('torch', 'triton', 'numpy', 'hypothesis', 'matplotlib') if m in sys.modules]; "
        "print(dt, ','.join(heavy) or '-')")


def measure(mod: str, repeat: int) -> tuple[float, str]:
    """Median import wall time (s) of ``mod`` in fresh interpreters, and the heavy modules it loaded."""
    times, heavy = [], "-"
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", CODE.format(mod=mod)], capture_output=True, text=True,
                             check=True).stdout.split()
        times.append(float(out[0]))
        heavy = out[1]
    return statistics.median(times), heavy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    print(f"{'import':<24} {'median ms':>10} heavy modules loaded")
    for mod in ("pytest", "pytest_kopt.plugin"):
        t, heavy = measure(mod, args.repeat)
        print(f"{mod:<24} {t * 1e3:>10.1f} {heavy}")


if __name__ == "__main__":
    main()
