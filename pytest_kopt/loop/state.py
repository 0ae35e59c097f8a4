"""The run directory (SKILL.md steps 1-4): ``state.json`` and its merges, iterations opened and closed, stops.

Plain Python over files in SKILL.md's layout (``run_YYYYMMDD_HHMMSS/state.json``, ``baseline/``,
``iterv{i}/branches/b{k}/``, ``iterv{i}/ablations/<method>/``...). Only the pytest controller calls the writers,
once per session, atomically (:func:`pytest_kopt.artifacts.write_json`).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Mapping

from ..artifacts import read_dict, write_json, write_text
from ..errors import ConfigError
from .. import registry
from .decisions import classify, improved
from .summary import render_summary

#: The start of ``next.command``: pytest through this process's interpreter (an absolute path), so an agent that
#: runs the command gets the installation that wrote the report, not whatever ``python3`` is first on its PATH.
PYTEST = (sys.executable or "python3", "-m", "pytest")

STATE_SCHEMA = 5
#: SKILL.md: improvement and attribution are judged against a 2% noise threshold by default.
DEFAULT_NOISE_PCT = 2.0


def load_state(run_dir: Path) -> dict[str, Any]:
    """``state.json`` of a run. Raises FileNotFoundError when the folder is not a run."""
    return json.loads((run_dir / "state.json").read_text())


def save_state(run_dir: Path, updates: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``updates`` into the state on disk (never replace it wholesale) and write it atomically."""
    path = run_dir / "state.json"
    state = json.loads(path.read_text()) if path.is_file() else {}
    state.update(updates)
    write_json(path, state)
    return state


def new_run_dir(baseline: Path, now: _dt.datetime | None = None) -> Path:
    """``run_YYYYMMDD_HHMMSS/`` beside the baseline (a suffix ``_2``... when that second is taken)."""
    stamp = (now or _dt.datetime.now()).strftime("run_%Y%m%d_%H%M%S")
    path = baseline.parent / stamp
    n = 2
    while path.exists():
        path = baseline.parent / f"{stamp}_{n}"
        n += 1
    return path


def init_state(run_dir: Path, baseline: Path, ref: Path, dims: Mapping[str, Any], *, iterations: int,
               branches: int, ncu_num: int, noise_pct: float, numerics_mode: str, seeds: list[int],
               env: Mapping[str, Any]) -> dict[str, Any]:
    """Create the run folder, copy the baseline into ``baseline/`` and write SKILL.md's state (schema v5)."""
    (run_dir / "baseline").mkdir(parents=True, exist_ok=False)
    shutil.copy2(baseline, run_dir / "baseline" / baseline.name)
    write_json(run_dir / "env.json", dict(env))
    state = {"schema_version": STATE_SCHEMA, "run_dir": str(run_dir), "baseline_file": str(baseline),
             "ref_file": str(ref), "best_file": str(run_dir / "baseline" / baseline.name), "best_metric_ms": None,
             "best_ncu_rep": None, "env": dict(env), "iterations_total": iterations, "ncu_num": ncu_num,
             "branches": branches, "noise_threshold_pct": noise_pct, "numerics_mode": numerics_mode,
             "validation_seeds": list(seeds), "dims": dict(dims), "selected_methods": [], "effective_methods": [],
             "ineffective_methods": [], "implementation_failed_methods": [], "unverified_methods": [],
             "history": [], "roofline_history": [], "frontier": [], "run_status": "initializing",
             "generation_allowed": bool(env.get("generation_allowed")), "stop_reason": None, "stop_stage": None,
             "hardware_attempts": env.get("hardware_attempts", []), "verified_iterations": 0,
             "last_verified_iter": 0, "open_iter": None}
    write_json(run_dir / "state.json", state)
    return state


def stop_run(run_dir: Path, reason: str, stage: str, exit_code: int, details: Any = None) -> dict[str, Any]:
    """Record a stop (SKILL.md: every failure after state creation writes ``stop.json`` and ``run_status=stopped``)
    and render the stopped summary. Later iterations stay uncreated."""
    stop = {"stop_reason": reason, "stop_stage": stage, "exit_code": exit_code, "details": details,
            "time": _dt.datetime.now().isoformat(timespec="seconds")}
    write_json(run_dir / "stop.json", stop)
    state = save_state(run_dir, {"run_status": "stopped", "stop_reason": reason, "stop_stage": stage,
                                 "open_iter": None})
    write_text(run_dir / "summary.md", render_summary(state, run_dir))
    return stop


def open_iteration(run_dir: Path, i: int, *, ncu_rep: Path | None, roofline: Mapping[str, Any], branches: int,
                   ncu_top: Mapping[str, Any], evidence_of: str | None = None) -> Path:
    """Publish ``iterv{i}/`` once its pre-generation gates passed: the profile of the current best
    (``best_input.ncu-rep`` copied from ``ncu_rep``, ``ncu_top.json``), ``roofline.json``, an ``analysis.md``
    template, empty ``branches/b1..bK/`` and ``ablations/``. ``evidence_of`` names the kernel the evidence is of
    (recorded in ``ncu_top.json`` as ``evidence_of``; SKILL.md 3a: the current best)."""
    it = run_dir / f"iterv{i}"
    (it / "ablations").mkdir(parents=True, exist_ok=True)
    for k in range(1, branches + 1):
        (it / "branches" / f"b{k}").mkdir(parents=True, exist_ok=True)
    if ncu_rep is not None and ncu_rep.is_file():
        shutil.copy2(ncu_rep, it / "best_input.ncu-rep")
    top = dict(ncu_top)
    if evidence_of:
        top["evidence_of"] = evidence_of
    write_json(it / "ncu_top.json", top)
    write_json(it / "roofline.json", dict(roofline))
    if not (it / "analysis.md").exists():
        write_text(it / "analysis.md", analysis_template(i, roofline, ncu_top, branches))
    state = load_state(run_dir)
    save_state(run_dir, {"open_iter": i, "run_status": "iterating",
                         "roofline_history": [*state["roofline_history"], {"iter": i, **{
                             k: roofline.get(k) for k in ("delta_compute", "delta_memory", "delta_latency", "bound",
                                                          "near_peak", "axis_budget", "achieved_flops",
                                                          "arithmetic_intensity", "sol_pct_fp32")}}]})
    return it


def analysis_template(i: int, roofline: Mapping[str, Any], ncu_top: Mapping[str, Any], branches: int = 2) -> str:
    """``iterv{i}/analysis.md`` as the agent finds it: the evidence (gaps, budget, top metrics) and the sections
    to fill (SKILL.md 3c: selected methods with their evidence, skipped higher-priority methods and why)."""
    b = roofline.get("axis_budget") or {}
    lines = [f"# Iteration {i} analysis", "", "## Evidence (written by pytest-kopt)", "",
             f"- gaps: Δc={roofline.get('delta_compute')}, Δm={roofline.get('delta_memory')}, "
             f"Δl={roofline.get('delta_latency')} ({roofline.get('method')}); bound {roofline.get('bound')}",
             f"- axis budget: compute {b.get('compute')}, memory {b.get('memory')}, latency {b.get('latency')}"]
    for axis, rows in (ncu_top.get("top") or {}).items():
        shown = ", ".join(f"{r['name']} {r['value']:.1f}{'%' if r['unit'].startswith('%') else ''}" for r in rows)
        lines.append(f"- top {axis} metrics: {shown or '—'}")
    lines += ["", "## Selected methods (ids from registries/method_registry.json; also in methods.json)", "",
              "- ", "", "## Skipped higher-priority methods and why", "", "- ", "",
              "## Branch plan (same methods, different hyperparameters)", "",
              *(f"- b{k}: " for k in range(1, branches + 1)), ""]
    return "\n".join(lines)


def kernel_in(folder: Path) -> Path | None:
    """The ``kernel.cu`` or ``kernel.py`` of a branch/ablation folder, or None when the agent wrote none. Raises
    ConfigError when the folder holds both (which one is meant cannot be told)."""
    found = [folder / f"kernel{ext}" for ext in (".cu", ".py") if (folder / f"kernel{ext}").is_file()]
    if len(found) > 1:
        raise ConfigError(f"{folder} holds both kernel.cu and kernel.py", path=str(folder),
                          fix="keep the one this branch or ablation is, delete the other")
    return found[0] if found else None


def read_base(folder: Path) -> str:
    """The branch an ablation folder derives from: its ``base`` file's text (whitespace, a byte-order mark and a
    path to the branch reduced to the branch's name: ``branches/b2/`` is ``b2``), ``b1`` when there is no file.
    Raises ConfigError for a file that is not UTF-8 text."""
    path = folder / "base"
    if not path.is_file():
        return "b1"
    try:
        text = path.read_text(encoding="utf-8-sig").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text", path=str(path),
                          fix="write the branch name (b1, b2, ...) as plain text") from None
    return text.rstrip("/").rsplit("/", 1)[-1] if text else "b1"


def iteration_kernels(run_dir: Path, i: int) -> tuple[list[Path], dict[str, Path]]:
    """Branch kernels in ``b1..bK`` order and ablation kernels by method id, as written by the agent."""
    it = run_dir / f"iterv{i}"
    branch_dirs = sorted((it / "branches").glob("b*"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0))
    branches = [k for k in (kernel_in(d) for d in branch_dirs) if k is not None]
    ablations = {d.name: k for d in sorted((it / "ablations").glob("*")) if (k := kernel_in(d)) is not None}
    return branches, ablations



def next_step(run_dir: Path) -> dict[str, Any]:
    """What the agent does next, as data (the ``--kopt-json`` report's ``loop.next``): ``action``, the files to
    ``read`` (the evidence) and to ``write``, and the ``command`` to run (argv). Paths are absolute. Actions:

    - ``write_and_close`` while an iteration is open: ``methods.json``, one kernel per branch, optionally an
      ablation per selected method (``ablations/<method>/kernel.*`` with a ``base`` file naming its branch); with
      the axis ``budget``;
    - ``write_ablations`` after the first step of a close: the ``champion`` and, in ``ablations``, per method the
      ``kernel`` and ``base`` paths to write (``base`` holds the champion's name); the same command concludes;
    - ``done`` once completed, ``start_over`` once stopped (the ``--kopt-init`` command that seeds a new run, its
      report beside the baseline as ``kopt-init.json``); a stop for want of a GPU or tool (exit 3) says in
      ``requires`` where the command can succeed: here it would stop the same way."""
    state = load_state(run_dir)
    status = state.get("run_status")
    if status == "completed":
        return {"action": "done", "read": [str(run_dir / "summary.md"), str(run_dir / "state.json")],
                "write": [], "command": None}
    i = state.get("open_iter")
    if status == "stopped" or not i:
        stop = read_dict(run_dir / "stop.json") or {}
        base = Path(str(state.get("baseline_file") or run_dir))
        where = None
        if stop.get("exit_code") == 3:  # the machine, not the kernel: the same command here stops the same way
            where = ("a machine with an NVIDIA GPU, nvcc and ncu that can read its counters: this one stopped at "
                     f"{stop.get('stop_stage')} ({state.get('stop_reason')})")
        return {"action": "start_over", "reason": state.get("stop_reason"), "requires": where,
                "read": [str(run_dir / "state.json"), str(run_dir / "stop.json"), str(run_dir / "summary.md")],
                "write": [],
                "command": [*PYTEST, "--kopt-init", "--kopt-baseline", str(state.get("baseline_file")),
                            "--kopt-ref", str(state.get("ref_file")), "--kopt-dims", json.dumps(state.get("dims") or {}),
                            "--kopt-iterations", str(state.get("iterations_total") or 3),
                            "--kopt-branches", str(state.get("branches") or 4),
                            "--kopt-noise", str(state.get("noise_threshold_pct") or 2),
                            "--kopt-numerics-mode", str(state.get("numerics_mode") or "reference"),
                            "--kopt-json", str(base.parent / "kopt-init.json")]}
    it = run_dir / f"iterv{i}"
    ext = Path(str(state.get("baseline_file") or "kernel.cu")).suffix or ".cu"
    command = [*PYTEST, "--kopt-run", str(run_dir), "-n", "4", "--kopt-json",
               str(run_dir / f"iterv{i}" / "report.json")]
    pending = state.get("ablation_step")
    if pending and int(pending.get("iter", 0)) == int(i):
        champ = str(pending["champion"])
        cext = Path(str(pending.get("champion_kernel") or f"kernel{ext}")).suffix or ext  # the champion's language
        abl = [{"method": m, "kernel": str(it / "ablations" / m / f"kernel{cext}"),
                "base": str(it / "ablations" / m / "base")} for m in pending.get("needed", [])]
        command = [*command[:-1], str(it / "report_ablations.json")]  # the branch step's report stays as it was
        if pending.get("finalize"):
            command.append("--kopt-finalize")
        return {"action": "write_ablations", "iteration": int(i), "champion": champ,
                "champion_kernel": str(pending.get("champion_kernel")), "ablations": abl,
                "read": [str(it / "branch_results.json"), str(pending.get("champion_kernel")),
                         str(it / "kernel_ncu_top.json"), str(it / "kernel_roofline.json")],
                "write": [p for a in abl for p in (a["kernel"], a["base"])], "command": command}
    roof = read_dict(it / "roofline.json") or {}
    k = int(state.get("branches") or 4)
    top = read_dict(it / "ncu_top.json") or {}
    return {"action": "write_and_close", "iteration": int(i), "budget": roof.get("axis_budget"),
            "bound": roof.get("bound"), "evidence_of": top.get("evidence_of"),
            "top": {axis: [{"name": r.get("name"), "value": r.get("value"), "unit": r.get("unit")} for r in rows]
                    for axis, rows in (top.get("top") or {}).items()},
            "ablations_when": "optional here: written now with a base naming the eventual champion, the close takes "
                              "one step; otherwise the close asks for the champion's (action write_ablations)",
            # the registries the methods come from, where this install keeps them (site-packages for a wheel)
            "read": [str(it / n) for n in ("roofline.json", "ncu_top.json", "analysis.md")] + [str(run_dir / "state.json")]
            + [str(registry.path(n)) for n in (registry.METHODS, "optimization_catalog.md", "ncu_metrics_guide.md")],
            "write": [str(it / "methods.json"), *(str(it / "branches" / f"b{b}" / f"kernel{ext}") for b in range(1, k + 1)),
                      str(it / "ablations" / "<method id>" / f"kernel{ext}"), str(it / "ablations" / "<method id>" / "base")],
            "command": command}


def run_view(run_dir: Path) -> dict[str, Any]:
    """The run as the ``--kopt-json`` report's ``loop`` section shows it beside the step's own result: ``phase``
    (``iterating``, ``ablations`` while a close waits for the champion's ablations, ``completed``, ``stopped``),
    ``open_iter``, ``baseline_ms``, ``best_ms`` and ``best_file`` (the best kernel so far), ``verified_iterations``
    the method ``buckets`` (SKILL.md 3j: ``effective``, ``ineffective``, ``implementation_failed``,
    ``unverified``, each a list of method ids, with each method's latest ``reasons``) and every
    ``selected_methods`` so far (re-selecting one needs an ``override_reason``). {} when there is no state."""
    try:
        state = load_state(run_dir)
    except (OSError, json.JSONDecodeError):
        return {}
    status = state.get("run_status")
    phase = "ablations" if status == "iterating" and state.get("ablation_step") else status
    reasons: dict[str, str] = {}
    for h in state.get("history", []):
        for m, a in (h.get("attribution") or {}).items():
            pct = a.get("attribution_pct")
            sass = (h.get("sass") or {}).get(m)
            same = ("; the champion's SASS is the best kernel's, instruction for instruction (the method changed "
                    "nothing the GPU runs)" if h.get("same_sass_as_best") else "")
            reasons[m] = (f"iterv{h['iter']}: {(h.get('verdicts') or {}).get(m)}; attribution "
                          f"{'inconclusive (' + str(a.get('reason')) + ')' if pct is None else f'{pct:.1f}%'}; "
                          f"SASS {sass}{same}")
    buckets = {b: list(state.get(f"{b}_methods", [])) for b in
               ("effective", "ineffective", "implementation_failed", "unverified")}
    return {"phase": phase, "open_iter": state.get("open_iter"), "baseline_ms": state.get("baseline_ms"),
            "best_ms": state.get("best_metric_ms"), "best_file": state.get("best_file"),
            "verified_iterations": state.get("verified_iterations", 0), "buckets": buckets, "reasons": reasons,
            "selected_methods": list(state.get("selected_methods", []))}


def close_iteration(run_dir: Path, i: int, *, results: list[dict[str, Any]], champion: Mapping[str, Any],
                    methods: list[str], attr: Mapping[str, Mapping[str, Any]], sass: Mapping[str, str],
                    champion_roofline: Mapping[str, Any] | None, champion_bench: Mapping[str, Any],
                    best_ms_now: float | None = None, decision: Mapping[str, Any] | None = None,
                    sass_detail: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write ``branch_results.json``, ``attribution.json``, ``sass_check.json``, ``bench.json`` and the champion's
    ``kernel.<ext>`` into ``iterv{i}/``; update the method buckets, best, history and frontier (SKILL.md 3j).
    ``best_ms_now`` (ms): the best kernel so far re-timed beside the champion on one GPU (a multi-GPU session's
    decision), used instead of the stored ``best_metric_ms`` for the improvement test; ``decision``: that
    re-timing's record, kept in ``branch_results.json`` and the history."""
    it = run_dir / f"iterv{i}"
    state = load_state(run_dir)
    noise = float(state.get("noise_threshold_pct", DEFAULT_NOISE_PCT))
    write_json(it / "branch_results.json", {"iter": i, "branches": results, "champion": champion["branch"],
                                            "decision": dict(decision) if decision else None})
    write_json(it / "attribution.json", {"champion_ms": champion["median_ms"], "noise_threshold_pct": noise,
                                         "methods": dict(attr)})
    # status per method, and per method the opcodes looked for, found and missing (or why it cannot be shown)
    write_json(it / "sass_check.json", {"methods": dict(sass), "evidence": dict(sass_detail or {})})
    write_json(it / "bench.json", dict(champion_bench))
    src = Path(champion["kernel"])
    shutil.copy2(src, it / f"kernel{src.suffix}")
    buckets = {b: list(state.get(f"{b}_methods", [])) for b in
               ("effective", "ineffective", "implementation_failed", "unverified")}
    verdicts = {}
    same_sass = champion.get("same_sass_as_best") is True
    for m in methods:
        # a champion whose instructions are the best kernel's did not apply the method: its ablation measures a
        # property the best already had, so neither effective nor ineffective is shown
        bucket = "unverified" if same_sass else classify((attr.get(m) or {}).get("contributed"),
                                                          sass.get(m, "tool_error"))
        verdicts[m] = bucket
        for b in buckets:
            if m in buckets[b]:
                buckets[b].remove(m)
        buckets[bucket].append(m)
    best = state.get("best_metric_ms") if best_ms_now is None else best_ms_now
    is_better = improved(champion["median_ms"], best, noise)
    updates: dict[str, Any] = {f"{b}_methods": v for b, v in buckets.items()}
    updates["selected_methods"] = list(dict.fromkeys([*state.get("selected_methods", []), *methods]))
    if is_better:
        updates.update(best_file=str(it / f"kernel{src.suffix}"), best_metric_ms=champion["median_ms"],
                       best_ncu_rep=str(it / "kernel.ncu-rep"), best_gpu_uuid=champion.get("gpu_uuid"),
                       best_sass=dict(champion.get("sass_digest") or {}))
    # a close re-run after a crash between this write and the next iteration's opening replaces its own entries
    state["history"] = [h for h in state.get("history", []) if h.get("iter") != i]
    state["frontier"] = [f for f in state.get("frontier", []) if f.get("iter") != i]
    updates["frontier"] = [*state.get("frontier", []),
                           *[{"iter": i, **r} for r in results if r["branch"] != champion["branch"] and r.get("passed")]]
    updates["history"] = [*state.get("history", []), {
        "iter": i, "champion": champion["branch"], "champion_ms": champion["median_ms"], "improved": is_better,
        "previous_best_ms": best, "methods": methods, "verdicts": verdicts, "attribution": dict(attr),
        "sass": dict(sass), "roofline": dict(champion_roofline or {}),
        "same_sass_as_best": champion.get("same_sass_as_best"),
        "decision_gpu": (decision or {}).get("gpu_uuid")}]
    updates["verified_iterations"] = len(updates["history"])
    updates["last_verified_iter"] = i
    return save_state(run_dir, updates)
