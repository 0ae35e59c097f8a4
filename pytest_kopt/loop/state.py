"""The run directory's life (SKILL.md steps 1-4): the run seeded (its inputs pinned), iterations opened and closed,
stops. Built on :class:`~pytest_kopt.loop.runstate.State` (``state.json``), the layout and the loop's records.

Only the pytest controller calls the writers, once per step, under the run's lock (:mod:`pytest_kopt.loop.lock`),
atomically (:func:`pytest_kopt.artifacts.write_json`). The agent-facing views (``next``, the report's ``loop``
section) are :mod:`pytest_kopt.loop.view`'s, re-exported here.
"""

from __future__ import annotations

import datetime as _dt
import shutil
from pathlib import Path
from typing import Any, Mapping

from ..artifacts import write_json, write_text
from . import analysis
from .decisions import classify, improved, residual, verified
from .layout import ITERATION_RE, RunLayout
from .pins import pin_file, pin_reference, registry_hashes
from .records import Attribution, BranchResults, SassCheck, Stop
from .runstate import State
from .schema import loop_error
from .summary import render_summary
from .view import PYTEST, next_step, report_of, rerun_writing, run_view
from .written import scan

__all__ = ["PYTEST", "analysis_template", "run_home", "close_iteration", "init_state", "iteration_kernels", "load_state",
           "new_run_dir", "next_step", "open_iteration", "report_of", "rerun_writing", "run_view", "save_state",
           "stop_run"]


def load_state(run_dir: Path) -> dict[str, Any]:
    """``state.json`` of a run as its JSON object (read and validated through :class:`State`). Raises the loop's
    ConfigError (exit 4) when the folder is not a run or its state is bad."""
    return State.load(run_dir).to_json()


def save_state(run_dir: Path, updates: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``updates`` into the state on disk (never replace it wholesale), validate and write it atomically;
    returns it as its JSON object."""
    return State.update(run_dir, **dict(updates)).to_json()


def run_home(baseline: Path) -> Path:
    """The folder a new run of ``baseline`` is made in: beside it, or, for a kernel of another run (its best kernel
    ``iterv<i>/kernel.<ext>`` or its ``baseline/<name>`` copy, which ``start_over`` seeds from), beside that run,
    never inside it."""
    folder = baseline.parent
    if (ITERATION_RE.match(folder.name) or folder.name == "baseline") and (folder.parent / "state.json").is_file():
        return folder.parent.parent
    return folder


def new_run_dir(baseline: Path, now: _dt.datetime | None = None) -> Path:
    """Create and return ``run_YYYYMMDD_HHMMSS/`` in :func:`run_home` (a suffix ``_2``... when that name is
    taken: two set-ups in one second never share a folder, the folder is made atomically)."""
    stamp = (now or _dt.datetime.now()).strftime("run_%Y%m%d_%H%M%S")
    n = 1
    while True:
        path = run_home(baseline) / (stamp if n == 1 else f"{stamp}_{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1


def init_state(run_dir: Path, baseline: Path, ref: Path, dims: Mapping[str, Any], *, iterations: int,
               branches: int, ncu_num: int, noise_pct: float, numerics_mode: str, seeds: list[int],
               env: Mapping[str, Any]) -> dict[str, Any]:
    """Seed the run: copy the baseline into ``baseline/`` and the reference (with the modules beside it that it
    imports) into ``reference/`` (read-only; :mod:`pytest_kopt.loop.pins`), write ``env.json`` (and
    ``baseline/env.json``: the set-up's machine, which later steps' refreshes leave as it was) and SKILL.md's
    state (schema v5) with ``ref_file`` the reference's copy, ``ref_source`` the reference given, and the SHA-256
    of every copy and of the registries. Returns the state's JSON object. Raises OSError when a file cannot be
    copied."""
    layout = RunLayout.of(run_dir)
    layout.baseline_dir.mkdir(parents=True, exist_ok=False)
    copy = layout.baseline_kernel(baseline.name)
    pinned = pin_file(layout, baseline, copy)
    ref_copy, ref_pins = pin_reference(layout, ref)
    write_json(layout.env, dict(env))
    write_json(layout.baseline_dir / "env.json", dict(env))  # the set-up's machine, kept when later steps refresh
    state = State(run_dir=str(run_dir), baseline_file=str(baseline), ref_file=str(ref_copy), ref_source=str(ref),
                  best_file=str(copy), env=dict(env), validation_seeds=list(seeds), dims=dict(dims),
                  iterations_total=iterations, ncu_num=ncu_num, branches=branches, noise_threshold_pct=noise_pct,
                  numerics_mode=numerics_mode, generation_allowed=bool(env.get("generation_allowed")),
                  hardware_attempts=list(env.get("hardware_attempts", [])),
                  pinned_sha256={**pinned, **ref_pins}, registries_sha256=registry_hashes())
    return state.save(run_dir).to_json()


def stop_run(run_dir: Path, reason: str, stage: str, exit_code: int, details: Any = None) -> dict[str, Any]:
    """Record a stop (SKILL.md: every failure after state creation writes ``stop.json`` and ``run_status=stopped``)
    and render the stopped summary. Later iterations stay uncreated. Returns ``stop.json``'s object."""
    layout = RunLayout.of(run_dir)
    stop = Stop.now(reason, stage, exit_code, details)
    stop.save(layout.stop)
    state = State.update(run_dir, run_status="stopped", stop_reason=reason, stop_stage=stage, open_iter=None)
    write_text(layout.summary, render_summary(state.to_json(), run_dir))
    return stop.to_json()


def open_iteration(run_dir: Path, i: int, *, ncu_rep: Path | None, roofline: Mapping[str, Any], branches: int,
                   ncu_top: Mapping[str, Any], evidence_of: str | None = None) -> Path:
    """Publish ``iterv{i}/`` once its pre-generation gates passed: the profile of the current best
    (``best_input.ncu-rep`` copied from ``ncu_rep``, ``ncu_top.json``), ``roofline.json``, an ``analysis.md``
    template, empty ``branches/b1..bK/`` and ``ablations/``. ``evidence_of`` names the kernel the evidence is of
    (recorded in ``ncu_top.json`` as ``evidence_of``; SKILL.md 3a: the current best). Returns the folder. Raises
    the loop's ConfigError when the iteration's folder exists as a link (planted before it opened)."""
    layout = RunLayout.of(run_dir)
    it = layout.iteration(i)
    planted = [p for p in (it.dir, it.branches_dir, it.ablations_dir)
               if (p.exists() or p.is_symlink()) and layout.contained(p) is not None]
    if planted:  # a folder made before the iteration opens is not the run's: its files would land where it leads
        raise loop_error(f"{it.dir} cannot be opened", [str(layout.contained(p)) for p in planted], path=it.dir,
                         fix=f"remove {planted[0]} (the loop makes the iteration's folders itself), then run the "
                             "same command again")
    it.ablations_dir.mkdir(parents=True, exist_ok=True)
    for k in range(1, branches + 1):
        it.branch_dir(k).mkdir(parents=True, exist_ok=True)
    if ncu_rep is not None and ncu_rep.is_file():
        shutil.copy2(ncu_rep, it.best_input_rep)
    top = dict(ncu_top)
    if evidence_of:
        top["evidence_of"] = evidence_of
    write_json(it.ncu_top, top)
    write_json(it.roofline, dict(roofline))
    if not it.analysis.exists():
        write_text(it.analysis, analysis_template(i, roofline, ncu_top, branches))
    state = State.load(run_dir)
    history = list(state.roofline_history)
    if not history:  # the run's first profile (the baseline's); every later one is a champion's, added at its close
        history.append(roofline_entry(i, "best_input", roofline, layout.relative(evidence_of or state.best_file),
                                      None))
    state.replace({"open_iter": i, "run_status": "iterating", "roofline_history": history}).save(run_dir)
    return it.dir


#: The roofline figures ``roofline_history`` keeps of each profile.
ROOFLINE_KEPT = ("delta_compute", "delta_memory", "delta_latency", "bound", "near_peak", "axis_budget",
                 "achieved_flops", "arithmetic_intensity", "sol_pct_fp32")


def roofline_entry(i: int, profile: str, roofline: Mapping[str, Any], kernel: str,
                   improved_best: bool | None) -> dict[str, Any]:
    """One ``roofline_history`` entry: the gaps of ``kernel`` (a path in the run) as profiled for iteration ``i``:
    ``profile`` ``best_input`` (the run's first profile, the baseline going into iteration 1) or ``champion`` (the
    iteration's champion, at its close; ``improved`` says whether it became the best)."""
    return {"iter": i, "profile": profile, "kernel": kernel, "improved": improved_best,
            **{k: roofline.get(k) for k in ROOFLINE_KEPT}}


def analysis_template(i: int, roofline: Mapping[str, Any], ncu_top: Mapping[str, Any], branches: int = 2) -> str:
    """``iterv{i}/analysis.md`` as the iteration opens (:func:`pytest_kopt.loop.analysis.template`; ``branches`` is
    kept for callers of the older signature)."""
    return analysis.template(i, roofline, ncu_top)


def iteration_kernels(run_dir: Path, i: int) -> tuple[list[Path], dict[str, Path]]:
    """Branch kernels in ``b1..bK`` order and ablation kernels by method id, as written by the agent and
    validated (:func:`pytest_kopt.loop.written.scan`; raises the loop's ConfigError)."""
    found = scan(RunLayout.of(run_dir), i, State.load(run_dir).branches)
    return list(found.branches), dict(found.ablations)


def close_iteration(run_dir: Path, i: int, *, results: list[dict[str, Any]], champion: Mapping[str, Any],
                    methods: list[str], attr: Mapping[str, Mapping[str, Any]], sass: Mapping[str, str],
                    champion_roofline: Mapping[str, Any] | None, champion_bench: Mapping[str, Any],
                    best_ms_now: float | None = None, decision: Mapping[str, Any] | None = None,
                    sass_detail: Mapping[str, Any] | None = None,
                    not_written: list[str] | None = None,
                    steps: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Write ``branch_results.json``, ``attribution.json``, ``sass_check.json``, ``bench.json`` and the champion's
    ``kernel.<ext>`` (pinned) into ``iterv{i}/``; update the method buckets, best, history and frontier (SKILL.md
    3j). ``best_ms_now`` (ms): the best kernel so far re-timed beside the champion on one GPU (a multi-GPU
    session's decision), used instead of the stored ``best_metric_ms`` for the improvement test; ``decision``:
    that re-timing's record, kept in ``branch_results.json`` and the history; ``not_written``: the branch folders
    left empty; ``steps``: the machine each step of the close ran on (:func:`pytest_kopt.loop.envs.step_record`).
    ``attribution.json`` and the history carry the residual (:func:`~pytest_kopt.loop.decisions.residual`), the
    history whether the iteration was verified (:func:`~pytest_kopt.loop.decisions.verified`) and the best it was
    compared against; ``roofline_history`` gets the champion's gaps. Returns the state's JSON object."""
    layout = RunLayout.of(run_dir)
    it = layout.iteration(i)
    state = State.load(run_dir)
    noise = float(state.noise_threshold_pct)
    BranchResults(iter=i, branches=list(results), champion=champion["branch"],
                  decision=dict(decision) if decision else None,
                  not_written=not_written or None).save(it.branch_results)
    # status per method, and per method the opcodes looked for, found and missing (or why it cannot be shown)
    SassCheck(methods=dict(sass), evidence=dict(sass_detail or {})).save(it.sass_check)
    write_json(it.bench, dict(champion_bench))
    src = Path(champion["kernel"])
    pinned = pin_file(layout, src, it.kernel(src.suffix))
    buckets = state.buckets
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
    best = state.best_metric_ms if best_ms_now is None else best_ms_now
    is_better = improved(champion["median_ms"], best, noise)
    res = residual(best, champion["median_ms"], attr)
    # the residual beside the methods' attributions, where an agent reads them
    Attribution(champion_ms=champion["median_ms"], noise_threshold_pct=noise,
                methods={m: dict(a) for m, a in attr.items()}, residual=res).save(it.attribution)
    updates: dict[str, Any] = {f"{b}_methods": v for b, v in buckets.items()}
    updates["selected_methods"] = list(dict.fromkeys([*state.selected_methods, *methods]))
    updates["pinned_sha256"] = {**state.pinned_sha256, **pinned}
    if is_better:
        updates.update(best_file=str(it.kernel(src.suffix)), best_metric_ms=champion["median_ms"],
                       best_ncu_rep=str(it.champion_rep), best_gpu_uuid=champion.get("gpu_uuid"),
                       best_sass=dict(champion.get("sass_digest") or {}))
    # a close re-run after a crash between this write and the next iteration's opening replaces its own entries
    history = [h for h in state.history if h.get("iter") != i]
    frontier = [f for f in state.frontier if f.get("iter") != i]
    updates["frontier"] = [*frontier, *[{"iter": i, **r} for r in results
                                        if r["branch"] != champion["branch"] and r.get("passed")]]
    entry = {"iter": i, "champion": champion["branch"], "champion_ms": champion["median_ms"], "improved": is_better,
             "previous_best_ms": best, "previous_best_source": "state" if best_ms_now is None else "re-timed",
             "methods": methods, "verdicts": verdicts, "verified": verified(verdicts), "attribution": dict(attr),
             "residual": res, "sass": dict(sass), "roofline": dict(champion_roofline or {}),
             "same_sass_as_best": champion.get("same_sass_as_best"),
             "decision_gpu": (decision or {}).get("gpu_uuid"), **({"steps": list(steps)} if steps else {})}
    updates["history"] = [*history, entry]
    # SKILL.md: an unverified iteration never increments verified_iterations
    done = [h for h in updates["history"] if h.get("verified", True)]
    updates["verified_iterations"] = len(done)
    updates["last_verified_iter"] = max((int(h["iter"]) for h in done), default=0)
    # the champion's own gaps (SKILL.md 3j appends the roofline at the update): the final champion's among them
    kept_roof = [r for r in state.roofline_history if not (r.get("iter") == i and r.get("profile") == "champion")]
    updates["roofline_history"] = [*kept_roof, roofline_entry(i, "champion", champion_roofline or {},
                                                              layout.relative(it.kernel(src.suffix)), is_better)]
    return state.replace(updates).save(run_dir).to_json()
