"""Where the kernel-only (CUPTI) pass of one timing spends its wall time, on one GPU: a 1024^3 fp32 matmul (about
0.15 ms, the throughput benchmark's size) timed as a timing process times a candidate (:class:`EventsTimer` over
rotating input sets refreshed with new values, then :func:`cupti_samples`), with each part of the pass timed apart.

Prints one table per load on the host and per ``--api``: the whole pass (median of ``--runs``), then its parts: one
empty CUPTI session (``start`` and ``stop``: enabling the five activity kinds and switching off the records of the
calls that queue no device work (``--api launches``, kopt's setting; ``all`` records every call), the forced flush,
disabling them), one batch of 50 calls behind the 1 ms hold and behind the event timer's hold, the records each
batch delivered, and the Python work after a batch (splitting the records into calls). All times are wall seconds on the host
(``time.perf_counter``). The loads (``--load``), as a loop's close puts them beside a timing: ``quiet``; ``cpu``,
one busy Python loop per two CPUs (a close of 32 branches kept an H100 host's 16 CPUs 42% busy, 77% at
most over 10 s); ``contexts``, 8 processes that create a CUDA context, allocate and free 64 MiB and
destroy it, over and over (through the driver API: what harness processes starting while idle do).

    python3 benchmarks/cupti_pass.py [--runs 5] [--n 1024] [--load quiet,cpu,contexts] [--api launches,all]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

#: One process of the ``contexts`` load: CUDA contexts made, used and destroyed in a loop through libcuda
CHURN = """
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
if cu.cuInit(0) or cu.cuDeviceGet(ctypes.byref(dev), 0):
    sys.exit("cuInit or cuDeviceGet failed")
while True:
    if cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev):
        sys.exit("cuCtxCreate failed")
    if cu.cuMemAlloc_v2(ctypes.byref(ptr), 64 << 20) == 0:
        cu.cuMemFree_v2(ptr)
    cu.cuCtxDestroy_v2(ctx)
"""
LOADS = {"quiet": None, "cpu": "while True: pass", "contexts": CHURN}


def start_load(load: str) -> list[subprocess.Popen]:
    """The background processes of ``load`` (none for ``quiet``), each in a session of its own; raises SystemExit
    when one has already exited 2 s after the start (a load that could not run is no load)."""
    code = LOADS[load]
    if code is None:
        return []
    count = max(1, (os.cpu_count() or 2) // 2) if load == "cpu" else 8
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen([sys.executable, "-c", code], start_new_session=True))
        time.sleep(2.0)
        dead = [p.returncode for p in procs if p.poll() is not None]
        if dead:
            raise SystemExit(f"load {load}: {len(dead)} of {count} processes exited (codes {dead})")
    except BaseException:
        stop_load(procs)
        raise
    return procs


def stop_load(procs: list[subprocess.Popen]) -> None:
    """End a load's processes (and anything they started)."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--load", default="quiet", help="comma-separated: " + ", ".join(LOADS))
    ap.add_argument("--api", default="launches", help="comma-separated: launches (the runtime and driver calls that "
                    "queue device work are recorded, as kopt does), all (every call)")
    a = ap.parse_args()
    unknown = [x for x in a.load.split(",") if x not in LOADS]
    if unknown:
        ap.error(f"--load: unknown {', '.join(unknown)} (one of {', '.join(LOADS)})")
    if not set(a.api.split(",")) <= {"launches", "all"}:
        ap.error(f"--api: {a.api!r} (comma-separated: launches, all)")

    import torch

    from pytest_kopt.child import cupti

    n = a.n
    sets = [(torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda"), torch.empty(n, n, device="cuda"))
            for _ in range(8)]

    def launch(s):
        torch.mm(s[0], s[1], out=s[2])

    def refresh(s, k):
        g = torch.Generator(device="cuda").manual_seed(k)
        s[0].normal_(generator=g)
        s[1].normal_(generator=g)

    backend = cupti.profiler_backend()
    print(f"GPU {torch.cuda.get_device_name(0)}; CUPTI client {backend['name']} (first session "
          f"{backend['warm_s']:.3f} s){'; ' + backend['note'] if backend['note'] else ''}")
    for load, api in ((load, api) for load in a.load.split(",") for api in a.api.split(",")):
        act = backend["activity"]
        if act is not None:  # which runtime and driver calls CUPTI records (kopt's own: launches)
            if api == "all":
                act.record_all("cupti_pass.py --api all")
            else:
                act.api, act.api_note = "launches", None
        procs = start_load(load)
        try:
            rows = measure(backend, sets, launch, refresh, a.runs)
        finally:
            stop_load(procs)
        print(f"\nload: {load}; API records: {act.api if act is not None else 'torch.profiler'}"
              f"{f' ({act.api_note})' if act is not None and act.api_note else ''}")
        print(f"{'part':<58} {'median':>10} {'max':>10}")
        for k, v in rows.items():
            print(f"{k:<58} {statistics.median(v):>10.4f} {max(v):>10.4f}")


def measure(backend: dict, sets: list, launch, refresh, runs: int) -> dict[str, list[float]]:
    """``runs`` timings of ``launch`` over ``sets`` and their kernel-only passes: each part's wall seconds (and
    counts) per run."""
    import torch

    from pytest_kopt.child import cupti
    from pytest_kopt.child.timer import make_timer
    from pytest_kopt.gates.measure import TIMING

    rows: dict[str, list[float]] = {}

    def add(key: str, v: float) -> None:
        rows.setdefault(key, []).append(v)

    for _ in range(runs):
        timer = make_timer(torch, sets, launch, refresh, {**TIMING, "method": "events"})
        timer.take()
        med = statistics.median(timer.event_ms)
        t0 = time.perf_counter()
        out = cupti.cupti_samples(timer, med, 1e3 * timer.elapsed_s / len(timer.event_ms))
        add("whole pass (cupti_samples)", time.perf_counter() - t0)
        add("  its calls", out.get("calls") or 0)
        add("  its batches", out.get("batches") or 0)
        add("  its median span (us)", out.get("median_us") or 0)
        act = backend["activity"]
        if act is not None:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            act.start()
            add("  empty session: start", time.perf_counter() - t0)
            t0 = time.perf_counter()
            act.stop()
            add("  empty session: stop (flush, disable)", time.perf_counter() - t0)
        for label, hold in (("1 ms hold", None), ("event timer's hold", timer.hold_us)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            capture = cupti._capture_cupti if act is not None else cupti._capture_torch
            records, launches, windows, calls_at = capture(
                backend, timer, 50, 0, max(2 * timer.hold_us, cupti.KERNEL_TIMES_HOLD_US) if hold is None else hold,
                False)
            add(f"  50 calls behind the {label}: capture", time.perf_counter() - t0)
            add(f"    {label}: device records", len(records))
            add(f"    {label}: launch correlations", len(launches))
            t0 = time.perf_counter()
            segments, _ = cupti.calls_by_launch(records, launches, windows)
            cupti.idle_in_calls(records, segments, calls_at)
            cupti.host_before_launch(records, launches, segments, calls_at, windows)
            add(f"    {label}: splitting the records into calls", time.perf_counter() - t0)
        t0 = time.perf_counter()
        for i in range(50):
            cupti._flush_window(timer, i, timer.hold_us, False)
            timer.launch(sets[i % len(sets)])
            torch.cuda.synchronize()
        add("  the same 50 calls unprofiled (event timer's hold)", time.perf_counter() - t0)
        add("  event timer's hold (us)", timer.hold_us)
        add("  event samples' median (ms)", statistics.median(timer.event_ms))
    return rows


if __name__ == "__main__":
    main()
