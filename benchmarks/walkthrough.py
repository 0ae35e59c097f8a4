"""docs/loop-walkthrough.md, generated from a driven run's files, never typed: every figure it quotes is read from
the run directory (state.json, each iteration's branch_results.json, attribution.json, sass_check.json,
decision*.json, env*.json, methods.json) and from what ``benchmarks/drive_loop.py`` left beside it (``steps.jsonl``:
each command, its exit code and wall time; the reports).

    python3 benchmarks/walkthrough.py WORKDIR [--title TEXT] [--assets DIR] [--out docs/loop-walkthrough.md]

``--assets DIR`` copies the run's summary.md, plots and per-iteration attribution.json into DIR (the page links
them). The page ends with the closing note the acceptance asks for: the commands, each step's exit code and wall
time, and the residual of every iteration.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from pytest_kopt.loop.decisions import NOT_ADDITIVE


def read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def ms(v: Any) -> str:
    return f"{v:.4f} ms" if isinstance(v, (int, float)) else "—"


def pct(v: Any) -> str:
    return f"{v:+.1f}%" if isinstance(v, (int, float)) else "inconclusive"


def ci(v: Any) -> str:
    return f" [{v[0]:.4f}, {v[1]:.4f}]" if isinstance(v, list) and len(v) == 2 and None not in v else ""


def machine(env: dict[str, Any] | None) -> str:
    """A machine in a few words: the GPU's name and UUID prefix, or why there was none."""
    if not env:
        return "unknown"
    g = env.get("gpu") or {}
    if g:
        return f"{g.get('name')} ({str(g.get('uuid'))[:12]}…, {env.get('sm_arch')})"
    if env.get("standin"):
        return "no GPU: the CPU stand-ins for the timing and ncu gates (benchmarks/kopt_standin.py)"
    return f"no GPU ({env.get('reason')})"


def shell(cmd: list[str], workdir: Path) -> str:
    """A command as a line a person can paste: the interpreter as ``python3``, the work folder's paths relative."""
    out = []
    for a in cmd:
        a = a.replace(str(workdir) + os.sep, "")
        out.append("python3" if a == sys.executable or a.endswith("/python3") or a.endswith("/python") else a)
    return " ".join(out)


def top_line(top: dict[str, Any]) -> str:
    parts = []
    for axis, rows in (top.get("top") or {}).items():
        shown = ", ".join(f"{r['name']} {r['value']:.1f}" for r in rows[:3] if isinstance(r.get("value"), (int, float)))
        if shown:
            parts.append(f"{axis}: {shown}")
    return "; ".join(parts) or "—"


def iteration(run: Path, h: dict[str, Any], steps: list[dict[str, Any]], here: Any) -> list[str]:
    """One iteration's section, from its folder and its history entry."""
    i = h["iter"]
    it = run / f"iterv{i}"
    roof = read(it / "roofline.json") or {}
    top = read(it / "ncu_top.json") or {}
    methods = read(it / "methods.json") or {}
    br = read(it / "branch_results.json") or {}
    sass = read(it / "sass_check.json") or {}
    b = roof.get("axis_budget") or {}
    out = [f"## Iteration {i}", ""]
    envs = [("branch step", read(it / "env.json")), ("ablation step", read(it / "env_ablations.json"))]
    out.append("- **Machine:** " + "; ".join(f"{w}: {machine(e)}" for w, e in envs if e))
    out.append(f"- **Evidence** (profile of `{here(top.get('evidence_of') or '?')}`): budget c/m/l "
               f"{b.get('compute')}/{b.get('memory')}/{b.get('latency')}, bound {roof.get('bound')}; "
               f"{top_line(top)}.")
    out.append("- **Methods** (methods.json):")
    for m in methods.get("methods") or []:
        mid = m if isinstance(m, str) else m.get("id")
        why = "" if isinstance(m, str) else f": {m.get('rationale') or ''}"
        over = "" if isinstance(m, str) or not m.get("override_reason") else f" (override: {m['override_reason']})"
        out.append(f"  - `{mid}`{why}{over}")
    out.append("- **Branches** (branch_results.json):")
    for r in br.get("branches") or []:
        state = "" if r.get("passed") else f" — {r.get('status')} at {r.get('stage')}"
        retimed = " (re-timed on one GPU)" if r.get("gate_median_ms") not in (None, r.get("median_ms")) else ""
        out.append(f"  - {r['branch']}: {ms(r.get('median_ms'))}{ci(r.get('ci95_ms'))}{retimed}{state}")
    for name in ("decision.json", "decision_ablations.json"):
        d = read(it / name)
        if d:
            out.append(f"- **Same-GPU decision** ({name}): re-timed on {d.get('gpu_uuid')}: "
                       + ", ".join(f"{k} {ms(v)}" for k, v in (d.get("retimed_ms") or {}).items()))
    out.append(f"- **Champion** {h['champion']} {ms(h['champion_ms'])} against the best so far "
               f"{ms(h.get('previous_best_ms'))} ({h.get('previous_best_source', 'state')}): "
               f"{'improved' if h['improved'] else 'not improved'}"
               f"{'; its SASS is the best kernel' + chr(39) + 's' if h.get('same_sass_as_best') else ''}.")
    out.append("- **Ablations** (attribution.json, sass_check.json):")
    for m in h.get("methods", []):
        a = (h.get("attribution") or {}).get(m) or {}
        why = "" if a.get("attribution_pct") is not None else f" ({a.get('reason')})"
        found = ((sass.get("evidence") or {}).get(m) or {}).get("found") or []
        out.append(f"  - `{m}`: without it {ms(a.get('ms_without'))}, attribution {pct(a.get('attribution_pct'))}"
                   f"{why}; SASS {(h.get('sass') or {}).get(m)}{' (' + ', '.join(found) + ')' if found else ''}; "
                   f"**{(h.get('verdicts') or {}).get(m)}**")
    res = h.get("residual")
    if res:
        share = res.get("residual_pct_of_gain")
        out.append(f"- **Residual, {res['label']}:** {ms(res['residual_ms'])} of a {ms(res['gain_ms'])} gain"
                   f"{'' if share is None else f' ({share:.1f}%)'}; the methods explain {ms(res['explained_ms'])}.")
        # runs closed before the residual carried its note: the same rule, from the same figures
        note = res.get("note") or (NOT_ADDITIVE if res["gain_ms"] > 0 and res["residual_ms"] < 0 else None)
        if note:
            out.append(f"  {note[0].upper()}{note[1:]}.")
    out.append(f"- Verified iteration: {h.get('verified')}.")
    mine = [s for s in steps if s["step"].endswith(f"iterv{i}") or s["step"].endswith(f"iterv{i}b")]
    if mine:
        out.append("- Steps: " + "; ".join(f"`{s['step']}` exit {s['exit_code']} in {s['wall_s']:.1f} s "
                                            f"({s.get('stage')})" for s in mine) + ".")
    return out + [""]


def render(workdir: Path, title: str, assets: Path | None, docs: Path | None) -> str:
    steps = [json.loads(ln) for ln in (workdir / "steps.jsonl").read_text().splitlines() if ln.strip()]
    init = read(workdir / "init.json") or {}
    origin = str(init["loop"]["run_dir"])  # where the run was driven (another machine's path, maybe)
    run = Path(origin) if Path(origin).is_dir() else workdir / Path(origin).name
    state = read(run / "state.json")

    def here(path: str) -> str:
        """A path the run's files hold, inside the run (or the work folder) as a relative path."""
        return str(path).replace(origin + "/", "").replace(str(Path(origin).parent) + "/", "")
    base, best = state.get("baseline_ms"), state.get("best_metric_ms")
    lines = [f"# {title}", "",
             f"Generated by `python3 benchmarks/walkthrough.py {workdir.name}` from the run's files (`steps.jsonl` "
             "written by `benchmarks/drive_loop.py`, the reports, `state.json`, each iteration's records); no figure "
             "on this page is typed. Regenerate it from another driven run the same way.", ""]
    if (read(run / "env.json") or {}).get("standin"):
        lines += ["**A stand-in run.** The times, ncu metrics and SASS opcodes below are what each kernel declared to "
                  "`benchmarks/kopt_standin.py` (the timing and ncu gates' stand-ins on a machine without a GPU), not "
                  "measurements; correctness was judged for real, on the CPU; every decision and record is the loop's "
                  "own. The H200 drive that replaces this page: `bash benchmarks/h200_drive.sh` (an fp32 transpose).",
                  ""]
    head = f"{ms(base)} → {ms(best)}" + (f", **{base / best:.2f}x**" if base and best else "")
    end = (f"finished by the agent: {state.get('stop_reason')}" if state.get("completion") == "finished"
           else f"{state.get('run_status')} ({state.get('completion') or state.get('stop_reason')})")
    lines += [f"**Where it got to:** {head}, {state.get('verified_iterations')} verified iteration(s); run {end}.",
              f"Best kernel `{here(state.get('best_file'))}`; method buckets: "
              + "; ".join(f"{b} {', '.join(state.get(f'{b}_methods') or []) or '—'}"
                          for b in ("effective", "ineffective", "implementation_failed", "unverified")) + ".", ""]
    gpus = {machine(read(p)) for p in sorted(run.glob("iterv*/env*.json"))} | {machine(read(run / "env.json"))}
    drive = read(workdir / "drive.json") or {}
    lines += ["## How it was driven", "",
              *([f"- The drive: `{' '.join(drive['argv'])}` (started {drive.get('started')})."] if drive else []),
              "- The agent's hands: `benchmarks/drive_loop.py`; it wrote only where `loop.next` said and ran only "
              "`loop.next.command` (with its own `--kopt-json` path). The agent's head: the plan file "
              "(`--plan`), reading the report's fields.",
              f"- The run: `{run.name}`, {state.get('iterations_total')} iterations at most, "
              f"{state.get('branches')} branches, ncu_num {state.get('ncu_num')}, numerics mode "
              f"{state.get('numerics_mode')}, dims `{json.dumps(state.get('dims'))}`, seeds "
              f"{state.get('validation_seeds')}.",
              f"- The machines: {'; '.join(sorted(gpus))}."
              + (" **The steps ran on more than one machine.**" if len(gpus) > 1 else ""), ""]
    env0 = read(run / "baseline" / "env.json") or {}
    bench = read(run / "baseline" / "bench.json") or {}
    roof = read(run / "baseline" / "roofline.json") or {}
    top = read(run / "baseline" / "ncu_top.json") or {}
    b = roof.get("axis_budget") or {}
    init_step = next((x for x in steps if x["step"] == "init"), None)
    lines += ["## Set-up", "", f"- Machine: {machine(env0 or read(run / 'env.json'))}."]
    if bench or roof:
        lines += [f"- Baseline {ms(bench.get('median_ms'))}{ci([(bench.get('distribution') or {}).get(k) for k in ('ci95_low_ms', 'ci95_high_ms')])}; "
                  f"ncu set `{top.get('set')}` (pinned for the run); budget c/m/l {b.get('compute')}/{b.get('memory')}/"
                  f"{b.get('latency')}, bound {roof.get('bound')}, {roof.get('method')}.",
                  f"- Top metrics: {top_line(top)}."]
    if init_step:
        lines.append(f"- `init`: exit {init_step['exit_code']} in {init_step['wall_s']:.1f} s.")
    lines.append("")
    for h in state.get("history") or []:
        lines += iteration(run, h, steps, here)
    if state.get("completion") == "finished":
        stop = read(run / "stop.json") or {}
        left = (stop.get("details") or {}).get("left_open")
        lines += ["## Finish", "", f"- methods.json's `finish`: {stop.get('stop_reason')}",
                  f"- stop.json: exit code {stop.get('exit_code')}, stage `{stop.get('stop_stage')}`"
                  + (f"; {left} was opened and left unjudged" if left else "") + ".", ""]
    lines += ["## Closing note", "", "The commands, in order (the set-up's is the only one not taken from a "
              "report):", "", "```"]
    lines += [here(shell(s["command"], workdir)) for s in steps]
    lines += ["```", "", "| step | exit code | wall s | report status | stage | next | message |",
              "|---|---|---|---|---|---|---|"]
    for s in steps:
        msg = here(str(s.get("message") or "").replace("|", "\\|").replace(str(workdir) + "/", ""))
        lines.append(f"| {s['step']} | {s['exit_code']} | {s['wall_s']:.1f} | {s.get('status')} | {s.get('stage')} | "
                     f"{s.get('action')} | {msg} |")
    lines += ["", "| iteration | champion ms | against best ms | gain ms | explained ms | residual ms (not explained "
              "by any method) | residual % of gain |", "|---|---|---|---|---|---|---|"]
    for h in state.get("history") or []:
        r = h.get("residual") or {}
        share = r.get("residual_pct_of_gain")
        lines.append(f"| {h['iter']} | {h['champion_ms']:.4f} | {ms(h.get('previous_best_ms'))[:-3]} | "
                     f"{ms(r.get('gain_ms'))[:-3]} | {ms(r.get('explained_ms'))[:-3]} | "
                     f"{ms(r.get('residual_ms'))[:-3]} | {'—' if share is None else f'{share:.1f}'} |")
    lines.append("")
    if assets is not None:
        assets.mkdir(parents=True, exist_ok=True)
        for name in ("summary.md", "speedup.png", "roofline_drift.png", "state.json", "stop.json"):
            if (run / name).is_file():
                shutil.copy2(run / name, assets / name)
        for h in state.get("history") or []:
            for name in ("attribution.json", "sass_check.json", "analysis.md"):
                src = run / f"iterv{h['iter']}" / name
                if src.is_file():
                    shutil.copy2(src, assets / f"iterv{h['iter']}_{name}")
        shutil.copy2(workdir / "steps.jsonl", assets / "steps.jsonl")
        rel = os.path.relpath(assets, docs) if docs else str(assets)
        lines += [f"The run's files: [summary.md]({rel}/summary.md), [speedup]({rel}/speedup.png), "
                  f"[roofline drift]({rel}/roofline_drift.png), [state.json]({rel}/state.json), "
                  f"[steps.jsonl]({rel}/steps.jsonl), and per iteration `{rel}/iterv<i>_attribution.json`, "
                  "`_sass_check.json`, `_analysis.md`.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--title", default="The loop driven as an agent drives it")
    ap.add_argument("--assets", type=Path, help="copy the run's summary, plots and records here")
    ap.add_argument("--out", type=Path, help="write the page here (default: stdout)")
    args = ap.parse_args()
    text = render(args.workdir.resolve(), args.title, args.assets.resolve() if args.assets else None,
                  args.out.resolve().parent if args.out else None)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
