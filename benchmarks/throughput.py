"""Candidates judged per GPU-minute: one loop iteration closed with 32 branches of one problem (register- and
shared-memory-tiled SGEMM variants of this file's own, M=N=K=1024) on one GPU, and where the close's time goes.

Sets a run up on the naive SGEMM (``--kopt-init``), writes the 32 branches and methods.json, closes the iteration
(``--kopt-run -n N``) and prints: the close's wall time, candidates per GPU-minute (branches / close minutes), each
gate's item time (sum over the branches' items, and the largest item), the branches' verdicts and the champion.
With ``--compare N2`` a second run is set up and closed the same way with ``-n N2``, and the two runs' verdicts
and champions are compared (they must agree).

    python3 benchmarks/throughput.py [--n 8] [--compare 2] [--branches 32] [--dims M=1024,N=1024,K=1024]
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider"]


def variants(count: int) -> list[tuple[str, str]]:
    """``count`` (label, source) SGEMM variants: register-tiled (BM, BN, TM, TN, VEC over the gemm_tiled example's
    body, 32 to 512 threads a block) first, then shared-memory-tiled (TILE 8, 16, 32)."""
    body = (ROOT / "examples" / "gemm_tiled" / "reg_tiled.cuh").read_text()
    smem = (ROOT / "benchmarks" / "loop_kernels" / "smem_tiled.cu").read_text()
    out = []
    for bm, bn, tm, tn, vec in itertools.product((64, 128, 32), (64, 128, 32), (4, 8, 2), (4, 8), (1, 0)):
        threads = (bm // tm) * (bn // tn)
        if 32 <= threads <= 512:  # 128-bit stores of C need TN % 4 == 0: TN is 4 or 8
            head = f"#define BM {bm}\n#define BN {bn}\n#define TM {tm}\n#define TN {tn}\n#define VEC {vec}\n"
            out.append((f"reg{bm}x{bn}_{tm}x{tn}_v{vec}", head + body))
    for tile in (8, 16, 32):
        out.append((f"smem{tile}", f"#define TILE {tile}\n" + smem))
    if len(out) < count:
        raise SystemExit(f"only {len(out)} variants; ask for fewer branches")
    return out[:count]


def pytest(args: list[str], cwd: Path, log: Path) -> tuple[int, float]:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run([*PYTEST, *args], cwd=cwd, stdout=f, stderr=subprocess.STDOUT, timeout=900).returncode
    return rc, time.perf_counter() - t0


def one_run(work: Path, n: int, branches: int, dims: str) -> dict:
    """Set up, write the branches, close; returns the figures of the close."""
    work.mkdir(parents=True, exist_ok=True)
    for name in ("gemm.cu", "ref.py"):
        shutil.copy(ROOT / "examples" / "gemm" / name, work / name)
    rc, init_s = pytest(["--kopt-baseline", "gemm.cu", "--kopt-ref", "ref.py", "--kopt-dims", dims, "--kopt-seed", "1",
                         "--kopt-init", "--kopt-iterations", "1", "--kopt-branches", str(branches), "--kopt-json",
                         "init.json"], work, work / "init.log")
    init = json.loads((work / "init.json").read_text())
    run_dir = Path(init["loop"]["run_dir"])
    it = run_dir / "iterv1"
    if not it.is_dir():
        raise SystemExit(f"set-up stopped (exit {rc}): {init['loop']['message']}")
    for k, (_, src) in enumerate(variants(branches), start=1):
        (it / "branches" / f"b{k}" / "kernel.cu").write_text(src)
    budget = json.loads((it / "roofline.json").read_text())["axis_budget"]
    method = "compute.register_tiling" if budget.get("compute") else "memory.shared_memory_tiling"
    (it / "methods.json").write_text(json.dumps({"methods": [{
        "id": method, "rationale": "throughput.py: tile and thread-tile variants",
        "override_reason": "a fixed plan, timed whatever the trigger says"}]}))
    rc, close_s = pytest([f"--kopt-run={run_dir}", "-n", str(n), "--kopt-json", "close.json"], work, work / "close.log")
    doc = json.loads((work / "close.json").read_text())
    per_gate: dict[str, list[float]] = {}
    for item in doc["items"]:
        per_gate.setdefault(item["gate"], []).append(item["duration_s"])
    loop = doc.get("loop") or {}
    verdicts = {b["branch"]: (b["status"], b.get("median_ms")) for b in loop.get("branches") or []}
    return {"n": n, "init_s": init_s, "close_s": close_s, "close_rc": rc, "per_gate": per_gate,
            "verdicts": verdicts, "champion": loop.get("champion"), "message": loop.get("message")}


def report(r: dict, branches: int) -> None:
    per_min = branches / (r["close_s"] / 60)
    print(f"-n {r['n']}: set-up {r['init_s']:.1f} s; close of {branches} branches {r['close_s']:.1f} s (exit "
          f"{r['close_rc']}): {per_min:.1f} candidates per GPU-minute; champion {r['champion']}")
    print(f"  {'gate':<12} {'items':>5} {'sum s':>8} {'max s':>7}")
    for gate, d in r["per_gate"].items():
        print(f"  {gate:<12} {len(d):>5} {sum(d):>8.1f} {max(d):>7.2f}")
    passed = sum(v[0] == "PASSED" for v in r["verdicts"].values())
    print(f"  {passed} of {len(r['verdicts'])} branches passed; {r['message']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--compare", type=int, default=None)
    ap.add_argument("--branches", type=int, default=32)
    ap.add_argument("--dims", default="M=1024,N=1024,K=1024")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    base = Path(a.out or tempfile.mkdtemp(prefix="kopt-throughput-"))
    first = one_run(base / f"n{a.n}", a.n, a.branches, a.dims)
    report(first, a.branches)
    if a.compare:
        second = one_run(base / f"n{a.compare}", a.compare, a.branches, a.dims)
        report(second, a.branches)
        same = {k: v[0] for k, v in first["verdicts"].items()} == {k: v[0] for k, v in second["verdicts"].items()}
        print(f"verdicts {'agree' if same else 'DIFFER'}; champions {first['champion']} and {second['champion']}")


if __name__ == "__main__":
    main()
