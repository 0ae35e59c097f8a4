"""A close's branch step (SKILL.md 3e-3f): each branch's and ablation's outcome from this session's gate records,
the same-GPU decision where the kernels were timed on several GPUs, the champion, and the ablations still needed
of it (the close's second step, :mod:`pytest_kopt.loop.ablation_step`, judges those)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ..artifacts import BENCH, Bench, read_dict
from ..errors import EXIT_HARDWARE, EXIT_KERNEL, EXIT_OK, Blocked, KoptError
from ..records import GateRecord, blocker, for_kernel, passed, stage
from ..stats import bootstrap_median_ci
from . import decisions, gates, state as st
from .gates import Context
from .layout import IterationLayout, RunLayout, branch_index
from .records import BranchResults, Decision
from .result import Closing, StepResult
from .runstate import AblationStep, State, champion_sass
from .pins import file_sha256
from .view import elsewhere, next_step
from .written import Written


@dataclass(frozen=True, slots=True)
class BestSoFar:
    """The best kernel so far as a close compares against it: its ``file``, its median ``ms`` and the ``gpu_uuid``
    that timed it, and the run's ``noise_pct`` (the improvement threshold, %)."""

    file: Path | None
    ms: float | None
    gpu_uuid: str | None
    noise_pct: float

    @classmethod
    def of(cls, state: State) -> "BestSoFar":
        return cls(Path(state.best_file), state.best_metric_ms, state.best_gpu_uuid, state.noise_threshold_pct)


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


def branch_results(branches: list[Path] | tuple[Path, ...], records: list[GateRecord],
                   ctx_for: Callable[[Path], Context],
                   best_sass: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Each branch's outcome in this session (``branch``, ``index`` (k of ``b{k}``), ``kernel``, ``median_ms`` in
    ms, ``passed``, ``failed_gate``, ``stage``, ``status``, ``message``, ``gpu_uuid``), in ``b1..bK`` order, with
    ``sass_digest`` (``{function: instruction digest}``, {} when its sass gate did not pass in this session) and
    ``same_sass_as_best``: True when every kernel function's instructions equal the best kernel's (``best_sass``,
    the state's), so the branch changed nothing the GPU runs; None when either side has no SASS."""
    results = []
    for position, kernel in enumerate(branches, start=1):
        recs = for_kernel(records, kernel)
        table = ctx_for(kernel).gates
        block = blocker(recs, table.branch_strict, table)
        outdir = ctx_for(kernel).outdir
        t = timing_of(Bench.load(outdir) if block is None and timed_here(recs) else None)
        sass_ran = passed(recs, "sass")
        digest = gates.digests(outdir / "sass") if block is None and sass_ran else {}
        same = (digest == dict(best_sass)) if digest and best_sass else None
        results.append({"branch": kernel.parent.name, "index": branch_index(kernel.parent.name) or position,
                        "kernel": str(kernel), **t, "sass_digest": digest, "same_sass_as_best": same,
                        "passed": block is None and t["median_ms"] is not None,
                        "failed_gate": block.gate if block else None,
                        "stage": stage(block, table)[0] if block else None,
                        "status": block.status if block else "PASSED",
                        "message": block.message if block else None})
    return results


def ablation_results(ablations: Mapping[str, Path], bases: Mapping[str, str], methods: list[str],
                     records: list[GateRecord], ctx_for: Callable[[Path], Context]) -> dict[str, dict[str, Any]]:
    """Each claimed method's ablation as judged in this session: ``{"kernel", "base", "passed", "median_ms",
    "gpu_uuid", "status", "message"}`` (``bases``: method -> the branch its ``base`` names). Ablations of methods
    not claimed, or not judged in this session, are left out."""
    out: dict[str, dict[str, Any]] = {}
    for m, k in ablations.items():
        recs = for_kernel(records, k)
        if m not in methods or not recs:
            continue
        table = ctx_for(k).gates
        block = blocker(recs, table.branch_strict, table)
        t = timing_of(Bench.load(ctx_for(k).outdir) if block is None and timed_here(recs) else None)
        ok = t["median_ms"] is not None
        out[m] = {"kernel": str(k), "base": bases.get(m, "b1"), "passed": ok,
                  "stage": stage(block, table)[0] if block else None, **t,
                  "status": block.status if block else ("PASSED" if ok else "NOT_TIMED"),
                  "message": block.message if block else None}
    return out


def ablation_request(champion: str, methods: list[str], judged: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The claimed methods whose ablation of ``champion`` is still needed: not written, or written from another
    branch (``base``). A failed ablation of the champion counts as given (its attribution is inconclusive, and
    the agent is told why)."""
    return [m for m in methods if m not in judged or judged[m]["base"] != champion]


def same_gpu_decision(record: Path, best: BestSoFar, results: list[dict[str, Any]], ab_kernels: Mapping[str, Path],
                      ctx_for: Callable[[Path], Context]) -> dict[str, Any] | None:
    """When the iteration's kernels were timed on more than one GPU, make each decision from times of one GPU
    wherever a difference between GPUs could change it (:func:`pytest_kopt.loop.decisions.retime_plan`), by
    re-timing those kernels in alternating rounds on this process's GPU (:func:`pytest_kopt.loop.gates.retime`).
    Rewrites the re-timed finalists' ``median_ms`` in ``results`` (see
    :func:`~pytest_kopt.loop.decisions.apply_retimes`). Returns the decision record (also written to ``record``:
    ``retimed_ms`` holds the re-timed medians, ``robust`` why the others were not re-timed), or None when one GPU
    (or none) measured everything. Raises the harness's KoptError when a re-timing fails."""
    benches = {m: Bench.load(ctx_for(k).outdir) for m, k in ab_kernels.items()}
    ab = {m: (b.median_ms, b.gpu_uuid) for m, b in benches.items() if b is not None and b.median_ms is not None}
    plan = decisions.retime_plan(results, ab, best.ms, best.gpu_uuid, best.noise_pct)
    if plan is None:
        return None
    by_branch = {f"branches/{r['branch']}": Path(r["kernel"]) for r in results}
    names: list[str] = []
    kernels: list[Path] = []
    best_note = None
    for name in plan["retime"]:
        if name == "best":
            if best.file is None or not best.file.is_file():
                best_note = f"the best kernel so far ({best.file}) is gone; stored best_metric_ms used"
                continue
            try:
                gates.build(ctx_for(best.file))
            except (KoptError, Blocked) as exc:  # the improvement test then uses the stored best_metric_ms
                best_note = f"the best kernel so far did not build here ({exc}); stored best_metric_ms used"
                continue
            kernel = best.file
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
        timed = gates.retime([ctx_for(k) for k in kernels])
        retimed = {n: t["median_ms"] for n, t in zip(names, timed)}
        retimed_ci95 = {n: bootstrap_median_ci(t["samples_ms"]) for n, t in zip(names, timed) if t.get("samples_ms")}
    gpu = ctx_for(kernels[0]).env.get("gpu") or {}
    decisions.apply_retimes(results, plan["finalists"], retimed, gpu.get("uuid"), retimed_ci95)
    decision = Decision(method="interleaved re-timing on one GPU (pytest_kopt.gates.timing.retime_interleaved)",
                        gpu_uuid=gpu.get("uuid"), gpu_index=gpu.get("index"), measured_on=plan["measured_on"],
                        finalist_margin_pct=decisions.FINALIST_MARGIN_PCT, max_finalists=decisions.MAX_FINALISTS,
                        champion_contest=plan["contest"], retimed_ms=retimed,
                        retimed_ci95_ms={n: list(ci) for n, ci in retimed_ci95.items()}, robust=plan["robust"],
                        kernels=dict(zip(names, map(str, kernels))) if retimed else {},
                        stop_reasons={n: t["stop_reason"] for n, t in zip(names, timed)},
                        reported_gpu={n: t["gpu_uuid"] for n, t in zip(names, timed)}, best_note=best_note)
    decision.save(record)
    return decision.to_json()


def branch_step(run_dir: Path, state: State, found: Written, methods: list[str], records: list[GateRecord],
                ctx_for: Callable[[Path], Context], finalize: bool, finish: str | None = None,
                steps: list[dict[str, Any]] | None = None) -> StepResult | Closing:
    """The close's first step: judge the branches and the ablations written with them, pick the champion (from
    times of one GPU where needed), profile it (:func:`pytest_kopt.loop.conclude.profile_champion`). Returns the
    :class:`Closing` to conclude on when every claimed method has an ablation of the champion, else the step's
    result: exit 3 (a branch could not run its GPU gates here on a machine that allows generation, say its kind's
    tool is missing: the iteration stays open), 2 (every branch failed: the run stops), or 0 with
    ``write_ablations`` (the champion's ablations are asked for, the state keeps the step as ``ablation_step``).
    ``finish``: the agent's reason to end the run after this close; ``steps``: the machine this step ran on."""
    from .conclude import profile_champion

    i = int(state.open_iter or 0)
    layout = RunLayout.of(run_dir)
    it = layout.iteration(i)
    results = branch_results(found.branches, records, ctx_for, state.best_sass)
    judged = ablation_results(found.ablations, found.bases, methods, records, ctx_for)
    not_written = list(found.not_written) or None
    if not any(r["passed"] for r in results) and any(r["stage"] == "hardware" for r in results):
        # the GPU (or a tool) is missing: a branch that could not be timed is not a failed branch
        hw = next(r for r in results if r["stage"] == "hardware")
        return StepResult(EXIT_HARDWARE, f"{it.name}: {hw['branch']} could not run its GPU gates here "
                                         f"({hw['message']}); the iteration stays open: run --kopt-run again "
                                         "where the GPU is",
                          elsewhere(next_step(run_dir), f"this one could not run {hw['branch']}'s GPU gates "
                                                        f"({hw['message']})"),
                          branches=results, not_written=not_written, stage="hardware")
    ab_kernels = {m: Path(a["kernel"]) for m, a in judged.items() if a["passed"]}
    try:
        decision = same_gpu_decision(it.decision, BestSoFar.of(state), results, ab_kernels, ctx_for)
    except KoptError as exc:
        st.stop_run(run_dir, f"re-timing the finalists on one GPU failed: {exc.message}", "timing", exc.exit_code)
        return StepResult(exc.exit_code, f"{it.name}: the finalists could not be re-timed on one GPU: {exc.message}",
                          next_step(run_dir), stage="timing")
    ab_gate_ms = {m: judged[m]["median_ms"] if m in judged else None for m in methods}
    champion, ab_ms, best_ms_now = decisions.decided(results, ab_gate_ms, decision)
    if champion is None:
        BranchResults(iter=i, branches=results, champion=None, not_written=not_written).save(it.branch_results)
        st.stop_run(run_dir, "all branches failed a strict gate", "branch_explore", EXIT_KERNEL, results)
        return StepResult(EXIT_KERNEL, f"{it.name}: every branch failed a strict gate; run stopped",
                          next_step(run_dir), branches=results, not_written=not_written, stage="branch_explore")
    cctx = ctx_for(Path(champion["kernel"]))
    failed = profile_champion(run_dir, it, cctx, state, champion["branch"])
    if failed is not None:
        return failed
    needed = ablation_request(champion["branch"], methods, judged)
    if not needed:
        return Closing(run_dir=run_dir, i=i, results=results, champion=champion, methods=methods, ab_ms=ab_ms,
                       judged=judged, champion_ctx=cctx, decision=decision, best_ms_now=best_ms_now,
                       finalize=finalize, finish=finish, not_written=list(found.not_written), steps=list(steps or []))
    step = AblationStep(iter=it.index, champion=champion["branch"], champion_kernel=champion["kernel"],
                        champion_sha256=str(file_sha256(Path(champion["kernel"]))), champion_ms=champion["median_ms"],
                        champion_bench=read_dict(cctx.outdir / BENCH), methods=methods, needed=needed,
                        ready={m: a for m, a in judged.items() if m not in needed}, best_ms_now=best_ms_now,
                        results=results, decision=decision, finalize=finalize, finish=finish,
                        steps=list(steps or []), champion_sass_sha256=champion_sass(cctx.outdir))
    return _ask_for_ablations(run_dir, it, step, judged, not_written)


def _ask_for_ablations(run_dir: Path, it: IterationLayout, step: AblationStep, judged: dict[str, dict[str, Any]],
                       not_written: list[str] | None) -> StepResult:
    """Keep the branch step in the state (``step``: what the second step concludes on) and ask for the champion's
    ablations of ``step.needed`` at named paths (their folders made, so they can be written as named)."""
    for m in step.needed:
        it.ablation_dir(m).mkdir(parents=True, exist_ok=True)
    State.update(run_dir, ablation_step=step)
    BranchResults(iter=it.index, branches=step.results, champion=step.champion, decision=step.decision,
                  awaiting_ablations=step.needed, not_written=not_written).save(it.branch_results)
    stale = {m: judged[m]["base"] for m in step.needed if m in judged}
    return StepResult(EXIT_OK, f"{it.name}: champion {step.champion} {step.champion_ms:.4f} ms; write its ablation for "
                               f"{', '.join(step.needed)} (base {step.champion}) and run the same command again to "
                               "conclude the iteration", next_step(run_dir), stage="branch_explore",
                      iteration=it.index, branches=step.results, champion=step.champion,
                      champion_ms=step.champion_ms, ablations=judged, ablations_needed=step.needed,
                      stale_ablations=stale, failed_branches=[r["branch"] for r in step.results if not r["passed"]],
                      not_written=not_written)
