"""Timing fidelity on a GPU: kopt's timing loop vs triton.testing.do_bench vs ncu's gpu__time_duration.

Kernels from about 5 µs to 10 ms (torch add at 64 K..128 M floats, fp32 matmul 1024^3 and 4096^3, a 4 M sum).
For each: ncu's median duration over 15 profiled launches (``--clock-control none``, caches flushed by ncu), kopt's
median (pytest_kopt.child.timer: rotating inputs, L2 flush, adaptive stop), the same in graph mode
(--kopt-timing graph) and do_bench's median, each
repeated 5 times; prints two tables: medians, ratio to ncu and run-to-run spread ((max-min)/median of the 5
medians); then the kernel-only CUPTI median the timing gate reports (its spread over the 5 runs) and every other
figure over it.

Usage (GPU machine): python3 benchmarks/timing_fidelity.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CASES = [("add_64K", "add", 1 << 16), ("add_1M", "add", 1 << 20), ("add_16M", "add", 1 << 24),
         ("add_128M", "add", 1 << 27), ("mm_1024", "mm", 1024), ("mm_4096", "mm", 4096), ("sum_4M", "sum", 1 << 22)]
REPEATS = 5


def make(torch, kind: str, n: int, seed: int):
    """Inputs (a dict) and a launch function for one case."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    if kind == "add":
        d = {"a": torch.randn(n, device="cuda", generator=g), "b": torch.randn(n, device="cuda", generator=g)}
        d["c"] = torch.empty_like(d["a"])
        return d, lambda s: torch.add(s["a"], s["b"], out=s["c"])
    if kind == "mm":
        d = {"a": torch.randn(n, n, device="cuda", generator=g), "b": torch.randn(n, n, device="cuda", generator=g)}
        d["c"] = torch.empty_like(d["a"])
        return d, lambda s: torch.mm(s["a"], s["b"], out=s["c"])
    d = {"a": torch.randn(n, device="cuda", generator=g), "c": torch.empty((), device="cuda")}
    return d, lambda s: torch.sum(s["a"], dim=0, out=s["c"])


def profile_child() -> None:
    """Under ncu: each case launched 15 times inside an NVTX range named after it."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    for name, kind, n in CASES:
        d, fn = make(torch, kind, n, 0)
        fn(d)
        torch.cuda.synchronize()
        for _ in range(15):
            torch.cuda.nvtx.range_push(name)
            fn(d)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()


def ncu_medians(out: Path) -> dict[str, float]:
    """ncu's median gpu__time_duration (µs) per case; kernels are renamed after their NVTX range."""
    from pytest_kopt.gates.hardware import find_tool
    from pytest_kopt.gates.ncu_csv import parse_ncu_csv

    ncu = find_tool("ncu")
    cmd = [ncu, "--clock-control", "none", "--nvtx", "--print-nvtx-rename", "kernel", "--csv",
           "--metrics", "gpu__time_duration.sum", *sum((["--nvtx-include", f"{c[0]}/"] for c in CASES), []),
           sys.executable, __file__, "--profile-child"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    (out / "ncu_fidelity.csv").write_text(proc.stdout)
    by: dict[str, list[float]] = {}
    for launch in parse_ncu_csv(proc.stdout):
        name = launch.kernel_name.split("/")[0].strip()
        value = launch.metrics.get("gpu__time_duration.sum")
        if value and value.value is not None:
            by.setdefault(name, []).append(value.value / 1e3)
    return {k: statistics.median(v) for k, v in by.items()}


def kopt_median(torch, kind: str, n: int, method: str = "events") -> tuple[float, float | None]:
    """One run of kopt's timing loop (µs), ``events`` or ``graph`` (--kopt-timing graph), and the kernel-only
    median (µs) its timing gate reports beside it: CUPTI activity records of the same calls through torch's profiler
    (child/timer.kernel_times, as many calls as the gate profiles), None when the profiler gave no records."""
    from pytest_kopt.child.timer import cupti_calls, kernel_times, make_timer
    from pytest_kopt.gates.timing import GRAPH_CALLS, TIMING

    free = torch.cuda.mem_get_info()[0]
    first, fn = make(torch, kind, n, 1)
    per_set = sum(t.numel() * t.element_size() for t in first.values())
    count = max(1, min(TIMING["max_sets"], int(free * TIMING["mem_fraction"] // per_set)))
    sets = [first] + [make(torch, kind, n, 1 + j)[0] for j in range(1, count)]

    def refresh(s, k):
        for key, t in s.items():
            if key != "c":
                t.normal_()

    timer = make_timer(torch, sets, fn, refresh, {**TIMING, "method": method, "graph_calls": GRAPH_CALLS})
    r = timer.result(timer.take())
    med_ms = statistics.median(r["event_ms"])
    cupti = kernel_times(timer, cupti_calls(med_ms)) if method == "events" else {}
    return med_ms * 1e3, cupti.get("median_us")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--profile-child", action="store_true")
    args = ap.parse_args()
    if args.profile_child:
        profile_child()
        return
    import torch
    from triton.testing import do_bench

    torch.backends.cuda.matmul.allow_tf32 = False
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ncu = ncu_medians(out)
    rows = []
    spread = lambda xs: 100 * (max(xs) - min(xs)) / statistics.median(xs) if xs else None  # noqa: E731
    for name, kind, n in CASES:
        runs = [kopt_median(torch, kind, n) for _ in range(REPEATS)]
        kopt = [e for e, _ in runs]
        cupti = [c for _, c in runs if c is not None]
        graph = [kopt_median(torch, kind, n, "graph")[0] for _ in range(REPEATS)]
        d, fn = make(torch, kind, n, 2)
        db = [do_bench(lambda: fn(d), return_mode="median") * 1e3 for _ in range(REPEATS)]
        ref = ncu.get(name)
        k, b = statistics.median(kopt), statistics.median(db)
        rows.append({"case": name, "ncu_us": ref, "kopt_us": k, "kopt_ratio": k / ref if ref else None,
                     "kopt_spread_pct": 100 * (max(kopt) - min(kopt)) / k, "do_bench_us": b,
                     "graph_us": statistics.median(graph),
                     "graph_ratio": statistics.median(graph) / ref if ref else None,
                     "graph_spread_pct": 100 * (max(graph) - min(graph)) / statistics.median(graph),
                     "do_bench_ratio": b / ref if ref else None, "do_bench_spread_pct": 100 * (max(db) - min(db)) / b,
                     "cupti_us": statistics.median(cupti) if cupti else None, "cupti_runs": len(cupti),
                     "cupti_spread_pct": spread(cupti),
                     "events_over_cupti": k / statistics.median(cupti) if cupti else None,
                     "ncu_over_cupti": ref / statistics.median(cupti) if cupti and ref else None})
    (out / "timing_fidelity.json").write_text(json.dumps(rows, indent=1))
    head = (f"{'case':<10} {'ncu µs':>9} {'kopt µs':>9} {'kopt/ncu':>8} {'spread':>7} {'graph µs':>9} {'gr/ncu':>7} "
            f"{'spread':>7} {'do_bench':>9} {'db/ncu':>7} {'spread':>7}")
    print(head)
    f = lambda v, p=3: "n/a" if v is None else f"{v:.{p}f}"  # noqa: E731
    for r in rows:
        print(f"{r['case']:<10} {f(r['ncu_us'], 1):>9} {f(r['kopt_us'], 1):>9} {f(r['kopt_ratio']):>8} "
              f"{f(r['kopt_spread_pct'], 1):>6}% {f(r['graph_us'], 1):>9} {f(r['graph_ratio']):>7} "
              f"{f(r['graph_spread_pct'], 1):>6}% {f(r['do_bench_us'], 1):>9} {f(r['do_bench_ratio']):>7} "
              f"{f(r['do_bench_spread_pct'], 1):>6}%")
    # the GPU's own kernel records (the gate's kernel-only figure), against which the others are read
    print()
    print(f"{'case':<10} {'CUPTI µs':>9} {'spread':>7} {'runs':>5} {'events/CUPTI':>13} {'ncu/CUPTI':>10} "
          f"{'graph/CUPTI':>12} {'do_bench/CUPTI':>15}")
    for r in rows:
        c = r["cupti_us"]
        rel = lambda v: None if v is None or not c else v / c  # noqa: E731
        print(f"{r['case']:<10} {f(c, 2):>9} {f(r['cupti_spread_pct'], 1):>6}% {r['cupti_runs']:>5} "
              f"{f(r['events_over_cupti']):>13} {f(r['ncu_over_cupti']):>10} {f(rel(r['graph_us'])):>12} "
              f"{f(rel(r['do_bench_us'])):>15}")


if __name__ == "__main__":
    main()
