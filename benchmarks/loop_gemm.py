"""A real 2-iteration optimization run on the naive SGEMM example, driven the way an agent drives pytest-kopt.

Iteration 1 writes two shared-memory-tiled branches (TILE 32, 16) and the ablation of shared-memory tiling;
iteration 2 two register-tiled branches with 128-bit accesses (128x128/8x8, 64x64/4x4) and the ablation of the
vectorized accesses. Methods are chosen inside each iteration's axis budget (roofline.json). Prints the wall time
of every phase and the run's headline. Also the scenario of the loop-speed issue (2 branches + 1 ablation).

Usage (GPU machine): python3 benchmarks/loop_gemm.py [--out DIR] [--dims M=4096,N=4096,K=4096] [-n 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from cpu_sampler import host_line

ROOT = Path(__file__).resolve().parent.parent
KERNELS = Path(__file__).resolve().parent / "loop_kernels"
#: each phase's start (epoch s), by its log
STARTS: dict[Path, float] = {}
#: the timeline's rows: (label, stamp key); the keys are kopt_timeline.read's
TIMELINE_ROWS = [
    ("plugins imported (first kopt hook)", "controller: configure"),
    ("collection done (controller)", "controller: collected"),
    ("last worker's collection done", "collected (last)"),
    ("last item's report (controller)", "controller: item_done"),
    ("first worker down", "worker_down (first)"),
    ("last worker down", "worker_down (last)"),
    ("workers' harness pools shut down (last)", "pool_shutdown_end (last)"),
    ("controller's session end starts", "controller: sessionfinish_start"),
    ("  branch results read", "controller: branch_results_end"),
    ("  champion's ncu item (profile taken, read)", "controller: gate_ncu_end"),
    ("  champion's roofline (and chart)", "controller: gate_roofline_end"),
    ("  iteration closed in state.json", "controller: close_iteration_end"),
    ("  next iteration opened", "controller: open_iteration_end"),
    ("  history chart drawn", "controller: plot_history_end"),
    ("  summary.md rendered", "controller: render_summary_end"),
    ("controller's session end done", "controller: sessionfinish_end"),
    ("terminal summary done", "controller: summary_end"),
    ("exit", "exit"),
]


def variant(template: str, **defines: int) -> str:
    """A kernel source with ``#define`` lines prepended (``reg_tiled.cuh`` is the gemm_tiled example's body)."""
    head = "".join(f"#define {k} {v}\n" for k, v in defines.items())
    path = KERNELS / template if (KERNELS / template).is_file() else ROOT / "examples" / "gemm_tiled" / template
    return head + path.read_text()


def naive(block: int) -> str:
    """The baseline with another block edge: the ablation of shared-memory tiling at TILE=block."""
    src = (ROOT / "examples" / "gemm" / "gemm.cu").read_text()
    return src.replace("dim3 block(16, 16);", f"dim3 block({block}, {block});")


def pytest(args: list[str], cwd: Path, log: Path, timeout_s: float = 600.0) -> tuple[int, float]:
    """Run pytest (``-v``), streaming its output into ``log`` with each line's elapsed seconds, so a phase cut off by a
    timeout still shows which items finished when; returns (exit code, wall seconds), exit code 124 on a timeout.
    Every process of the session stamps its steps into ``log`` with ``.timeline.jsonl`` (``kopt_timeline.py``);
    :func:`print_timeline` prints them."""
    t0 = time.perf_counter()
    timeline = log.with_suffix(".timeline.jsonl")
    timeline.unlink(missing_ok=True)
    env = {**os.environ, "KOPT_TIMELINE": str(timeline),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    STARTS[log] = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "kopt_timeline", "-rs", "-v",
                             *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    timer = threading.Timer(timeout_s, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    with log.open("w") as fh:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            fh.write(f"{time.perf_counter() - t0:7.1f} {line}")
            fh.flush()
    rc = proc.wait()
    timed_out = not timer.is_alive() and rc < 0
    timer.cancel()
    wall = time.perf_counter() - t0
    out = "".join(lines)
    tail = out[out.find("kopt gates"):] if "kopt gates" in out else out[-3000:]
    print(tail[-4000:])
    if timed_out:
        print(f"(cut off after {timeout_s:.0f} s; see {log})")
        return 124, wall
    return rc, wall


def print_timeline(logs: list[Path], phases: list[tuple[str, int, float]]) -> None:
    """Seconds from each phase's start to each stamp of its timeline (``-`` where a phase has none)."""
    from kopt_timeline import read

    cols = []
    for log, (_, _, wall) in zip(logs, phases):
        tl = log.with_suffix(".timeline.jsonl")
        cols.append({**(read(str(tl), STARTS[log]) if tl.is_file() else {}), "exit": wall})
    print("\nwhere each phase's time goes (s from its start)".ljust(48) + "".join(f"{log.stem:>10}" for log in logs))
    for label, key in TIMELINE_ROWS:
        print(f"{label:<48}" + "".join(f"{c[key]:10.2f}" if key in c else f"{'-':>10}" for c in cols))


def write_iteration(run: Path, i: int, plan: dict) -> list[str]:
    """Branches, ablations and methods.json of iteration ``i`` inside its axis budget."""
    it = run / f"iterv{i}"
    budget = json.loads((it / "roofline.json").read_text())["axis_budget"]
    methods = [m for m in plan["methods"] if budget.get(m["axis"], 0) > 0]
    dropped = [m["id"] for m in plan["methods"] if m not in methods]
    if dropped:
        print(f"iterv{i}: budget {budget} leaves no slot for {dropped}; not claimed")
    for k, src in enumerate(plan["branches"], start=1):
        (it / "branches" / f"b{k}" / "kernel.cu").write_text(src)
    for method, (src, base) in plan["ablations"].items():
        if any(m["id"] == method for m in methods):
            d = it / "ablations" / method
            d.mkdir(parents=True, exist_ok=True)
            (d / "kernel.cu").write_text(src)
            (d / "base").write_text(base + "\n")
    # a speed benchmark with a fixed plan: where the iteration's ncu evidence does not trigger a planned method,
    # the override says so (methods validation requires one, as it does of an agent)
    methods = [{**m, "override_reason": "loop_gemm.py: a fixed plan, timed whatever the trigger says"}
               for m in methods]
    (it / "methods.json").write_text(json.dumps({"methods": methods}, indent=1))
    return [m["id"] for m in methods]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/kopt-loop"))
    ap.add_argument("--dims", default="M=4096,N=4096,K=4096")
    ap.add_argument("-n", default="4")
    ap.add_argument("--iterations", type=int, default=2, help="iterations to close (1: the loop-speed scenario)")
    args = ap.parse_args()
    print(host_line())
    work = Path(args.out) / "loop"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(ROOT / "examples" / "gemm", work)
    # set-up judges one kernel, whose items run in gate order on one worker anyway: -n would only add start-up
    common = ["--kopt-ref", "ref.py", "-n", "0", "--kopt-json", "report.json"]
    phases = []
    rc, wall = pytest(["--kopt-baseline", "gemm.cu", "--kopt-dims", args.dims, "--kopt-init", "--kopt-iterations", "2",
                       "--kopt-branches", "2", "--kopt-seed", "1", *common], work, work / "init.log")
    phases.append(("set-up (--kopt-init)", rc, wall))
    run = sorted(work.glob("run_*"))[-1]
    plans = [
        {"methods": [{"id": "memory.shared_memory_tiling", "axis": "memory",
                      "rationale": "DRAM and L1 re-reads of A and B dominate the naive kernel"}],
         "branches": [variant("smem_tiled.cu", TILE=32), variant("smem_tiled.cu", TILE=16)],
         "ablations": {"memory.shared_memory_tiling": (naive(32), "b1")}},
        {"methods": [{"id": "compute.register_tiling", "axis": "compute", "rationale": "FMA pipe under-used"},
                     {"id": "memory.vectorized_access", "axis": "memory", "rationale": "32-bit loads"}],
         "branches": [variant("reg_tiled.cuh", BM=128, BN=128, TM=8, TN=8, VEC=1),
                      variant("reg_tiled.cuh", BM=64, BN=64, TM=4, TN=4, VEC=1)],
         "ablations": {"memory.vectorized_access": (variant("reg_tiled.cuh", BM=128, BN=128, TM=8, TN=8, VEC=0), "b1")}},
    ]
    for i, plan in enumerate(plans[:args.iterations], start=1):
        state = json.loads((run / "state.json").read_text())
        if state.get("open_iter") != i:
            print(f"no open iteration {i}: run_status {state.get('run_status')}, stop {state.get('stop_reason')}")
            break
        claimed = write_iteration(run, i, plan)
        rc, wall = pytest(["--kopt-run", str(run), "-n", args.n, "--kopt-json", f"report_iter{i}.json"], work,
                          work / f"iter{i}.log")
        phases.append((f"close iterv{i} ({', '.join(claimed)})", rc, wall))
    print("\nphase                                                    rc   wall s")
    for name, rc, wall in phases:
        print(f"{name[:56]:<56} {rc:>3} {wall:>8.1f}")
    print_timeline([work / "init.log"] + sorted(work.glob("iter*.log")), phases)
    for log in [work / "init.log"] + sorted(work.glob("iter*.log")):
        line = next((ln[8:] for ln in log.read_text().splitlines() if ln[8:].startswith("kopt item time per gate")),
                    "")
        print(f"{log.name}: {line}")
    summary = run / "summary.md"
    if summary.is_file():
        print("\n" + summary.read_text()[:3000])


if __name__ == "__main__":
    main()
