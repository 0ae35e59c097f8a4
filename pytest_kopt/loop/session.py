"""The loop's session-end steps, run by the pytest controller: seed the run (``--kopt-init``) or close the open
iteration (``--kopt-run``): champion, its profile, ablation attribution, SASS verification, next iteration.

Plain Python over the gate records (:class:`pytest_kopt.records.GateRecord`), the artifacts and the gate functions;
GPU work happens in harness processes only.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

from .. import registry
from ..artifacts import Bench, NcuTop, Roofline, read_dict, write_json, write_text
from ..errors import Blocked, ConfigError, KoptError
from ..gates.build import ensure_built
from ..gates.context import Context
from ..gates.ncu import gate_ncu
from ..gates.roofline import gate_roofline
from ..gates.sass import sass_evidence
from ..gates.table import STRICT
from ..gates.timing import retime_interleaved
from ..records import GateRecord, blocker, for_kernel, stage
from . import decisions, state as st
from .methods import normalize_methods, validate_methods
from .summary import plot_history, render_summary

#: The strict gates of a branch or ablation in a close (ncu and roofline run for the champion alone).
BRANCH_GATES = ("compile", "correctness", "timing")


def run_overrides(run_dir: Path) -> dict[str, Any]:
    """--kopt-run: kernel, reference, dims and seeds come from the run's state.json; the open iteration's branches
    and ablations are the kernels. Raises ConfigError when the folder is not an open run or methods.json is bad."""
    try:
        state = st.load_state(run_dir)
    except (FileNotFoundError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--kopt-run: {run_dir} holds no readable state.json ({exc})",
                          fix="pass a run_YYYYMMDD_HHMMSS folder made by --kopt-init") from None
    i = state.get("open_iter")
    if not i:
        raise ConfigError(f"--kopt-run: {run_dir} has no open iteration (run_status {state.get('run_status')}, "
                          f"stop_reason {state.get('stop_reason')})", fix="start a new run with --kopt-init")
    it = run_dir / f"iterv{i}"
    branches, ablations = st.iteration_kernels(run_dir, int(i))
    if not branches:
        raise ConfigError(f"--kopt-run: {it}/branches/b*/ hold no kernel.cu or kernel.py",
                          fix="write the branch kernels first (SKILL.md step 3d)")
    methods_path = it / "methods.json"
    try:
        methods = json.loads(methods_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{methods_path}: {exc}", fix='write the selected methods as {"methods": [{"id": '
                          '"memory.shared_memory_tiling", "rationale": "..."}]}') from None
    roof = Roofline.load(it)
    budget = roof.axis_budget if roof is not None else {}
    arch = (state.get("env") or {}).get("sm_arch") or "sm_90a"
    try:
        methods = normalize_methods(methods)
    except ValueError as exc:
        raise ConfigError(f"{methods_path}: {exc}", gate="methods", path=str(methods_path),
                          details=f"- {exc}", fix='write {"methods": [{"id": "memory.shared_memory_tiling", '
                                                  '"rationale": "..."}]}') from None
    top = read_dict(it / "ncu_top.json") or {}
    launches = top.get("launches") or []
    evidence = dict(top.get("metrics") or {}) or (dict(launches[0].get("metrics") or {}) if launches else {})
    problems = validate_methods(methods, registry.load(registry.METHODS), budget, state, arch, evidence)
    if problems:
        raise ConfigError(f"{methods_path} is not valid:\n  - " + "\n  - ".join(problems), gate="methods",
                          path=str(methods_path), details="\n".join(f"- {p}" for p in problems),
                          fix="follow the axis budget in roofline.json and registries/method_registry.json")
    kernels = [*branches, *ablations.values()]
    return {"baseline": str(kernels[0]), "candidate": [str(k) for k in kernels[1:]], "ref": state["ref_file"],
            "dims": json.dumps(state["dims"]), "seeds": ",".join(map(str, state["validation_seeds"])),
            "_run_dir": str(run_dir)}


def finish_init(run_dir: Path, ctx: Context, records: list[GateRecord]) -> dict[str, Any]:
    """After the baseline session: stop the run with the first failing (or skipped) strict gate's reason, or record
    the baseline (``best_metric_ms``, ``baseline_ms``) and open iteration 1. Returns ``{"exit_code", "message"}``."""
    block = blocker(for_kernel(records, ctx.kernel), STRICT)
    if block is not None:
        where, code = stage(block)
        st.stop_run(run_dir, f"{block.gate} {block.outcome}: {block.message}", where, code)
        return {"exit_code": code, "message": f"run stopped at {where}: {block.message}", "next": st.next_step(run_dir)}
    bench = Bench.load(ctx.outdir)
    roof = Roofline.load(ctx.outdir)
    top = NcuTop.load(ctx.outdir)
    if bench is None or bench.median_ms is None or roof is None or top is None:
        missing = [n for n, v in (("bench.json", bench), ("roofline.json", roof), ("ncu_top.json", top)) if v is None]
        st.stop_run(run_dir, f"the baseline's {', '.join(missing) or 'timing'} is missing after its gates passed "
                    "(were some gates deselected with -k?)", "timing", 2)
        return {"exit_code": 2, "message": "run stopped: the baseline's evidence is incomplete; run --kopt-init "
                                           "without -k", "next": st.next_step(run_dir)}
    state = st.load_state(run_dir)
    st.save_state(run_dir, {"baseline_ms": bench.median_ms, "best_metric_ms": bench.median_ms,
                            "best_gpu_uuid": bench.gpu_uuid, "best_ncu_rep": str(ctx.outdir / "kernel.ncu-rep"),
                            "ncu_set": top.set})
    it = st.open_iteration(run_dir, 1, profile_dir=ctx.outdir, roofline=roof.doc, branches=int(state["branches"]),
                           ncu_top=top.doc)
    b = roof.axis_budget
    return {"exit_code": 0, "message": f"run {run_dir} seeded: baseline {bench.median_ms:.4f} ms; {it.name} open, "
                                       f"budget c/m/l {b['compute']}/{b['memory']}/{b['latency']}; write "
                                       f"{it.name}/methods.json, branches/b*/kernel.*, ablations/<method>/kernel.*",
            "baseline_ms": bench.median_ms, "next": st.next_step(run_dir)}


def same_gpu_decision(it: Path, state: dict[str, Any], results: list[dict[str, Any]],
                      ab_kernels: dict[str, Path], ctx_for: Callable[[Path], Context]) -> dict[str, Any] | None:
    """When the iteration's kernels were timed on more than one GPU, make each decision from times of one GPU
    wherever a difference between GPUs could change it (:func:`pytest_kopt.loop.decisions.retime_plan`), by
    re-timing those kernels in alternating rounds on this process's GPU
    (:func:`pytest_kopt.gates.timing.retime_interleaved`). Rewrites the re-timed finalists' ``median_ms`` in
    ``results`` (see :func:`~pytest_kopt.loop.decisions.apply_retimes`). Returns the decision record (also
    ``iterv{i}/decision.json``; ``retimed_ms`` holds the re-timed medians, ``robust`` why the others were not
    re-timed), or None when one GPU (or none) measured everything. Raises the harness's KoptError when a
    re-timing fails."""
    benches = {m: Bench.load(ctx_for(k).outdir) for m, k in ab_kernels.items()}
    ab = {m: (b.median_ms, b.gpu_uuid) for m, b in benches.items() if b is not None and b.median_ms is not None}
    plan = decisions.retime_plan(results, ab, state.get("best_metric_ms"), state.get("best_gpu_uuid"),
                                 float(state.get("noise_threshold_pct", st.DEFAULT_NOISE_PCT)))
    if plan is None:
        return None
    by_branch = {f"branches/{r['branch']}": Path(r["kernel"]) for r in results}
    names: list[str] = []
    kernels: list[Path] = []
    best_note = None
    best_file = Path(str(state.get("best_file") or ""))
    for name in plan["retime"]:
        if name == "best":
            if not best_file.is_file():
                best_note = f"the best kernel so far ({best_file}) is gone; stored best_metric_ms used"
                continue
            try:
                ensure_built(ctx_for(best_file))
            except (KoptError, Blocked) as exc:  # the improvement test then uses the stored best_metric_ms
                best_note = f"the best kernel so far did not build here ({exc}); stored best_metric_ms used"
                continue
            kernel = best_file
        elif name.startswith("ablations/"):
            kernel = ab_kernels[name.removeprefix("ablations/")]
        else:
            kernel = by_branch[name]
        names.append(name)
        kernels.append(kernel)
    timed: list[dict[str, Any]] = []
    retimed: dict[str, float] = {}
    if plan["contest"] or len(kernels) > 1:
        timed = retime_interleaved([ctx_for(k) for k in kernels])
        retimed = {n: t["median_ms"] for n, t in zip(names, timed)}
    gpu = ctx_for(kernels[0]).env.get("gpu") or {}
    decisions.apply_retimes(results, plan["finalists"], retimed, gpu.get("uuid"))
    decision = {"method": "interleaved re-timing on one GPU (pytest_kopt.gates.timing.retime_interleaved)",
                "gpu_uuid": gpu.get("uuid"), "gpu_index": gpu.get("index"), "measured_on": plan["measured_on"],
                "finalist_margin_pct": decisions.FINALIST_MARGIN_PCT, "max_finalists": decisions.MAX_FINALISTS,
                "champion_contest": plan["contest"], "retimed_ms": retimed, "robust": plan["robust"],
                "kernels": dict(zip(names, map(str, kernels))) if retimed else {},
                "stop_reasons": {n: t["stop_reason"] for n, t in zip(names, timed)},
                "reported_gpu": {n: t["gpu_uuid"] for n, t in zip(names, timed)}, "best_note": best_note}
    write_json(it / "decision.json", decision)
    return decision


def finish_run(run_dir: Path, ctx_for: Callable[[Path], Context], records: list[GateRecord],
               finalize: bool) -> dict[str, Any]:
    """Close the open iteration from this session's results. Returns ``{"exit_code", "message"}``."""
    state = st.load_state(run_dir)
    i = int(state["open_iter"])
    it = run_dir / f"iterv{i}"
    branches, ablations = st.iteration_kernels(run_dir, i)
    methods = [m["id"] for m in normalize_methods(json.loads((it / "methods.json").read_text()))["methods"]]
    results = []
    for index, kernel in enumerate(branches, start=1):
        block = blocker(for_kernel(records, kernel), BRANCH_GATES)
        bench = Bench.load(ctx_for(kernel).outdir) if block is None else None
        median = bench.median_ms if bench is not None else None
        results.append({"branch": kernel.parent.name, "index": index, "kernel": str(kernel), "median_ms": median,
                        "passed": block is None and median is not None,
                        "failed_gate": block.gate if block else None,
                        "stage": stage(block)[0] if block else None,
                        "status": block.status if block else "PASSED",
                        "message": block.message if block else None,
                        "gpu_uuid": bench.gpu_uuid if bench is not None else None})
    ab_bench: dict[str, Bench] = {}
    for m, k in ablations.items():
        b = Bench.load(ctx_for(k).outdir)
        if m in methods and blocker(for_kernel(records, k), BRANCH_GATES) is None and b is not None \
                and b.median_ms is not None:
            ab_bench[m] = b
    ab_kernels = {m: ablations[m] for m in ab_bench}
    if not any(r["passed"] for r in results) and any(r["stage"] == "hardware" for r in results):
        # the GPU (or a tool) is missing: a branch that could not be timed is not a failed branch
        hw = next(r for r in results if r["stage"] == "hardware")
        return {"exit_code": 3, "message": f"{it.name}: {hw['branch']} could not run its GPU gates here "
                                           f"({hw['message']}); the iteration stays open: run --kopt-run again "
                                           "where the GPU is", "branches": results, "next": st.next_step(run_dir)}
    try:
        decision = same_gpu_decision(it, state, results, ab_kernels, ctx_for)
    except KoptError as exc:
        st.stop_run(run_dir, f"re-timing the finalists on one GPU failed: {exc.message}", "timing", exc.exit_code)
        return {"exit_code": exc.exit_code, "message": f"{it.name}: the finalists could not be re-timed on one GPU: "
                                                      f"{exc.message}"}
    ab_gate_ms = {m: ab_bench[m].median_ms if m in ab_bench else None for m in methods}
    champion, ab_ms, best_ms_now = decisions.decided(results, ab_gate_ms, decision)
    if champion is None:
        write_json(it / "branch_results.json", {"iter": i, "branches": results, "champion": None})
        st.stop_run(run_dir, "all branches failed a strict gate", "branch_explore", 2, results)
        return {"exit_code": 2, "message": f"{it.name}: every branch failed a strict gate; run stopped",
                "branches": results, "next": st.next_step(run_dir)}
    cctx = ctx_for(Path(champion["kernel"]))
    try:
        gate_ncu(cctx)
        gate_roofline(cctx)
    except (KoptError, Blocked) as exc:
        text = exc.message if isinstance(exc, KoptError) else str(exc)
        st.stop_run(run_dir, f"champion profile failed: {text}", "ncu", 3)
        return {"exit_code": 3, "message": f"{it.name}: champion {champion['branch']} could not be profiled: {text}"}
    shutil.copy2(cctx.outdir / "kernel.ncu-rep", it / "kernel.ncu-rep")
    top = read_dict(cctx.outdir / "ncu_top.json") or {}
    roof = read_dict(cctx.outdir / "roofline.json") or {}
    write_json(it / "kernel_ncu_top.json", top)  # never over the best-input profile's ncu_top.json
    write_json(it / "kernel_roofline.json", roof)
    why: dict[str, str] = {}
    for method in methods:
        kernel = ablations.get(method)
        if kernel is None:
            ab_ms[method] = None
            why[method] = "no ablation kernel written"
            continue
        base_file = kernel.parent / "base"
        base = base_file.read_text().strip() if base_file.is_file() else "b1"
        if base != champion["branch"]:
            why[method] = f"ablation built from {base}, champion is {champion['branch']}"
    attr = decisions.attribution(champion["median_ms"], ab_ms, float(state["noise_threshold_pct"]), why)
    texts = [p.read_text() for p in sorted((cctx.outdir / "sass").glob("*.sass"))]
    evidence = sass_evidence(methods, texts, registry.load(registry.SASS))
    sass = {m: e["status"] for m, e in evidence.items()}
    bench = read_dict(cctx.outdir / "bench.json") or {}
    state = st.close_iteration(run_dir, i, results=results, champion=champion, methods=methods, attr=attr,
                               sass=sass, sass_detail=evidence, champion_roofline=roof, champion_bench=bench,
                               best_ms_now=best_ms_now, decision=decision)
    done = finalize or i >= int(state["iterations_total"]) or bool(roof.get("near_peak"))
    if done:
        reason = "finalized" if finalize else ("near_peak" if roof.get("near_peak") else "iterations done")
        state = st.save_state(run_dir, {"run_status": "completed", "open_iter": None, "completion": reason})
        msg = (f"{it.name} closed: champion {champion['branch']} {champion['median_ms']:.4f} ms; run completed "
               f"({reason})")
    else:
        nxt = st.open_iteration(run_dir, i + 1, profile_dir=cctx.outdir, roofline=roof,
                                branches=int(state["branches"]), ncu_top=top)
        state = st.load_state(run_dir)
        msg = f"{it.name} closed: champion {champion['branch']} {champion['median_ms']:.4f} ms; {nxt.name} open"
    plot_history(state, run_dir)
    write_text(run_dir / "summary.md", render_summary(state, run_dir))
    return {"exit_code": 0, "message": msg, "iteration": i, "branches": results, "champion": champion["branch"],
            "champion_ms": champion["median_ms"], "attribution": attr, "sass": sass,
            "failed_branches": [r["branch"] for r in results if not r["passed"]], "next": st.next_step(run_dir)}
