"""Where an 8-branch compile session's wall time goes: the ``-n 0`` row of ``loop_speed.py`` (8 distinct ``.cu``
branches, ``-k compile``, a fresh cache each run), with a timeline of pytest's phases and each nvcc build.

Run as a script, it runs that session ``--runs`` times, each as ``python3 -m pytest -p kopt_timeline`` (the
plugin beside this file, which writes one JSON line per stamp to ``$KOPT_TIMELINE``), and prints per run the seconds
from the process's start to: the first kopt hook (the plugins imported), the GPU probe's end, collection's end, the
first and last build's start and end, the terminal summary's end, and the process's exit. Also the serial floor
(the 8 builds through ``build_cuda`` one after another, no pytest) and each run's speed-up over it.

Usage (any machine with nvcc; the GPU machine for the figures of docs/loop.md):
    python3 benchmarks/compile_timeline.py [--runs 2] [--arch sm_90a]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kopt_timeline import read  # noqa: E402  (beside this file)


def session(work: Path, names: list[str], run: int, arch: str | None) -> dict[str, float]:
    """One ``-n 0`` compile session; seconds from its start to each stamp (first and last of repeated ones)."""
    log = work / f"timeline{run}.jsonl"
    env = {**os.environ, "KOPT_TIMELINE": str(log),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    cands = [x for n in names[1:] for x in ("--kopt-candidate", n)]
    args = [sys.executable, "-m", "pytest", "-p", "kopt_timeline", "-p", "no:randomly", "-p", "no:xdist", "-q",
            "--kopt-baseline", names[0], *cands, "--kopt-ref", "ref.py", "--kopt-dims", "M=256,N=256,K=64",
            "-k", "compile", "--kopt-seeds", "1", "-o", f"cache_dir=.c{run}", *(["--kopt-arch", arch] if arch else [])]
    t0 = time.time()
    proc = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True)
    return {**read(str(log), t0), "exit": time.time() - t0, "rc": proc.returncode}


def main() -> None:
    from loop_speed import serial_floor, write_branches

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--arch", default=None, help="passed as --kopt-arch (default: the session detects it)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        names = write_branches(work)
        runs = [session(work, names, i, a.arch) for i in range(a.runs)]
        floor = serial_floor(work, names, a.arch or "sm_90a")[2]
    rows = [("first kopt hook (plugins imported)", "configure (first)"), ("GPU probe done", "probe_end (last)"),
            ("collection done", "collected (first)"), ("first build started", "build_start (first)"),
            ("last build done", "build_end (last)"), ("terminal summary done", "summary_end (last)"),
            ("process exit", "exit")]
    print(f"{'stamp (s from the start)':<36}" + "".join(f"{f'run {i + 1}':>9}" for i in range(len(runs))))
    for label, key in rows:
        print(f"{label:<36}" + "".join(f"{r[key]:9.2f}" if key in r else f"{'-':>9}" for r in runs))
    print(f"{'exit code':<36}" + "".join(f"{int(r['rc']):9d}" for r in runs))
    print(f"\nserial floor (8 build_cuda one by one): {floor:.2f} s; speed-up per run: "
          + ", ".join(f"{floor / r['exit']:.2f}x" for r in runs))


if __name__ == "__main__":
    main()
