"""The trust boundary on a GPU: a correct Triton row softmax whose process rewraps kopt's kernel-only timing and
``torch.cuda.Event.elapsed_time`` so every time reads a 64th of the truth (tests/redteam/timer_patch.py), judged
alone, in the PR gate against its honest twin (tests/redteam/honest_triton.py), and as a branch of a loop's close
beside that twin. Prints one line per step: exit code, wall time, and the verdicts from the JSON reports.

    python3 benchmarks/trust_gpu.py [--out DIR] [--dims M=4096,N=1024]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REDTEAM = ROOT / "tests" / "redteam"
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider"]


def run(args: list[str], cwd: Path, log: Path) -> tuple[int, float]:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run([*PYTEST, *args], cwd=cwd, stdout=f, stderr=subprocess.STDOUT, timeout=600).returncode
    return rc, time.perf_counter() - t0


def verdicts(report: Path) -> dict[str, str]:
    """kernel name -> its status at the gate that decided it (``status@gate``), and each comparison."""
    doc = json.loads(report.read_text())
    out = {k["name"]: f"{k['status']}" + (f"@{k['failed_gate']}" if k.get("failed_gate") else "")
           + (f" {k['median_ms']:.4f} ms" if k.get("median_ms") else "") for k in doc.get("kernels") or []}
    for c in doc.get("comparisons") or []:
        out[f"PR {Path(c['candidate']).name}"] = f"{c['verdict']}" + (f" speedup {c['speedup']:.3f}x"
                                                                      if c.get("speedup") else "")
    tampered = [i for i in doc["items"] if i["status"] == "TAMPERED"]
    if tampered:
        out["first TAMPERED"] = f"{tampered[0]['nodeid']}: {tampered[0]['message'][:160]}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--dims", default="M=4096,N=1024")
    a = ap.parse_args()
    work = Path(a.out or tempfile.mkdtemp(prefix="kopt-trust-"))
    work.mkdir(parents=True, exist_ok=True)
    for name in ("timer_patch.py", "honest_triton.py", "ref_softmax.py"):
        shutil.copy(REDTEAM / name, work / name)
    common = ["--kopt-ref", "ref_softmax.py", "--kopt-dims", a.dims, "--kopt-seeds", "3"]
    rows = []
    rc, wall = run(["--kopt-baseline", "timer_patch.py", *common, "--kopt-json", "alone.json"], work,
                   work / "alone.log")
    rows.append(("alone", rc, wall, verdicts(work / "alone.json")))
    rc, wall = run(["--kopt-baseline", "honest_triton.py", "--kopt-candidate", "timer_patch.py", "--kopt-fail-slower",
                    "3", *common, "--kopt-json", "pr.json"], work, work / "pr.log")
    rows.append(("PR gate", rc, wall, verdicts(work / "pr.json")))
    # the loop: set up on the honest kernel, then a close whose branches are its twin and the clock-patcher
    base = work / "loop"
    base.mkdir(exist_ok=True)
    for name in ("honest_triton.py", "ref_softmax.py"):
        shutil.copy(work / name, base / name)
    rc, wall = run(["--kopt-baseline", "honest_triton.py", *common, "--kopt-init", "--kopt-iterations", "1",
                    "--kopt-branches", "2", "--kopt-json", "init.json"], base, base / "init.log")
    init = json.loads((base / "init.json").read_text())
    rows.append(("loop set-up", rc, wall, {"loop": f"exit {init['loop']['exit_code']}: {init['loop']['message'][:140]}"}))
    run_dir = Path(init["loop"]["run_dir"])
    it = run_dir / "iterv1"
    if it.is_dir():
        budget = json.loads((it / "roofline.json").read_text())["axis_budget"]
        axis = next((ax for ax in ("memory", "latency", "compute") if budget.get(ax)), "memory")
        method = {"memory": "memory.vectorized_access", "latency": "latency.occupancy_tuning",
                  "compute": "compute.loop_unroll"}[axis]
        (it / "methods.json").write_text(json.dumps({"methods": [{
            "id": method, "rationale": "trust_gpu.py: the branches are the honest kernel and its clock-patching twin",
            "override_reason": "a fixed plan: the branches test the gates, not the method"}]}))
        shutil.copy(work / "honest_triton.py", it / "branches" / "b1" / "kernel.py")
        shutil.copy(work / "timer_patch.py", it / "branches" / "b2" / "kernel.py")
        rc, wall = run([f"--kopt-run={run_dir}", "-n", "2", "--kopt-json", "close.json"], base, base / "close.log")
        close = json.loads((base / "close.json").read_text())
        loop = close.get("loop") or {}
        br = {b["branch"]: f"{b['status']}" + (f"@{b['stage']}" if b.get("stage") else "")
              + (f" {b['median_ms']:.4f} ms" if b.get("median_ms") else "") for b in loop.get("branches") or []}
        rows.append(("loop close", rc, wall, {**br, "champion": str(loop.get("champion")),
                                              "message": str(loop.get("message"))[:160]}))
    print(f"{'step':<12} {'exit':>4} {'wall s':>7}  verdicts")
    for step, rc, wall, v in rows:
        print(f"{step:<12} {rc:>4} {wall:>7.1f}  " + "; ".join(f"{k}: {x}" for k, x in v.items()))


if __name__ == "__main__":
    main()
