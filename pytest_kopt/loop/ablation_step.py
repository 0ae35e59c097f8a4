"""A close's second step: the champion's ablations judged in this session, attribution against the champion's time
from the branch step (re-timed beside them on one GPU when a difference between GPUs could flip an attribution),
then the iteration concluded on the claims the branch step judged."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from ..errors import EXIT_HARDWARE, KoptError
from ..records import GateRecord, blocker, for_kernel, passed, stage
from . import gates, schema, state as st
from .branch_step import BestSoFar, ablation_results, same_gpu_decision
from .conclude import conclude
from .gates import Context
from .layout import RunLayout
from .result import Closing, StepResult
from .runstate import AblationStep, State, champion_sass
from .view import elsewhere, next_step
from .written import Written


def ablation_step(run_dir: Path, state: State, pending: AblationStep, found: Written, records: list[GateRecord],
                  ctx_for: Callable[[Path], Context], finalize: bool, finish: str | None = None,
                  steps: list[dict[str, Any]] | None = None) -> StepResult:
    """Conclude the close on the claims its branch step judged (``pending.methods``;
    :func:`~pytest_kopt.loop.overrides.run_overrides` refuses a methods.json edited since). An ablation that could
    not run its GPU gates here leaves the step open (exit 3); a champion judged again (no ablation written) that
    now fails a strict gate stops the run (exit 2). ``state``, ``pending`` and ``found`` are
    :func:`~pytest_kopt.loop.overrides.load_open_run`'s: the champion is the kernel the branch step judged.
    ``finish`` (this step's methods.json) or the branch step's ends the run after the close; ``steps``: the machine
    this step ran on, after the branch step's."""
    it = RunLayout.of(run_dir).iteration(pending.iter)
    champ = pending.champion
    methods = list(pending.methods)
    champion = dict(next(r for r in pending.results if r["branch"] == champ))
    cpath = Path(champion["kernel"])
    cdir = ctx_for(cpath).outdir
    crecs = for_kernel(records, cpath)
    if passed(crecs, "sass"):
        # this session dumped the champion's SASS again (judged again, no ablation written): that dump is the one
        # the methods are verified on, and the one a later step of this close checks against
        pending = dataclasses.replace(pending, champion_sass_sha256=champion_sass(cdir))
        State.update(run_dir, ablation_step=pending)
        champion["sass_digest"] = gates.digests(cdir / "sass")
    fresh = {m: a for m, a in ablation_results(found.ablations, found.bases, methods, records, ctx_for).items()
             if a["base"] == champ}
    hw = next((m for m, a in fresh.items() if a.get("stage") == "hardware"), None)
    if hw is not None:
        return StepResult(EXIT_HARDWARE, f"{it.name}: the ablation of {hw} could not run its GPU gates here "
                                         f"({fresh[hw]['message']}); the ablation step stays open: run the same "
                                         "command where the GPU is",
                          elsewhere(next_step(run_dir), f"this one could not run the ablation of {hw}'s GPU gates "
                                                        f"({fresh[hw]['message']})"),
                          ablations=fresh, stage="hardware")
    table = ctx_for(cpath).gates
    block = blocker(crecs, table.branch_strict, table) if crecs else None
    if block is not None:
        where, code = stage(block, table)
        if where == "hardware":
            return StepResult(EXIT_HARDWARE, f"{it.name}: champion {champ} could not run its GPU gates here "
                                             f"({block.message}); run the same command where the GPU is",
                              elsewhere(next_step(run_dir), f"this one could not run champion {champ}'s GPU gates "
                                                            f"({block.message})"),
                              stage="hardware")
        st.stop_run(run_dir, f"champion {champ} failed {block.gate} when judged again in the ablation step: "
                    f"{block.message}", where, code)
        return StepResult(code, f"{it.name}: champion {champ} passed its gates in the branch step but failed "
                                f"{block.gate} when judged again ({block.message}); run stopped", next_step(run_dir),
                          stage=where)
    # the methods are verified on the champion's SASS as kopt last dumped it (the agent's folder between the steps)
    if (changed := pending.sass_problem(cdir)) is not None:
        raise schema.loop_error(f"{it.name}: the champion {champ}'s SASS changed between the close's steps",
                                [changed], path=cdir / "sass",
                                fix="restore the champion's sass/ folder as the branch step wrote it (kopt's dump "
                                    "of the judged kernel: the methods are verified on it)")
    judged = {**pending.ready, **fresh}
    why = {m: f"ablation built from {found.bases.get(m, 'b1')}, champion is {champ}"
           for m in methods if m not in judged and m in found.ablations}
    ab_kernels = {m: Path(a["kernel"]) for m, a in judged.items() if a["passed"]}
    cres = [{**champion, "finalist": True}]
    try:
        decision = same_gpu_decision(it.decision_ablations, BestSoFar.of(state), cres, ab_kernels, ctx_for)
    except KoptError as exc:
        st.stop_run(run_dir, f"re-timing the ablations on one GPU failed: {exc.message}", "timing", exc.exit_code)
        return StepResult(exc.exit_code, f"{it.name}: {exc.message}", next_step(run_dir), stage="timing")
    if decision is not None:
        champion["median_ms"] = cres[0]["median_ms"]
    retimed: dict[str, Any] = (decision or {}).get("retimed_ms", {})
    ab_ms = {m: retimed.get(f"ablations/{m}", judged[m]["median_ms"]) if m in judged else None for m in methods}
    out = conclude(Closing(run_dir=run_dir, i=pending.iter, results=list(pending.results), champion=champion,
                           methods=methods, ab_ms=ab_ms, judged=judged, champion_ctx=ctx_for(Path(champion["kernel"])),
                           why=why, decision=pending.decision, ablation_decision=decision,
                           best_ms_now=retimed.get("best", pending.best_ms_now), champion_bench=pending.champion_bench,
                           finalize=finalize or pending.finalize, finish=finish or pending.finish,
                           not_written=list(found.not_written), steps=[*pending.steps, *(steps or [])]))
    State.update(run_dir, ablation_step=None)
    return out
