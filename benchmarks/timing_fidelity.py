"""Timing fidelity on a GPU: kopt's timing (its default, the kernel-only CUPTI samples, and its events and graph
modes) vs triton.testing.do_bench vs ncu's gpu__time_duration, all read against the kernels' own span measured
independently of kopt's code.

Kernels from about 1.5 µs to 2.7 ms (torch add at 64 K..128 M floats, fp32 matmul 1024^3 and 4096^3, a 4 M sum of
two kernels). For each: ncu's median duration over 15 profiled launches (``--clock-control none``, caches flushed by
ncu); the CUPTI span (:func:`independent_span`: torch's profiler over 200 calls, each behind a read-only 120 MB
flush, a device synchronisation and a 1 ms GPU spin, the call's records being those right after the spin); kopt's
default (pytest_kopt.child.timer: rotating inputs, L2 flush, adaptive stop, then ``cupti_samples``) through each
CUPTI client kopt has (cupti-python when installed, and torch's profiler), each in a process of its own (CUPTI
serves one activity client per process up to CUDA 13.2); kopt's events and graph medians; do_bench's median; each
repeated 5 times. Prints the table against the CUPTI span (ratios, and run-to-run spread (max-min)/median of the
5 medians; ``grid``: how many of kopt's 5 runs showed
the clock's tick in their spans, so reported the grouped median of pytest_kopt.stats.median), then the one against
ncu.

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
from typing import Any

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


def kopt_median(torch, kind: str, n: int, method: str = "events") -> tuple[float, float | None, str | None,
                                                                          float | None]:
    """One run of kopt's timing loop (µs), ``events`` or ``graph`` (--kopt-timing graph), and with ``events`` the
    kernel-only median (µs) the timing gate's default reports from the same timer (child/cupti.cupti_samples,
    through this process's CUPTI client), that client's name, and the clock tick (µs) its spans showed
    (pytest_kopt.stats.grid_tick: the median is then the grouped one); the median is None when the profiler gave
    no records."""
    from pytest_kopt.child.cupti import cupti_samples
    from pytest_kopt.child.timer import make_timer
    from pytest_kopt.gates.timing import GRAPH_CALLS, TIMING
    from pytest_kopt.stats import grid_tick

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
    cupti = cupti_samples(timer, med_ms) if method == "events" else {}
    tick = grid_tick(cupti["spans_us"]) if cupti.get("spans_us") else None
    return med_ms * 1e3, cupti.get("median_us"), cupti.get("backend"), tick


def kopt_child(prefer: str) -> None:
    """In a process of its own: kopt's events and kernel-only medians of every case, ``REPEATS`` times, through the
    CUPTI client ``prefer`` picks (``auto``: cupti-python when it starts); one JSON line per case on stdout."""
    import time

    import torch

    from pytest_kopt.child.cupti import profiler_backend

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.zeros(1, device="cuda")
    backend = profiler_backend(prefer)
    print(json.dumps({"backend": backend["name"], "note": backend["note"], "warm_s": backend["warm_s"]}), flush=True)
    for name, kind, n in CASES:
        t0 = time.perf_counter()
        runs = [kopt_median(torch, kind, n) for _ in range(REPEATS)]
        print(json.dumps({"case": name, "events_us": [r[0] for r in runs], "kopt_us": [r[1] for r in runs],
                          "tick_us": [r[3] for r in runs], "wall_s": time.perf_counter() - t0}), flush=True)


def kopt_runs(prefer: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """:func:`kopt_child`'s figures: (its client's ``backend``, ``note`` and ``warm_s``; per case)."""
    proc = subprocess.run([sys.executable, __file__, "--kopt-child", prefer], capture_output=True, text=True,
                          timeout=900)
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    cases = {x["case"]: x for x in lines[1:]}
    missing = [c[0] for c in CASES if c[0] not in cases]
    if proc.returncode != 0 or not lines or missing:
        raise SystemExit(f"the kopt child ({prefer}) exited {proc.returncode} without the cases {missing}: "
                         f"{proc.stderr[-2000:]}")
    return lines[0], cases


def independent_span(torch, kind: str, n: int, calls: int = 200) -> float | None:
    """The kernels' own span per call (µs, median of ``calls``), measured without kopt's timer: before each call a
    read-only flush (``torch.amax`` over 120 MB) and a device synchronisation, then a 1 ms GPU spin (so the call's
    launches queue behind it) and the call, and a synchronisation after it. A call's device records are those that
    start after its spin ends, up to the first gap over 5 µs (its kernels run back to back behind the spin; the next
    flush comes after a host synchronisation). The median is kopt's (:func:`pytest_kopt.stats.median`: grouped when
    the spans lie on the GPU timer's tick), so the ratio compares the two procedures, not two estimators. None when
    the profiler gave no records."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    flush = torch.ones(30 << 20, device="cuda")  # 120 MB: twice the H200's 60 MB L2
    d, fn = make(torch, kind, n, 3)
    fn(d)
    torch.cuda.synchronize()
    khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 0) or 1_980_000
    spin = int(1e-3 * khz * 1e3)

    def records(prof):
        return sorted((e.time_range.start, e.time_range.end, str(e.name)) for e in prof.events()
                      if getattr(e, "device_type", None) == DeviceType.CUDA and e.time_range.end > e.time_range.start)

    with profile(activities=[ProfilerActivity.CUDA]) as probe:
        torch.cuda._sleep(spin)
        torch.cuda.synchronize()
    spin_names = {r[2] for r in records(probe)}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            torch.amax(flush)
            torch.cuda.synchronize()
            torch.cuda._sleep(spin)
            fn(d)
            torch.cuda.synchronize()
    spans, current, last_end = [], None, 0.0
    for start, end, name in records(prof):
        if name in spin_names:
            current, last_end = [], end
            continue
        if current is None:
            continue
        if start - last_end > 5.0:  # the next flush: the call has ended
            if current:
                spans.append(max(e for _, e in current) - min(s for s, _ in current))
            current = None
            continue
        current.append((start, end))
        last_end = max(last_end, end)
    if current:
        spans.append(max(e for _, e in current) - min(s for s, _ in current))
    from pytest_kopt import stats

    return stats.median(spans) if spans else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--profile-child", action="store_true")
    ap.add_argument("--kopt-child", default=None)
    args = ap.parse_args()
    if args.profile_child:
        profile_child()
        return
    if args.kopt_child:
        kopt_child(args.kopt_child)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ncu = ncu_medians(out)
    clients = [kopt_runs(prefer) for prefer in ("auto", "torch.profiler")]
    for info, _ in clients:
        print(f"kopt's CUPTI client: {info['backend']} (first session {info['warm_s']:.3f} s)"
              + (f"; {info['note']}" if info.get("note") else ""))
    import torch
    from triton.testing import do_bench

    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    spread = lambda xs: 100 * (max(xs) - min(xs)) / statistics.median(xs) if xs else None  # noqa: E731
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    (auto_info, auto), (torch_info, via_torch) = clients
    for name, kind, n in CASES:
        span = [x for x in (independent_span(torch, kind, n) for _ in range(REPEATS)) if x is not None]
        events = auto[name]["events_us"]
        kopt = [c for c in auto[name]["kopt_us"] if c is not None]
        kopt_t = [c for c in via_torch[name]["kopt_us"] if c is not None]
        graph = [kopt_median(torch, kind, n, "graph")[0] for _ in range(REPEATS)]
        d, fn = make(torch, kind, n, 2)
        db = [do_bench(lambda: fn(d), return_mode="median") * 1e3 for _ in range(REPEATS)]
        ref, c = ncu.get(name), med(span)
        over = lambda v: None if v is None or not c else v / c  # noqa: E731
        per_ncu = lambda v: None if v is None or not ref else v / ref  # noqa: E731
        rows.append({"case": name, "cupti_span_us": c, "cupti_span_spread_pct": spread(span),
                     "kopt_backend": auto_info["backend"], "kopt_us": med(kopt), "kopt_runs": len(kopt), "kopt_runs_us": kopt,
                     "kopt_torch_profiler_runs_us": kopt_t, "cupti_span_runs_us": span,
                     "kopt_spread_pct": spread(kopt), "kopt_over_span": over(med(kopt)),
                     "kopt_grid_runs": sum(1 for t in auto[name].get("tick_us") or [] if t),
                     "kopt_tick_us": med([t for t in auto[name].get("tick_us") or [] if t]),
                     "kopt_torch_profiler_us": med(kopt_t), "kopt_torch_profiler_spread_pct": spread(kopt_t),
                     "kopt_torch_profiler_over_span": over(med(kopt_t)),
                     "events_us": med(events), "events_spread_pct": spread(events), "events_over_span": over(med(events)),
                     "ncu_us": ref, "ncu_over_span": over(ref),
                     "graph_us": med(graph), "graph_spread_pct": spread(graph), "graph_over_span": over(med(graph)),
                     "do_bench_us": med(db), "do_bench_spread_pct": spread(db), "do_bench_over_span": over(med(db)),
                     "events_over_ncu": per_ncu(med(events)), "graph_over_ncu": per_ncu(med(graph)),
                     "do_bench_over_ncu": per_ncu(med(db)), "kopt_over_ncu": per_ncu(med(kopt))})
    (out / "timing_fidelity.json").write_text(json.dumps({"clients": [auto_info, torch_info], "rows": rows},
                                                         indent=1))
    f = lambda v, p=3: "n/a" if v is None else f"{v:.{p}f}"  # noqa: E731
    pct = lambda v: "n/a" if v is None else f"{v:.1f}%"  # noqa: E731
    # the kernels' own span, measured apart from kopt, against which every method is read; "kopt" is the default
    # (through the first client), "via torch" the same samples through torch's profiler
    print(f"{'case':<10} {'span µs':>9} {'spread':>7} {'kopt µs':>9} {'kopt/span':>9} {'spread':>7} "
          f"{'via torch':>9} {'spread':>7} {'events/span':>11} {'spread':>7} {'ncu/span':>8} {'graph/span':>10} "
          f"{'do_bench/span':>13} {'grid':>5}")
    for r in rows:
        print(f"{r['case']:<10} {f(r['cupti_span_us'], 2):>9} {pct(r['cupti_span_spread_pct']):>7} "
              f"{f(r['kopt_us'], 2):>9} {f(r['kopt_over_span']):>9} {pct(r['kopt_spread_pct']):>7} "
              f"{f(r['kopt_torch_profiler_over_span']):>9} {pct(r['kopt_torch_profiler_spread_pct']):>7} "
              f"{f(r['events_over_span']):>11} {pct(r['events_spread_pct']):>7} {f(r['ncu_over_span']):>8} "
              f"{f(r['graph_over_span']):>10} {f(r['do_bench_over_span']):>13} {r['kopt_grid_runs']:>3}/{REPEATS}")
    print()
    print(f"{'case':<10} {'ncu µs':>9} {'kopt/ncu':>8} {'events/ncu':>10} {'graph/ncu':>9} {'spread':>7} "
          f"{'do_bench/ncu':>12} {'spread':>7}")
    for r in rows:
        print(f"{r['case']:<10} {f(r['ncu_us'], 1):>9} {f(r['kopt_over_ncu']):>8} {f(r['events_over_ncu']):>10} "
              f"{f(r['graph_over_ncu']):>9} {pct(r['graph_spread_pct']):>7} {f(r['do_bench_over_ncu']):>12} "
              f"{pct(r['do_bench_spread_pct']):>7}")


if __name__ == "__main__":
    main()
