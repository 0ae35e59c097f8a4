"""One close of a walkthrough run, as an agent acts on the --kopt-json report alone (docs/loop-walkthrough.md).

Reads the newest report in FOLDER (``init.json`` or ``close<i>.json``), runs its ``loop.next.command`` with this
interpreter and a report path of its own; when the close asks for the champion's ablations
(``loop.next.action == "write_ablations"``) it copies the ones the agent wrote beforehand for each possible
champion, ``FOLDER/plan/iterv<i>/<champion>/<method>/kernel.*``, to the paths the report names, and runs the next
command. Prints one line per step: step, exit code, wall seconds, the report's message.

    python3 benchmarks/walk_agent.py .walk/gemm
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path


def newest_report(folder: Path) -> Path:
    reports = sorted(folder.glob("close*.json"), key=lambda p: p.stat().st_mtime)
    return reports[-1] if reports else folder / "init.json"


def write_plan(folder: Path, nxt: dict) -> None:
    """Copy the agent's iteration ``FOLDER/plan/iterv<i>/`` (methods.json, branches/b<k>/kernel.*) to the paths
    ``next.write`` names, unless the iteration already holds a methods.json."""
    it = Path(nxt["write"][0]).parent  # .../iterv<i>/methods.json
    plan = folder / "plan" / it.name
    if (it / "methods.json").exists() or not plan.is_dir():
        return
    shutil.copy2(plan / "methods.json", it / "methods.json")
    for path in nxt["write"][1:]:
        dst = Path(path)
        if dst.parent.parent.name == "branches":
            src = plan / "branches" / dst.parent.name / dst.name
            if src.is_file():
                shutil.copy2(src, dst)


def step(folder: Path, report: Path, label: str) -> dict:
    """Run the command the report names; returns the new report's loop section."""
    nxt = json.loads(report.read_text())["loop"]["next"]
    cmd = list(nxt["command"])
    out = folder / f"{label}.json"
    if "--kopt-json" in cmd:
        cmd[cmd.index("--kopt-json") + 1] = str(out)
    else:
        cmd += ["--kopt-json", str(out)]
    t0 = time.time()
    with open(folder / f"{label}.log", "w") as log:
        rc = subprocess.call([*cmd, "-p", "no:randomly"], stdout=log, stderr=subprocess.STDOUT)
    loop = (json.loads(out.read_text()).get("loop") or {}) if out.is_file() else {}
    print(f"{folder.name} {label} rc={rc} wall={time.time() - t0:.1f}s action={(loop.get('next') or {}).get('action')}"
          f" :: {loop.get('message')}", flush=True)
    return loop


def main() -> int:
    folder = Path(sys.argv[1])
    report = newest_report(folder)
    loop = json.loads(report.read_text()).get("loop") or {}
    i = (loop.get("next") or {}).get("iteration")
    if (loop.get("next") or {}).get("action") not in ("write_and_close", "write_ablations"):
        print(f"{folder.name}: nothing to run, next action {(loop.get('next') or {}).get('action')}")
        return 1
    if loop["next"]["action"] == "write_and_close":
        if not (folder / "plan" / f"iterv{i}").is_dir():  # iterations 2 and 3: chosen from this report
            subprocess.check_call([sys.executable, "docs/walkthrough/plan.py", folder.name, str(i),
                                   str(folder / "plan"), str(report)])
        write_plan(folder, loop["next"])
    label = f"close{i}" if loop["next"]["action"] == "write_and_close" else f"close{i}b"
    loop = step(folder, report, label)
    error = (json.loads((folder / f"{label}.json").read_text()).get("error") or {}) \
        if (folder / f"{label}.json").is_file() else {}
    problems = error.get("problem_details") or []
    if problems and all(p["rule"] == "trigger" for p in problems):
        # SKILL.md 3c: a method whose trigger does not hold needs override_reason; the agent keeps its choice and
        # says why (its rationale), once
        it = Path(loop["next"]["command"][4]) / f"iterv{i}"
        doc = json.loads((it / "methods.json").read_text())
        for m in doc["methods"]:
            hit = next((p for p in problems if p["method"] == m["id"]), None)
            if hit:
                m["override_reason"] = f"{hit['metric']} = {hit['value']:g}, yet {m['rationale']}"
        (it / "methods.json").write_text(json.dumps(doc, indent=2) + "\n")
        print(f"{folder.name}: methods.json overridden for {len(problems)} trigger(s): "
              f"{[p['message'] for p in problems]}", flush=True)
        loop = step(folder, folder / f"{label}.json", label + "o")
    nxt = loop.get("next") or {}
    if nxt.get("action") == "write_ablations":
        champ = nxt["champion"]
        for w in nxt["ablations"]:
            src = folder / "plan" / f"iterv{nxt['iteration']}" / champ / w["method"]
            kernel = next(src.glob("kernel.*"), None) if src.is_dir() else None
            if kernel is None:
                print(f"{folder.name}: no prepared ablation {src} for champion {champ}")
                continue
            dst = Path(w["kernel"]).with_suffix(kernel.suffix)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(kernel, dst)
            Path(w["base"]).write_text(champ + "\n")
        step(folder, folder / f"{label}.json", f"close{nxt['iteration']}b")
    return 0


if __name__ == "__main__":
    sys.exit(main())
