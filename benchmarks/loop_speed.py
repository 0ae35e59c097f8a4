"""The loop's own speed, CPU part: parallel compile of 8 .cu branches, build-cache hits, and the plugin's overhead
for collecting 64 candidates (CPU seconds and peak memory of the controller).

The anchor for the compile rows is the serial floor: the same 8 builds run one after another through
:func:`pytest_kopt.kinds.nvcc.build_cuda` (nvcc with kopt's flags, no pytest), which is what a loop that compiles
its branches in turn pays. kopt starts every build of a session ahead of its compile item (the session's scheduler,
``Scheduler.start_builds``: at the first item, or at configure where the arch is known before the GPU probe), so
``-n 0`` compiles in parallel too;
the speed-up printed is the serial floor over each kopt row. Where that row's time goes: ``compile_timeline.py``.

The GPU part (set-up and close of an iteration at 4096^3) is ``benchmarks/loop_gemm.py``, which prints the wall
time of each phase. Usage: python3 benchmarks/loop_speed.py [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = Path(__file__).resolve().parent / "loop_kernels"


def run(args: list[str], cwd: Path) -> tuple[int, float, float, int, str]:
    """(exit code, wall s, child CPU s, child peak RSS in MB, output) of one pytest process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", "-q", *args], cwd=cwd,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc.returncode, wall, cpu, after.ru_maxrss // 1024, proc.stdout + proc.stderr


def write_branches(work: Path) -> list[str]:
    """8 distinct ``.cu`` branches (the tiled SGEMM with different macros, so 8 real nvcc builds) and the
    reference ``ref.py`` in ``work``; returns the branches' file names."""
    shutil.copy(ROOT / "examples" / "gemm" / "ref.py", work / "ref.py")
    names = []
    for i in range(8):
        src = f"#define BM 64\n#define BN 64\n#define TM 4\n#define TN 4\n#define VEC {i % 2}\n// variant {i}\n"
        (work / f"b{i}.cu").write_text(src + (ROOT / "examples" / "gemm_tiled" / "reg_tiled.cuh").read_text())
        names.append(f"b{i}.cu")
    return names


def serial_floor(work: Path, names: list[str], arch: str) -> tuple[str, int, float, float, int, str]:
    """The 8 builds one after another, in this process, into a fresh cache: (label, rc, wall s, child CPU s, peak
    MB, note) like :func:`run`'s rows. ``arch`` is the target kopt built for (its compile item's figure)."""
    from pytest_kopt.kinds.nvcc import build_cuda
    from pytest_kopt.gates.hardware import find_tool, tool_version

    nvcc = find_tool("nvcc")
    version = tool_version(nvcc) if nvcc else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        for name in names:
            build_cuda(work / name, arch, Path(root), nvcc, version, False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return ("8 nvcc builds, one by one", 0, wall, cpu, after.ru_maxrss // 1024, f"{arch}, no pytest (the floor)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", default=str(os.cpu_count() or 2))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        names = write_branches(work)
        cands = [x for n in names[1:] for x in ("--kopt-candidate", n)]
        base = ["--kopt-baseline", names[0], *cands, "--kopt-ref", "ref.py", "--kopt-dims", "M=256,N=256,K=64",
                "-k", "compile", "--kopt-seeds", "1"]
        for label, extra, cache in (("compile 8 .cu, -n 0", ["-p", "no:xdist"], "c0"),
                                    (f"compile 8 .cu, -n {args.jobs}", ["-n", args.jobs], "c1"),
                                    (f"again, -n {args.jobs} (cache)", ["-n", args.jobs], "c1")):
            rc, wall, cpu, rss, out = run([*base, *extra, "-o", f"cache_dir=.{cache}", "--kopt-json", "r.json"],
                                          work)
            items = json.loads((work / "r.json").read_text())["items"]
            hits = sum(1 for i in items if i["gate"] == "compile" and (i.get("figures") or {}).get("cache_hit"))
            rows.append((label, rc, wall, cpu, rss, f"{hits}/8 build cache hits"))
        arch = next((i["figures"]["arch"] for i in json.loads((work / "r.json").read_text())["items"]
                     if i["gate"] == "compile" and (i.get("figures") or {}).get("arch")), "sm_90a")
        rows.insert(0, serial_floor(work, names, arch))
        many = []
        for i in range(64):
            shutil.copy(work / "b0.cu", work / f"c{i}.cu")
            many += ["--kopt-candidate", f"c{i}.cu"] if i else []
        rc, wall, cpu, rss, out = run(["--kopt-baseline", "c0.cu", *many, "--kopt-ref", "ref.py", "--kopt-dims",
                                       "M=256,N=256,K=64", "--kopt-seeds", "1,2,3,4,5", "--collect-only"], work)
        items = next((ln for ln in out.splitlines() if "tests collected" in ln or "collected" in ln), "")
        rows.append(("collect 64 candidates", rc, wall, cpu, rss, items.strip()))
    floor = rows[0][2]
    print(f"{'step':<30} {'rc':>3} {'wall s':>8} {'CPU s':>8} {'peak MB':>8} {'serial/x':>8}  note")
    for label, rc, wall, cpu, rss, note in rows:
        ratio = f"{floor / wall:8.2f}" if label.startswith(("compile", "8 nvcc")) and wall > 0 else f"{'':8}"
        print(f"{label:<30} {rc:>3} {wall:>8.2f} {cpu:>8.2f} {rss:>8} {ratio}  {note}")


if __name__ == "__main__":
    main()
