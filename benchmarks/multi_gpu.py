"""One loop iteration with 8 branches closed on one GPU and on two: wall time and champion of each.

Seeds a run on the naive SGEMM (``--kopt-init --kopt-branches 8``), writes 8 tiled branches and the ablation of
shared-memory tiling, copies the run folder, then closes the iteration twice, each with its own pytest cache (so
neither reuses the other's builds or reference outputs): ``-n 9 --kopt-gpus 0`` and ``-n 9 --kopt-gpus 0,1`` (one
worker per kernel both times, so only the number of GPUs differs).
Prints a table: GPUs, wall seconds, champion, its median, and the same-GPU decision of the two-GPU close.

Usage (a machine with two GPUs): python3 benchmarks/multi_gpu.py [--out DIR] [--dims M=4096,N=4096,K=4096] [-n 9]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loop_gemm import ROOT, naive, pytest, variant, write_iteration  # noqa: E402

#: (template, defines) of the 8 branches: shared-memory tiles of two sizes, register tiles of four shapes with
#: 128-bit accesses, two without.
BRANCHES = [("smem_tiled.cu", {"TILE": 32}), ("smem_tiled.cu", {"TILE": 16}),
            ("reg_tiled.cuh", {"BM": 128, "BN": 128, "TM": 8, "TN": 8, "VEC": 1}),
            ("reg_tiled.cuh", {"BM": 64, "BN": 64, "TM": 4, "TN": 4, "VEC": 1}),
            ("reg_tiled.cuh", {"BM": 128, "BN": 64, "TM": 8, "TN": 4, "VEC": 1}),
            ("reg_tiled.cuh", {"BM": 64, "BN": 128, "TM": 4, "TN": 8, "VEC": 1}),
            ("reg_tiled.cuh", {"BM": 128, "BN": 128, "TM": 8, "TN": 8, "VEC": 0}),
            ("reg_tiled.cuh", {"BM": 64, "BN": 64, "TM": 4, "TN": 4, "VEC": 0})]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/kopt-multi"))
    ap.add_argument("--dims", default="M=4096,N=4096,K=4096")
    ap.add_argument("-n", default=str(len(BRANCHES) + 1),
                    help="xdist workers of both closes, the same on one GPU and on two (default: one per kernel)")
    ap.add_argument("--order", default="1,2", help="which closes run first: 1,2 or 2,1")
    args = ap.parse_args()
    work = Path(args.out) / "multi"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(ROOT / "examples" / "gemm", work)
    rc, wall = pytest(["--kopt-baseline", "gemm.cu", "--kopt-ref", "ref.py", "--kopt-dims", args.dims, "--kopt-init",
                       "--kopt-iterations", "2", "--kopt-branches", str(len(BRANCHES)), "--kopt-seed", "1", "-n", "0",
                       "--kopt-gpus", "0", "-o", "cache_dir=.cache_init"], work, work / "init.log")
    print(f"set-up rc={rc} wall={wall:.1f} s")
    run = sorted(work.glob("run_*"))[-1]
    plan = {"methods": [{"id": "memory.shared_memory_tiling", "axis": "memory",
                         "rationale": "DRAM and L1 re-reads of A and B dominate the naive kernel"}],
            "branches": [variant(t, **d) for t, d in BRANCHES],
            "ablations": {"memory.shared_memory_tiling": (naive(32), "b1")}}
    write_iteration(run, 1, plan)
    runs = {"1": run.with_name(run.name + "_1gpu"), "2": run.with_name(run.name + "_2gpu")}
    for r in runs.values():
        shutil.copytree(run, r)
    rows = []
    for key in args.order.split(","):
        gpus = "0" if key == "1" else "0,1"
        rc, wall = pytest(["--kopt-run", str(runs[key]), "-n", args.n, "--kopt-gpus", gpus, "--kopt-json",
                           f"report_{key}gpu.json", "-o", f"cache_dir=.cache_{key}gpu"], work, work / f"close_{key}gpu.log")
        br = json.loads((runs[key] / "iterv1" / "branch_results.json").read_text())
        champ = next((b for b in br["branches"] if b["branch"] == br["champion"]), {})
        rows.append((gpus, rc, wall, br["champion"], champ.get("median_ms"), br.get("decision")))
        print(f"--kopt-gpus {gpus}: branches " + ", ".join(
            f"{b['branch']} {b['median_ms']:.3f}" if b.get("median_ms") else f"{b['branch']} {b['status']}"
            for b in br["branches"]))
    print("\n--kopt-gpus  rc   wall s  champion  champion ms")
    for gpus, rc, wall, champ, ms, _ in rows:
        print(f"{gpus:<11} {rc:>3} {wall:>8.1f}  {champ:<8}  {ms if ms is None else round(ms, 4)}")
    walls = {g: w for g, _, w, *_ in rows}
    if len(walls) == 2:
        print(f"wall(2 GPUs) / wall(1 GPU) = {walls['0,1'] / walls['0']:.2f}; same champion: "
              f"{rows[0][3] == rows[1][3]}")
    for gpus, *_, decision in rows:
        if decision:
            print(f"decision of --kopt-gpus {gpus}: on {decision['gpu_uuid']}, measured on {decision['measured_on']}, "
                  f"re-timed ms {json.dumps({k: round(v, 4) for k, v in decision['retimed_ms'].items()})}")


if __name__ == "__main__":
    main()
