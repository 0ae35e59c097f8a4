"""The end of a close: the champion's profile (SKILL.md 3g), then attribution (3h), SASS verification (3i), the
method buckets and best (3j), the next iteration on the best kernel's evidence or the run's completion, plots and
summary."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from .. import registry
from ..artifacts import read_dict, write_json, write_text
from ..errors import EXIT_HARDWARE, EXIT_OK, Blocked, KoptError
from . import analysis, decisions, envs, finish, gates, state as st, summary
from .gates import Context
from .layout import IterationLayout, RunLayout
from .result import Closing, StepResult
from .runstate import State
from .view import next_step


def profile_champion(run_dir: Path, it: IterationLayout, cctx: Context, state: State,
                     branch: str) -> StepResult | None:
    """ncu and roofline of the champion with the run's ncu bundle (SKILL.md 3g: kept identical to the first
    profile); copies ``kernel.ncu-rep``, ``kernel_ncu_top.json`` and ``kernel_roofline.json`` into the iteration.
    Returns None, or the step's result of a stop (exit 3) when the profile failed or used another bundle."""
    try:
        gates.profile_champion(cctx)
    except (KoptError, Blocked) as exc:
        text = exc.message if isinstance(exc, KoptError) else str(exc)
        if gates.counters_unreadable(text):
            envs.counters_readable(run_dir, False)
        st.stop_run(run_dir, f"champion profile failed: {text}", "ncu", EXIT_HARDWARE)
        return StepResult(EXIT_HARDWARE, f"{it.name}: champion {branch} could not be profiled: {text}",
                          next_step(run_dir), stage="ncu")
    top = read_dict(cctx.outdir / "ncu_top.json") or {}
    if state.ncu_set and top.get("set") != state.ncu_set:
        text = (f"the champion was profiled with the {top.get('set')} ncu set, the run with {state.ncu_set} "
                "(SKILL.md 3g: one bundle for the whole run)")
        st.stop_run(run_dir, f"champion profile failed: {text}", "ncu", EXIT_HARDWARE)
        return StepResult(EXIT_HARDWARE, f"{it.name}: {text}", next_step(run_dir), stage="ncu")
    envs.counters_readable(run_dir, True)  # this step's machine read them
    shutil.copy2(cctx.outdir / "kernel.ncu-rep", it.champion_rep)
    write_json(it.champion_ncu_top, top)  # never over the best-input profile's ncu_top.json
    write_json(it.champion_roofline, read_dict(cctx.outdir / "roofline.json") or {})
    return None


def best_name(run_dir: Path, state: State) -> str:
    """The best kernel so far as a path inside the run (``iterv1/kernel.cu``, ``baseline/gemm.cu``)."""
    return RunLayout.of(run_dir).relative(state.best_file)


def conclude(c: Closing) -> StepResult:
    """Attribution, SASS verification, buckets, the next iteration (on the best kernel's evidence) or the run's
    completion, plots and summary, from what the close decided (:class:`~pytest_kopt.loop.result.Closing`)."""
    run_dir, i, champion = c.run_dir, c.i, c.champion
    layout = RunLayout.of(run_dir)
    it = layout.iteration(i)
    state = State.load(run_dir)
    why = dict(c.why)
    for m in c.methods:
        a = c.judged.get(m)
        if a is None:
            why.setdefault(m, f"no ablation of {champion['branch']} written")
        elif not a["passed"]:
            why.setdefault(m, f"the ablation failed {a['status']}: {a['message']}")
    attr = decisions.attribution(champion["median_ms"], c.ab_ms, float(state.noise_threshold_pct), why)
    texts = [p.read_text() for p in sorted((c.champion_ctx.outdir / "sass").glob("*.sass"))]
    evidence = gates.evidence(c.methods, texts, registry.load(registry.SASS))
    sass = {m: e["status"] for m, e in evidence.items()}
    bench = dict(c.champion_bench or read_dict(c.champion_ctx.outdir / "bench.json") or {})
    decision: dict[str, Any] | None = dict(c.decision) if c.decision else None
    if c.ablation_decision:
        decision = {**(decision or {}), "ablation_step": dict(c.ablation_decision)}
    roof = read_dict(it.champion_roofline) or {}
    before = state
    closed = st.close_iteration(run_dir, i, results=c.results, champion=champion, methods=c.methods, attr=attr,
                                sass=sass, sass_detail=evidence, champion_roofline=roof, champion_bench=bench,
                                best_ms_now=c.best_ms_now, decision=decision, not_written=c.not_written,
                                steps=c.steps)
    state = State.from_json(closed, layout.state)
    entry = state.history[-1]
    is_better = bool(entry["improved"])
    same = (" (its SASS is the best kernel's, instruction for instruction: the methods changed nothing the GPU "
            "runs, so they stay unverified)" if champion.get("same_sass_as_best") else "")
    # SKILL.md 3a: the next iteration profiles the current best; a champion that did not improve leaves the best,
    # and so its evidence (this iteration's best-input profile), as it was
    if is_better:
        ev_roof, ev_top, rep = roof, read_dict(it.champion_ncu_top) or {}, it.champion_rep
    else:
        ev_roof, ev_top, rep = read_dict(it.roofline) or {}, read_dict(it.ncu_top) or {}, it.best_input_rep
    near = bool(ev_roof.get("near_peak"))
    done = c.finalize or bool(c.finish) or i >= state.iterations_total or near
    head = (f"{it.name} closed: champion {champion['branch']} {champion['median_ms']:.4f} ms{same}"
            f"{'' if is_better else ' (no improvement: the best stays ' + best_name(run_dir, state) + ')'}")
    analysis.write_closed(it, state, entry, c.results)
    if c.finish:
        state = finish.record_finish(run_dir, c.finish, None)
        msg = f"{head}; run finished by the agent ({c.finish})"
    elif done:
        reason = "finalized" if c.finalize else ("near_peak" if near else "iterations done")
        state = State.update(run_dir, run_status="completed", open_iter=None, completion=reason)
        msg = f"{head}; run completed ({reason})"
    else:
        nxt = st.open_iteration(run_dir, i + 1, ncu_rep=rep, roofline=ev_roof, branches=state.branches,
                                ncu_top=ev_top, evidence_of=state.best_file)
        state = State.load(run_dir)
        msg = f"{head}; {nxt.name} open"
    if not c.finish:  # record_finish drew them
        summary.plot_history(state.to_json(), run_dir)
        write_text(layout.summary, summary.render_summary(state.to_json(), run_dir))
    compared = {"best_ms": entry["previous_best_ms"], "best_file": best_name(run_dir, before),
                "source": entry["previous_best_source"], "noise_pct": before.noise_threshold_pct,
                "threshold_ms": (entry["previous_best_ms"] * (1 - before.noise_threshold_pct / 100.0)
                                 if entry["previous_best_ms"] is not None else None)}
    return StepResult(EXIT_OK, msg, next_step(run_dir), stage="finish" if c.finish else "conclude", iteration=i,
                      branches=c.results, champion=champion["branch"], champion_ms=champion["median_ms"],
                      improved=is_better, compared_against=compared, ablations=c.judged, attribution=attr,
                      residual=entry.get("residual"), sass=sass, verdicts=entry["verdicts"],
                      failed_branches=[r["branch"] for r in c.results if not r["passed"]],
                      not_written=c.not_written or None, finish=c.finish)
