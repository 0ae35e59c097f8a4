"""The loop's session-end steps, run by the pytest controller: seed the run (``--kopt-init``) or close the open
iteration (``--kopt-run``): champion, its profile, ablation attribution, SASS verification, next iteration.

Plain Python over the gate records (:class:`pytest_kopt.records.GateRecord`), the artifacts and the gate functions;
GPU work happens in harness processes only.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping

from .. import registry
from ..artifacts import Bench, NcuTop, Roofline, read_dict, write_json, write_text
from ..errors import Blocked, ConfigError, KoptError
from ..gates.build import ensure_built
from ..gates.context import Context
from ..gates.ncu import COUNTER_PERMISSION
from ..gates.sass import sass_digests, sass_evidence
from ..gates.timing import retime_interleaved
from ..records import GateRecord, blocker, for_kernel, stage
from ..stats import bootstrap_median_ci
from . import decisions, state as st
from .methods import normalize_methods, validate_methods
from .summary import plot_history, render_summary



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
    # methods selected in earlier iterations (a close re-run after a crash has its own claims in the history)
    earlier = [m for h in state.get("history", []) if int(h.get("iter", 0)) < int(i) for m in h.get("methods", [])]
    problems = validate_methods(methods, registry.load(registry.METHODS), budget,
                                {**state, "selected_methods": list(dict.fromkeys(earlier))}, arch, evidence)
    if problems:
        raise ConfigError(f"{methods_path} is not valid:\n  - " + "\n  - ".join(problems), gate="methods",
                          path=str(methods_path), details="\n".join(f"- {p}" for p in problems),
                          figures={"problem_details": [getattr(p, "detail", {"message": str(p)}) for p in problems]},
                          fix=f"follow the axis budget in roofline.json and {registry.path(registry.METHODS)}")
    names = {k.parent.name for k in branches}
    for m, k in ablations.items():
        base = st.read_base(k.parent)
        if base not in names:
            raise ConfigError(f"{k.parent / 'base'} names {base!r}, which is no branch of {it.name} "
                              f"({', '.join(sorted(names))})", path=str(k.parent / "base"),
                              fix="write the name of the branch this ablation removes the method from, e.g. b1")
    kernels = [*branches, *ablations.values()]
    pending = state.get("ablation_step")
    if pending and int(pending.get("iter", 0)) == int(i):
        frozen, now = pending.get("methods"), [m["id"] for m in methods["methods"]]
        if frozen is not None and now != list(frozen):
            raise ConfigError(f"{methods_path} changed since the close's branch step judged the branches under "
                              f"{frozen} (now {now})", gate="methods", path=str(methods_path),
                              fix="restore methods.json as it was: the ablation step concludes on the claims the "
                                  "branches were judged under")
        champ = Path(str(pending.get("champion_kernel")))
        if pending.get("champion_sha256") and file_sha256(champ) != pending["champion_sha256"]:
            raise ConfigError(f"the champion {champ} is gone or changed since the close's branch step judged it",
                              path=str(champ), fix="restore it as it was judged: the branch results, the profile and "
                                                   "the ablations asked for are of that kernel")
        # the second step of a close judges only the champion's ablations (the branches were judged in the first);
        # with none written, the champion itself, so that the session has a kernel and the step concludes
        ids = {m["id"] for m in methods["methods"]}
        kernels = [k for m, k in ablations.items() if m in ids and m in pending.get("needed", [])
                   and st.read_base(k.parent) == pending["champion"]] or [Path(pending["champion_kernel"])]
    return {"ncu_set": state.get("ncu_set"), "baseline": str(kernels[0]), "candidate": [str(k) for k in kernels[1:]],
            "ref": state["ref_file"],
            "dims": json.dumps(state["dims"]), "seeds": ",".join(map(str, state["validation_seeds"])),
            "_run_dir": str(run_dir)}


def finish_init(run_dir: Path, ctx: Context, records: list[GateRecord]) -> dict[str, Any]:
    """After the baseline session: stop the run with the first failing (or skipped) strict gate's reason, or record
    the baseline (``best_metric_ms``, ``baseline_ms``) and open iteration 1. Returns ``{"exit_code", "message"}``."""
    block = blocker(for_kernel(records, ctx.kernel), ctx.gates.strict, ctx.gates)
    if block is not None:
        where, code = stage(block, ctx.gates)
        if block.gate == "ncu" and COUNTER_PERMISSION in (block.message or ""):
            _counters_readable(run_dir, False)
        st.stop_run(run_dir, f"{block.gate} {block.outcome}: {block.message}", where, code)
        hint = "; run --kopt-init on a machine with a GPU (loop.next.requires)" if code == 3 else ""
        return {"exit_code": code, "message": f"run stopped at {where}: {block.message}{hint}",
                "next": st.next_step(run_dir)}
    bench = Bench.load(ctx.outdir)
    roof = Roofline.load(ctx.outdir)
    top = NcuTop.load(ctx.outdir)
    if bench is None or bench.median_ms is None or roof is None or top is None:
        missing = [n for n, v in (("bench.json", bench), ("roofline.json", roof), ("ncu_top.json", top)) if v is None]
        st.stop_run(run_dir, f"the baseline's {', '.join(missing) or 'timing'} is missing after its gates passed "
                    "(were some gates deselected with -k?)", "timing", 2)
        return {"exit_code": 2, "message": "run stopped: the baseline's evidence is incomplete; run --kopt-init "
                                           "without -k", "next": st.next_step(run_dir)}
    _counters_readable(run_dir, True)  # the baseline's ncu profile read them
    state = st.save_state(run_dir, {"baseline_ms": bench.median_ms, "best_metric_ms": bench.median_ms,
                                    "best_sass": sass_digests(ctx.outdir / "sass"),
                                    "best_gpu_uuid": bench.gpu_uuid, "ncu_set": top.set,
                                    "best_ncu_rep": str(ctx.outdir / "kernel.ncu-rep")})
    if roof.doc.get("near_peak"):
        # SKILL.md: early stop when every gap is known, a workload model is present and all are under 0.15
        state = st.save_state(run_dir, {"run_status": "completed", "open_iter": None, "completion": "near_peak"})
        write_text(run_dir / "summary.md", render_summary(state, run_dir))
        return {"exit_code": 0, "message": f"run {run_dir} completed at the baseline: {bench.median_ms:.4f} ms is "
                                           "near the roofline (every gap under 0.15); nothing to optimize",
                "baseline_ms": bench.median_ms, "next": st.next_step(run_dir)}
    it = st.open_iteration(run_dir, 1, ncu_rep=ctx.outdir / "kernel.ncu-rep", roofline=roof.doc,
                           branches=int(state["branches"]), ncu_top=top.doc, evidence_of=state["best_file"])
    b = roof.axis_budget
    return {"exit_code": 0, "message": f"run {run_dir} seeded: baseline {bench.median_ms:.4f} ms; {it.name} open, "
                                       f"budget c/m/l {b['compute']}/{b['memory']}/{b['latency']}; write "
                                       f"{it.name}/methods.json, branches/b*/kernel.*, ablations/<method>/kernel.*",
            "baseline_ms": bench.median_ms, "next": st.next_step(run_dir)}


def _counters_readable(run_dir: Path, readable: bool) -> None:
    """Record SKILL.md's ``can_read_counters`` in ``env.json`` and the state's ``env``."""
    env = {**st.load_state(run_dir).get("env", {}), "can_read_counters": readable}
    write_json(run_dir / "env.json", env)
    st.save_state(run_dir, {"env": env})


def same_gpu_decision(it: Path, state: dict[str, Any], results: list[dict[str, Any]],
                      ab_kernels: dict[str, Path], ctx_for: Callable[[Path], Context],
                      record: str = "decision.json") -> dict[str, Any] | None:
    """When the iteration's kernels were timed on more than one GPU, make each decision from times of one GPU
    wherever a difference between GPUs could change it (:func:`pytest_kopt.loop.decisions.retime_plan`), by
    re-timing those kernels in alternating rounds on this process's GPU
    (:func:`pytest_kopt.gates.timing.retime_interleaved`). Rewrites the re-timed finalists' ``median_ms`` in
    ``results`` (see :func:`~pytest_kopt.loop.decisions.apply_retimes`). Returns the decision record (also
    ``iterv{i}/<record>``, ``decision.json`` by default; ``retimed_ms`` holds the re-timed medians, ``robust`` why
    the others were not re-timed), or None when one GPU (or none) measured everything. Raises the harness's KoptError when a
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
    retimed_ci95: dict[str, tuple[float, float]] = {}
    if plan["contest"] or len(kernels) > 1:
        timed = retime_interleaved([ctx_for(k) for k in kernels])
        retimed = {n: t["median_ms"] for n, t in zip(names, timed)}
        retimed_ci95 = {n: bootstrap_median_ci(t["samples_ms"]) for n, t in zip(names, timed) if t.get("samples_ms")}
    gpu = ctx_for(kernels[0]).env.get("gpu") or {}
    decisions.apply_retimes(results, plan["finalists"], retimed, gpu.get("uuid"), retimed_ci95)
    decision = {"method": "interleaved re-timing on one GPU (pytest_kopt.gates.timing.retime_interleaved)",
                "gpu_uuid": gpu.get("uuid"), "gpu_index": gpu.get("index"), "measured_on": plan["measured_on"],
                "finalist_margin_pct": decisions.FINALIST_MARGIN_PCT, "max_finalists": decisions.MAX_FINALISTS,
                "champion_contest": plan["contest"], "retimed_ms": retimed,
                "retimed_ci95_ms": {n: list(ci) for n, ci in retimed_ci95.items()}, "robust": plan["robust"],
                "kernels": dict(zip(names, map(str, kernels))) if retimed else {},
                "stop_reasons": {n: t["stop_reason"] for n, t in zip(names, timed)},
                "reported_gpu": {n: t["gpu_uuid"] for n, t in zip(names, timed)}, "best_note": best_note}
    write_json(it / record, decision)
    return decision


def branch_results(branches: list[Path], records: list[GateRecord], ctx_for: Callable[[Path], Context],
                   best_sass: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Each branch's outcome in this session (``branch``, ``index``, ``kernel``, ``median_ms`` in ms, ``passed``,
    ``failed_gate``, ``stage``, ``status``, ``message``, ``gpu_uuid``), in ``b1..bK`` order, with ``sass_digest``
    (``{function: instruction digest}``, {} when its sass gate did not pass in this session) and ``same_sass_as_best``: True when
    every kernel function's instructions equal the best kernel's (``best_sass``, the state's), so the branch
    changed nothing the GPU runs; None when either side has no SASS."""
    results = []
    for index, kernel in enumerate(branches, start=1):
        recs = for_kernel(records, kernel)
        table = ctx_for(kernel).gates
        block = blocker(recs, table.branch_strict, table)
        outdir = ctx_for(kernel).outdir
        t = timing_of(Bench.load(outdir) if block is None and timed_here(recs) else None)
        sass_ran = any(r.gate == "sass" and r.outcome == "passed" for r in recs)
        digest = sass_digests(outdir / "sass") if block is None and sass_ran else {}
        same = (digest == dict(best_sass)) if digest and best_sass else None
        results.append({"branch": kernel.parent.name, "index": index, "kernel": str(kernel), **t,
                        "sass_digest": digest, "same_sass_as_best": same,
                        "passed": block is None and t["median_ms"] is not None,
                        "failed_gate": block.gate if block else None,
                        "stage": stage(block, table)[0] if block else None,
                        "status": block.status if block else "PASSED",
                        "message": block.message if block else None})
    return results


def timing_of(bench: Bench | None) -> dict[str, Any]:
    """``median_ms`` (ms), ``ci95_ms`` ([low, high] ms) and ``gpu_uuid`` of a valid timing; all None without one."""
    if bench is None or bench.median_ms is None:
        return {"median_ms": None, "ci95_ms": None, "gpu_uuid": None}
    dist = bench.doc.get("distribution") or {}
    return {"median_ms": bench.median_ms, "ci95_ms": [dist.get("ci95_low_ms"), dist.get("ci95_high_ms")],
            "gpu_uuid": bench.gpu_uuid}


def timed_here(recs: list[GateRecord]) -> bool:
    """True when this session's records include a passed timing item: a bench.json left by an earlier session
    (timing deselected with ``-k`` here) is no timing of this one."""
    return any(r.gate == "timing" and r.outcome == "passed" for r in recs)


def ablation_results(ablations: dict[str, Path], methods: list[str], records: list[GateRecord],
                     ctx_for: Callable[[Path], Context]) -> dict[str, dict[str, Any]]:
    """Each claimed method's ablation as judged in this session: ``{"kernel", "base", "passed", "median_ms",
    "gpu_uuid", "status", "message"}``. Ablations of methods not claimed, or not judged in this session, are left
    out."""
    out: dict[str, dict[str, Any]] = {}
    for m, k in ablations.items():
        recs = for_kernel(records, k)
        if m not in methods or not recs:
            continue
        table = ctx_for(k).gates
        block = blocker(recs, table.branch_strict, table)
        t = timing_of(Bench.load(ctx_for(k).outdir) if block is None and timed_here(recs) else None)
        ok = t["median_ms"] is not None
        out[m] = {"kernel": str(k), "base": st.read_base(k.parent), "passed": ok,
                  "stage": stage(block, table)[0] if block else None, **t,
                  "status": block.status if block else ("PASSED" if ok else "NOT_TIMED"),
                  "message": block.message if block else None}
    return out


def ablation_request(champion: str, methods: list[str], judged: dict[str, dict[str, Any]]) -> list[str]:
    """The claimed methods whose ablation of ``champion`` is still needed: not written, or written from another
    branch (``base``). A failed ablation of the champion counts as given (its attribution is inconclusive, and
    the agent is told why)."""
    return [m for m in methods if m not in judged or judged[m]["base"] != champion]


def finish_run(run_dir: Path, ctx_for: Callable[[Path], Context], records: list[GateRecord],
               finalize: bool) -> dict[str, Any]:
    """Close the open iteration from this session's results. Returns ``{"exit_code", "message", ...}``.

    A close has one step when the agent wrote, before the close, an ablation of the eventual champion for every
    claimed method (``ablations/<method>/base`` names the champion), and two otherwise: the first judges the
    branches, picks and profiles the champion and asks, through ``next`` (action ``write_ablations``), for the
    champion's ablations at named paths; the second (the same ``--kopt-run`` command) judges only those and
    concludes. Attribution is then conclusive for whichever branch wins."""
    state = st.load_state(run_dir)
    i = int(state["open_iter"])
    it = run_dir / f"iterv{i}"
    branches, ablations = st.iteration_kernels(run_dir, i)
    methods = [m["id"] for m in normalize_methods(json.loads((it / "methods.json").read_text()))["methods"]]
    pending = state.get("ablation_step")
    if pending and int(pending.get("iter", 0)) == i:
        return _ablation_step(run_dir, state, i, it, pending, methods, ablations, records, ctx_for, finalize)
    results = branch_results(branches, records, ctx_for, state.get("best_sass"))
    judged = ablation_results(ablations, methods, records, ctx_for)
    if not any(r["passed"] for r in results) and any(r["stage"] == "hardware" for r in results):
        # the GPU (or a tool) is missing: a branch that could not be timed is not a failed branch
        hw = next(r for r in results if r["stage"] == "hardware")
        return {"exit_code": 3, "message": f"{it.name}: {hw['branch']} could not run its GPU gates here "
                                           f"({hw['message']}); the iteration stays open: run --kopt-run again "
                                           "where the GPU is", "branches": results, "next": st.next_step(run_dir)}
    ab_kernels = {m: Path(a["kernel"]) for m, a in judged.items() if a["passed"]}
    try:
        decision = same_gpu_decision(it, state, results, ab_kernels, ctx_for)
    except KoptError as exc:
        st.stop_run(run_dir, f"re-timing the finalists on one GPU failed: {exc.message}", "timing", exc.exit_code)
        return {"exit_code": exc.exit_code, "message": f"{it.name}: the finalists could not be re-timed on one GPU: "
                                                      f"{exc.message}", "next": st.next_step(run_dir)}
    ab_gate_ms = {m: judged[m]["median_ms"] if m in judged else None for m in methods}
    champion, ab_ms, best_ms_now = decisions.decided(results, ab_gate_ms, decision)
    if champion is None:
        write_json(it / "branch_results.json", {"iter": i, "branches": results, "champion": None})
        st.stop_run(run_dir, "all branches failed a strict gate", "branch_explore", 2, results)
        return {"exit_code": 2, "message": f"{it.name}: every branch failed a strict gate; run stopped",
                "branches": results, "next": st.next_step(run_dir)}
    cctx = ctx_for(Path(champion["kernel"]))
    failed = _profile_champion(run_dir, it, cctx, state, champion["branch"])
    if failed is not None:
        return failed
    needed = ablation_request(champion["branch"], methods, judged)
    if needed:
        ready = {m: a for m, a in judged.items() if m not in needed}
        for m in needed:  # the folders next.ablations names exist, so its paths can be written as named
            (it / "ablations" / m).mkdir(parents=True, exist_ok=True)
        st.save_state(run_dir, {"ablation_step": {
            "iter": i, "champion": champion["branch"], "champion_kernel": champion["kernel"],
            "champion_sha256": file_sha256(Path(champion["kernel"])), "champion_ms": champion["median_ms"],
            "champion_bench": read_dict(cctx.outdir / "bench.json"),
            "methods": methods, "needed": needed, "ready": ready, "best_ms_now": best_ms_now, "results": results,
            "decision": decision, "finalize": finalize}})
        write_json(it / "branch_results.json", {"iter": i, "branches": results, "champion": champion["branch"],
                                                "decision": decision, "awaiting_ablations": needed})
        stale = {m: judged[m]["base"] for m in needed if m in judged}
        return {"exit_code": 0, "iteration": i, "branches": results, "champion": champion["branch"],
                "champion_ms": champion["median_ms"], "ablations": judged, "ablations_needed": needed,
                "stale_ablations": stale,
                "failed_branches": [r["branch"] for r in results if not r["passed"]],
                "message": f"{it.name}: champion {champion['branch']} {champion['median_ms']:.4f} ms; write its "
                           f"ablation for {', '.join(needed)} (base {champion['branch']}) and run the same command "
                           "again to conclude the iteration", "next": st.next_step(run_dir)}
    return _conclude(run_dir, i, it, results, champion, methods, ab_ms, {}, decision, best_ms_now, cctx, judged,
                     finalize)


def _profile_champion(run_dir: Path, it: Path, cctx: Context, state: dict[str, Any],
                      branch: str) -> dict[str, Any] | None:
    """ncu and roofline of the champion with the run's ncu bundle (SKILL.md 3g: kept identical to the first
    profile); copies ``kernel.ncu-rep``, ``kernel_ncu_top.json`` and ``kernel_roofline.json`` into the iteration.
    Returns None, or the loop result of a stop (exit 3) when the profile failed or used another bundle."""
    try:
        for gate in cctx.gates.champion_only:  # ncu, then roofline: the gates a branch is not judged by
            gate.run(cctx, None)
    except (KoptError, Blocked) as exc:
        text = exc.message if isinstance(exc, KoptError) else str(exc)
        st.stop_run(run_dir, f"champion profile failed: {text}", "ncu", 3)
        return {"exit_code": 3, "message": f"{it.name}: champion {branch} could not be profiled: {text}",
                "next": st.next_step(run_dir)}
    top = read_dict(cctx.outdir / "ncu_top.json") or {}
    if state.get("ncu_set") and top.get("set") != state["ncu_set"]:
        text = (f"the champion was profiled with the {top.get('set')} ncu set, the run with {state['ncu_set']} "
                "(SKILL.md 3g: one bundle for the whole run)")
        st.stop_run(run_dir, f"champion profile failed: {text}", "ncu", 3)
        return {"exit_code": 3, "message": f"{it.name}: {text}", "next": st.next_step(run_dir)}
    shutil.copy2(cctx.outdir / "kernel.ncu-rep", it / "kernel.ncu-rep")
    write_json(it / "kernel_ncu_top.json", top)  # never over the best-input profile's ncu_top.json
    write_json(it / "kernel_roofline.json", read_dict(cctx.outdir / "roofline.json") or {})
    return None


def _ablation_step(run_dir: Path, state: dict[str, Any], i: int, it: Path, pending: dict[str, Any],
                   methods: list[str], ablations: dict[str, Path], records: list[GateRecord],
                   ctx_for: Callable[[Path], Context], finalize: bool) -> dict[str, Any]:
    """The second step of a close: the champion's ablations judged in this session, attribution against the
    champion's time from the first step (re-timed beside them on one GPU when a difference between GPUs could
    flip an attribution), then the iteration concluded on the claims the first step judged (``pending["methods"]``;
    :func:`run_overrides` refuses a methods.json edited since). An ablation that could not run its GPU gates here
    leaves the step open (exit 3); a champion judged again (no ablation written) that now fails a strict gate
    stops the run (exit 2)."""
    champ = str(pending["champion"])
    if pending.get("champion_sha256") and file_sha256(Path(str(pending["champion_kernel"]))) \
            != pending["champion_sha256"]:  # run_overrides refuses this first; a session that got here anyway
        return {"exit_code": 4, "message": f"{it.name}: the champion {pending['champion_kernel']} is gone or changed "
                                           "since the branch step judged it; restore it and run the same command",
                "next": st.next_step(run_dir)}
    methods = list(pending.get("methods") or methods)
    results = list(pending["results"])
    champion = dict(next(r for r in results if r["branch"] == champ))
    fresh = {m: a for m, a in ablation_results(ablations, methods, records, ctx_for).items() if a["base"] == champ}
    hw = next((m for m, a in fresh.items() if a.get("stage") == "hardware"), None)
    if hw is not None:
        return {"exit_code": 3, "message": f"{it.name}: the ablation of {hw} could not run its GPU gates here "
                                           f"({fresh[hw]['message']}); the ablation step stays open: run the same "
                                           "command where the GPU is", "ablations": fresh,
                "next": st.next_step(run_dir)}
    crecs = for_kernel(records, Path(champion["kernel"]))
    table = ctx_for(Path(champion["kernel"])).gates
    block = blocker(crecs, table.branch_strict, table) if crecs else None
    if block is not None:
        where, code = stage(block, table)
        if where == "hardware":
            return {"exit_code": 3, "message": f"{it.name}: champion {champ} could not run its GPU gates here "
                                               f"({block.message}); run the same command where the GPU is",
                    "next": st.next_step(run_dir)}
        st.stop_run(run_dir, f"champion {champ} failed {block.gate} when judged again in the ablation step: "
                    f"{block.message}", where, code)
        return {"exit_code": code, "message": f"{it.name}: champion {champ} passed its gates in the branch step but "
                                              f"failed {block.gate} when judged again ({block.message}); run stopped",
                "next": st.next_step(run_dir)}
    judged = {**pending.get("ready", {}), **fresh}
    why = {m: f"ablation built from {st.read_base(ablations[m].parent)}, champion is {champ}"
           for m in methods if m not in judged and m in ablations}
    ab_kernels = {m: Path(a["kernel"]) for m, a in judged.items() if a["passed"]}
    cres = [{**champion, "finalist": True}]
    try:
        decision = same_gpu_decision(it, state, cres, ab_kernels, ctx_for, record="decision_ablations.json")
    except KoptError as exc:
        st.stop_run(run_dir, f"re-timing the ablations on one GPU failed: {exc.message}", "timing", exc.exit_code)
        return {"exit_code": exc.exit_code, "message": f"{it.name}: {exc.message}", "next": st.next_step(run_dir)}
    if decision is not None:
        champion["median_ms"] = cres[0]["median_ms"]
    retimed = (decision or {}).get("retimed_ms", {})
    ab_ms = {m: retimed.get(f"ablations/{m}", judged[m]["median_ms"]) if m in judged else None for m in methods}
    out = _conclude(run_dir, i, it, results, champion, methods, ab_ms, why, pending.get("decision"),
                    retimed.get("best", pending.get("best_ms_now")), ctx_for(Path(champion["kernel"])), judged,
                    finalize or bool(pending.get("finalize")), champion_bench=pending.get("champion_bench"),
                    ablation_decision=decision)
    st.save_state(run_dir, {"ablation_step": None})
    return out


def best_name(run_dir: Path, state: Mapping[str, Any]) -> str:
    """The best kernel so far as a path inside the run (``iterv1/kernel.cu``, ``baseline/gemm.cu``)."""
    best = Path(str(state.get("best_file")))
    try:
        return str(best.relative_to(run_dir))
    except ValueError:
        return str(best)


def file_sha256(path: Path) -> str | None:
    """SHA-256 of a file's bytes, None when it is gone."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _conclude(run_dir: Path, i: int, it: Path, results: list[dict[str, Any]], champion: Mapping[str, Any],
              methods: list[str], ab_ms: dict[str, float | None], why: dict[str, str],
              decision: Mapping[str, Any] | None, best_ms_now: float | None, cctx: Context,
              judged: dict[str, dict[str, Any]], finalize: bool, champion_bench: Mapping[str, Any] | None = None,
              ablation_decision: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Attribution, SASS verification, buckets, the next iteration (on the best kernel's evidence) or the run's
    completion, plots and summary. ``champion_bench``: the champion's bench.json as the branch step saw it (its
    folder's may hold a later re-timing); ``ablation_decision``: the ablation step's same-GPU re-timing, kept
    beside the branch step's ``decision``."""
    state = st.load_state(run_dir)
    for m in methods:
        a = judged.get(m)
        if a is None:
            why.setdefault(m, f"no ablation of {champion['branch']} written")
        elif not a["passed"]:
            why.setdefault(m, f"the ablation failed {a['status']}: {a['message']}")
    attr = decisions.attribution(champion["median_ms"], ab_ms, float(state["noise_threshold_pct"]), why)
    texts = [p.read_text() for p in sorted((cctx.outdir / "sass").glob("*.sass"))]
    evidence = sass_evidence(methods, texts, registry.load(registry.SASS))
    sass = {m: e["status"] for m, e in evidence.items()}
    bench = dict(champion_bench or read_dict(cctx.outdir / "bench.json") or {})
    if ablation_decision:
        decision = {**dict(decision or {}), "ablation_step": dict(ablation_decision)}
    roof = read_dict(it / "kernel_roofline.json") or {}
    state = st.close_iteration(run_dir, i, results=results, champion=champion, methods=methods, attr=attr,
                               sass=sass, sass_detail=evidence, champion_roofline=roof, champion_bench=bench,
                               best_ms_now=best_ms_now, decision=decision)
    improved = bool(state["history"][-1]["improved"])
    same = (" (its SASS is the best kernel's, instruction for instruction: the methods changed nothing the GPU "
            "runs, so they stay unverified)" if champion.get("same_sass_as_best") else "")
    # SKILL.md 3a: the next iteration profiles the current best; a champion that did not improve leaves the best,
    # and so its evidence (this iteration's best-input profile), as it was
    if improved:
        ev_roof, ev_top, rep = roof, read_dict(it / "kernel_ncu_top.json") or {}, it / "kernel.ncu-rep"
    else:
        ev_roof, ev_top = read_dict(it / "roofline.json") or {}, read_dict(it / "ncu_top.json") or {}
        rep = it / "best_input.ncu-rep"
    near = bool(ev_roof.get("near_peak"))
    done = finalize or i >= int(state["iterations_total"]) or near
    if done:
        reason = "finalized" if finalize else ("near_peak" if near else "iterations done")
        state = st.save_state(run_dir, {"run_status": "completed", "open_iter": None, "completion": reason})
        msg = (f"{it.name} closed: champion {champion['branch']} {champion['median_ms']:.4f} ms{same}"
               f"{'' if improved else ' (no improvement: the best stays ' + best_name(run_dir, state) + ')'}; "
               f"run completed ({reason})")
    else:
        nxt = st.open_iteration(run_dir, i + 1, ncu_rep=rep, roofline=ev_roof, branches=int(state["branches"]),
                                ncu_top=ev_top, evidence_of=str(state["best_file"]))
        state = st.load_state(run_dir)
        msg = (f"{it.name} closed: champion {champion['branch']} {champion['median_ms']:.4f} ms{same}"
               f"{'' if improved else ' (no improvement: the best stays ' + best_name(run_dir, state) + ')'}; "
               f"{nxt.name} open")
    plot_history(state, run_dir)
    write_text(run_dir / "summary.md", render_summary(state, run_dir))
    return {"exit_code": 0, "message": msg, "iteration": i, "branches": results, "champion": champion["branch"],
            "champion_ms": champion["median_ms"], "improved": improved, "ablations": judged, "attribution": attr,
            "sass": sass,
            "verdicts": state["history"][-1]["verdicts"],
            "failed_branches": [r["branch"] for r in results if not r["passed"]], "next": st.next_step(run_dir)}
