"""Drive the optimization loop as an agent does: from the ``--kopt-json`` report alone (docs/loop-walkthrough.md is
generated from what this leaves: ``benchmarks/walkthrough.py``).

    python3 benchmarks/drive_loop.py WORKDIR --plan benchmarks/drive_plans/softmax_standin.py [--standin]

The plan (a Python file) is the agent's head: ``prepare(workdir)`` (puts the baseline and the reference there),
``SETUP`` (the first command's inputs: ``baseline``, ``ref``, ``dims``,
``iterations``, ``branches``, optional ``seeds`` and ``extra`` arguments) and ``decide(loop, run_dir, workdir)``, which
gets the report's ``loop`` section and returns what to write:

- for ``write_and_close``: ``{"methods": {...}, "branches": {"b1": source, ...}, "ablations": {method: (base,
  source)}}`` or ``{"finish": "<why>"}`` (methods.json then holds only that), or both ``methods`` and ``finish``;
- for ``write_ablations``: ``{method: source}``, the champion's ablation of each method the report asks for.

The hands (this file) write only where the report says (``next.write``, ``next.ablations``; for an optional
ablation, the report's ``ablation_pattern``) and run only ``next.command``, with its own ``--kopt-json`` path,
plus ``-p kopt_standin`` with ``--standin`` (the CPU stand-ins for the GPU gates: ``benchmarks/kopt_standin.py``).
The first command is the only one built here (the set-up: there is no report before it).

The drive's own command is kept in ``WORKDIR/drive.json``; each step is appended to ``WORKDIR/steps.jsonl``: its label, the command, its exit code and wall seconds, and the
report's status, stage, action and message. The drive stops at ``done``, at ``start_over`` and at a
``fix_and_rerun`` (the plan must think there: it is printed), or after ``--max-steps``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def load_plan(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("kopt_drive_plan", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_step(workdir: Path, label: str, command: list[str], report: Path, extra: list[str]) -> dict[str, Any]:
    """Run one command (its ``--kopt-json`` replaced by ``report``); record it; return the report's ``loop``."""
    cmd = [a for a in command if not a.startswith("--kopt-json")] + [f"--kopt-json={report}", *extra]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [env.get("PYTHONPATH")])])
    t0 = time.time()
    with open(workdir / f"{label}.log", "w") as log:
        rc = subprocess.call(cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, env=env)
    wall = time.time() - t0
    doc = json.loads(report.read_text()) if report.is_file() else {}
    loop = doc.get("loop") or {}
    nxt = loop.get("next") or {}
    row = {"step": label, "command": cmd, "exit_code": rc, "wall_s": round(wall, 2), "report": str(report),
           "status": doc.get("status"), "stage": loop.get("stage"), "action": nxt.get("action"),
           "message": loop.get("message"), "report_exit_code": doc.get("exit_code")}
    with open(workdir / "steps.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"{label}: exit {rc} in {wall:.1f} s, stage {row['stage']}, next {row['action']}: {row['message']}",
          flush=True)
    return loop


def write(path: str | Path, text: str) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def act(loop: dict[str, Any], plan: Any, workdir: Path) -> bool:
    """Write what the plan decides at the paths the report names. False when there is nothing to do."""
    nxt = loop.get("next") or {}
    run = Path(loop["run_dir"])
    action = nxt.get("action")
    if action == "write_and_close":
        want = plan.decide(loop, run, workdir)
        doc: dict[str, Any] = dict(want.get("methods") or {})
        if want.get("finish"):
            doc["finish"] = want["finish"]
        write(nxt["methods_file"], json.dumps(doc, indent=2) + "\n")
        for branch, source in (want.get("branches") or {}).items():
            write(nxt["branch_kernels"][branch], source)
        pattern = nxt.get("ablation_pattern") or {}
        for method, (base, source) in (want.get("ablations") or {}).items():
            write(pattern["kernel"].replace("{method}", method), source)
            write(pattern["base"].replace("{method}", method), base + "\n")
        return True
    if action == "write_ablations":
        want = plan.decide(loop, run, workdir)
        for a in nxt["ablations"]:
            write(a["kernel"], want[a["method"]])
            write(a["base"], nxt["champion"] + "\n")
        return True
    if action == "fix_and_rerun":
        print(json.dumps(loop.get("error") or nxt, indent=2))
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--plan", type=Path, required=True)
    ap.add_argument("--standin", action="store_true", help="the CPU stand-ins for the GPU gates (-p kopt_standin)")
    ap.add_argument("--max-steps", type=int, default=12)
    ap.add_argument("--resume", action="store_true", help="go on from the last step in WORKDIR/steps.jsonl")
    args = ap.parse_args()
    workdir = args.workdir.resolve()
    plan = load_plan(args.plan.resolve())
    extra = ["-p", "kopt_standin"] if args.standin else []
    if args.resume:
        rows = [json.loads(ln) for ln in (workdir / "steps.jsonl").read_text().splitlines() if ln.strip()]
        loop = (json.loads(Path(rows[-1]["report"]).read_text()).get("loop") or {})
        return drive(loop, plan, workdir, extra, len(rows), args.max_steps)
    if hasattr(plan, "prepare"):  # the baseline and the reference, as the plan wants them
        plan.prepare(workdir)
    (workdir / "steps.jsonl").unlink(missing_ok=True)
    rel = [os.path.relpath(a, HERE.parent) if os.path.isabs(a) and a.startswith(str(HERE.parent)) else a
           for a in sys.argv[1:]]
    (workdir / "drive.json").write_text(json.dumps({"argv": ["python3", "benchmarks/drive_loop.py", *rel],
                                                    "started": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
    s = plan.SETUP
    init = [sys.executable, "-m", "pytest", "--kopt-init", f"--kopt-baseline={s['baseline']}",
            f"--kopt-ref={s['ref']}", f"--kopt-dims={s['dims']}", f"--kopt-iterations={s['iterations']}",
            f"--kopt-branches={s['branches']}", *([f"--kopt-seeds={s['seeds']}"] if s.get("seeds") else []),
            *s.get("extra", [])]
    loop = run_step(workdir, "init", init, workdir / "init.json", extra)
    return drive(loop, plan, workdir, extra, 1, args.max_steps)


def drive(loop: dict[str, Any], plan: Any, workdir: Path, extra: list[str], first: int, max_steps: int) -> int:
    """Act on each report and run its next command, step ``first`` on, until there is nothing to do."""
    for n in range(first, first + max_steps):
        nxt = loop.get("next") or {}
        if not act(loop, plan, workdir):
            break
        report = Path(nxt["report"])  # where the command writes its report
        label = report.parent.name + ("b" if report.name == "report_ablations.json" else "")
        loop = run_step(workdir, f"{n:02d}_{label}", nxt["command"], report, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
