"""The loop's session-end steps, run by the pytest controller: seed the run (``--kopt-init``) or close the open
iteration (``--kopt-run``), each returning a :class:`~pytest_kopt.loop.result.StepResult`.

Plain Python over the gate records (:class:`pytest_kopt.records.GateRecord`), the artifacts and
:mod:`pytest_kopt.loop.gates`; GPU work happens in harness processes only. The close itself is split by concern:
:mod:`.overrides` (the session's configuration, every loop file validated), :mod:`.branch_step`,
:mod:`.ablation_step` and :mod:`.conclude`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from ..artifacts import Bench, NcuTop, Roofline, write_text
from .. import defaults
from ..errors import EXIT_HARDWARE, EXIT_KERNEL, EXIT_OK, ConfigError
from ..gates.hardware import generation_problem
from ..records import GateRecord, blocker, for_kernel, stage
from . import envs, gates, state as st
from .ablation_step import ablation_step
from .branch_step import BestSoFar, ablation_request, ablation_results, branch_results, branch_step, \
    same_gpu_decision, timed_here, timing_of
from .conclude import best_name, conclude
from .gates import Context
from .layout import RunLayout
from .finish import finish_now
from .overrides import check_methods, finishes_now, load_open_run, run_overrides
from .result import StepResult
from .runstate import State
from .summary import render_summary
from .view import PYTEST, elsewhere, next_step, option, with_derived_fields

__all__ = ["BestSoFar", "RUN_FIXED", "ablation_request", "ablation_results", "best_name", "branch_results",
           "finish_init", "finish_run", "finishing", "fixed_option_problems", "run_overrides", "same_gpu_decision",
           "timed_here", "timing_of"]


def finish_init(run_dir: Path, ctx: Context, records: list[GateRecord],
                env: Mapping[str, Any] | None = None) -> StepResult:
    """After the baseline session: stop the run when its machine does not allow generation (SKILL.md step 0:
    ``generation_allowed`` false, exit 3) or with the first failing (or skipped) strict gate's reason, or record
    the baseline (``best_metric_ms``, ``baseline_ms``) and open iteration 1 (or complete the run when the baseline
    is near the roofline). A bad loop file met here is exit 4, the run left as it is (its next marked to run
    elsewhere on a machine, ``env``: the session's probe, that does not allow generation)."""
    try:
        return _finish_init(run_dir, ctx, records)
    except ConfigError as exc:
        return StepResult.config_error(exc, _next_or_fix(run_dir, exc, env))


def _finish_init(run_dir: Path, ctx: Context, records: list[GateRecord]) -> StepResult:
    state = State.load(run_dir)
    no_generation = generation_problem(state.env)
    if no_generation is not None:
        reason = f"generation not allowed on this machine (SKILL.md step 0): {no_generation}"
        st.stop_run(run_dir, reason, "hardware", EXIT_HARDWARE)
        return StepResult(EXIT_HARDWARE, f"run stopped at hardware: {reason}; run --kopt-init where loop.next.requires "
                                         "says", next_step(run_dir), stage="hardware")
    block = blocker(for_kernel(records, ctx.kernel), ctx.gates.strict, ctx.gates)
    if block is not None:
        where, code = stage(block, ctx.gates)
        if block.gate == "ncu" and gates.counters_unreadable(block.message):
            envs.counters_readable(run_dir, False)
        st.stop_run(run_dir, f"{block.gate} {block.outcome}: {block.message}", where, code)
        hint = "; run --kopt-init on a machine with a GPU (loop.next.requires)" if code == EXIT_HARDWARE else ""
        return StepResult(code, f"run stopped at {where}: {block.message}{hint}", next_step(run_dir), stage=where)
    bench = Bench.load(ctx.outdir)
    roof = Roofline.load(ctx.outdir)
    top = NcuTop.load(ctx.outdir)
    if bench is None or bench.median_ms is None or roof is None or top is None:
        missing = [n for n, v in (("bench.json", bench), ("roofline.json", roof), ("ncu_top.json", top)) if v is None]
        st.stop_run(run_dir, f"the baseline's {', '.join(missing) or 'timing'} is missing after its gates passed "
                    "(were some gates deselected with -k?)", "timing", EXIT_KERNEL)
        return StepResult(EXIT_KERNEL, "run stopped: the baseline's evidence is incomplete; run --kopt-init without -k",
                          next_step(run_dir), stage="timing")
    envs.counters_readable(run_dir, True)  # the baseline's ncu profile read them
    state = State.update(run_dir, baseline_ms=bench.median_ms, best_metric_ms=bench.median_ms,
                         best_sass=gates.digests(ctx.outdir / "sass"), best_gpu_uuid=bench.gpu_uuid,
                         ncu_set=top.set, best_ncu_rep=str(ctx.outdir / "kernel.ncu-rep"))
    if roof.doc.get("near_peak"):
        # SKILL.md: early stop when every gap is known, a workload model is present and all are under 0.15
        state = State.update(run_dir, run_status="completed", open_iter=None, completion="near_peak")
        write_text(RunLayout.of(run_dir).summary, render_summary(state.to_json(), run_dir))
        return StepResult(EXIT_OK, f"run {run_dir} completed at the baseline: {bench.median_ms:.4f} ms is near the "
                                   "roofline (every gap under 0.15); nothing to optimize", next_step(run_dir),
                          baseline_ms=bench.median_ms, stage="near_peak")
    it = st.open_iteration(run_dir, 1, ncu_rep=ctx.outdir / "kernel.ncu-rep", roofline=roof.doc,
                           branches=state.branches, ncu_top=top.doc, evidence_of=state.best_file)
    b = roof.axis_budget
    return StepResult(EXIT_OK, f"run {run_dir} seeded: baseline {bench.median_ms:.4f} ms; {it.name} open, budget "
                               f"c/m/l {b['compute']}/{b['memory']}/{b['latency']}; write {it.name}/methods.json "
                               "and branches/b*/kernel.* (loop.next.write)", next_step(run_dir),
                      baseline_ms=bench.median_ms, stage="setup")


def finish_run(run_dir: Path, ctx_for: Callable[[Path], Context], records: list[GateRecord],
               finalize: bool, env: Mapping[str, Any] | None = None, arch: str | None = None) -> StepResult:
    """Close the open iteration from this session's results, or finish the run (:mod:`pytest_kopt.loop.finish`).

    ``env``: the environment of the machine this step ran on (the session's probe): recorded in the run and the
    iteration (:func:`pytest_kopt.loop.envs.refresh`); a machine that does not allow generation stops the run
    (SKILL.md step 0, exit 3; a finish needs no GPU and is never stopped for it), and the branch step checks the
    methods against this step's arch (``arch``: ``--kopt-arch``, else the step's GPU's). None (a caller without a
    probe: the loop's plain-function tests) keeps the run's env as it is.

    A close has one step when the agent wrote, before the close, an ablation of the eventual champion for every
    claimed method (``ablations/<method>/base`` names the champion), and two otherwise: the first judges the
    branches, picks and profiles the champion and asks, through ``next`` (action ``write_ablations``), for the
    champion's ablations at named paths; the second (the same ``--kopt-run`` command) judges only those and
    concludes. Attribution is then conclusive for whichever branch wins. The run's files are validated again
    here (they may have changed during the session): a bad one is exit 4, the iteration left open."""
    try:
        state, found, methods_doc = load_open_run(run_dir)
        methods = [m["id"] for m in methods_doc["methods"]]
        finish = methods_doc.get("finish")
        if finishes_now(state, methods_doc):
            return finish_now(run_dir, state, str(finish))
        pending = state.pending
        step = "ablations" if pending is not None else "branch_explore"
        steps: list[dict[str, Any]] = []
        if env is not None:
            state = envs.refresh(run_dir, env, state.open_iter, step)
            steps = [envs.step_record(env, step)]
            if (no_generation := generation_problem(env)) is not None:
                return _no_generation(run_dir, state, found, records, ctx_for, no_generation)
        if pending is not None:
            return ablation_step(run_dir, state, pending, found, records, ctx_for, finalize, finish, steps)
        if env is not None:
            it = RunLayout.of(run_dir).iteration(int(state.open_iter or 0))
            check_methods(state, it.dir, methods_doc, envs.step_arch(env, arch) or defaults.ARCH)
        out = branch_step(run_dir, state, found, methods, records, ctx_for, finalize, finish, steps)
        return out if isinstance(out, StepResult) else conclude(out)
    except ConfigError as exc:
        return StepResult.config_error(exc, _next_or_fix(run_dir, exc, env))


def finishing(run_dir: Path) -> bool:
    """True when a ``--kopt-run`` of this run finishes it without judging anything (methods.json holds only
    ``finish``: :mod:`pytest_kopt.loop.finish`); False otherwise, and for a run whose files are bad (the step's
    own validation reports those)."""
    try:
        state, _, methods_doc = load_open_run(run_dir)
    except (ConfigError, OSError, UnicodeError):
        return False
    return finishes_now(state, methods_doc)


#: The options ``--kopt-init`` fixes for the whole run (state.json's field for each): a ``--kopt-run`` that gives
#: another value is refused rather than silently overridden.
RUN_FIXED = {"ncu_num": "ncu_num", "iterations": "iterations_total", "branches": "branches",
             "noise": "noise_threshold_pct", "numerics_mode": "numerics_mode"}


def fixed_option_problems(run_dir: Path, given: Mapping[str, Any]) -> list[str]:
    """Each run-fixed option (:data:`RUN_FIXED`) given on a ``--kopt-run`` command line (``given``: option name ->
    its text, None when not given) with a value other than the run's state; [] when the state cannot be read (the
    step's validation reports that)."""
    try:
        state = State.load(run_dir)
    except ConfigError:
        return []
    out = []
    for name, field in RUN_FIXED.items():
        text = given.get(name)
        if text in (None, ""):
            continue
        want = getattr(state, field)
        try:
            same = float(text) == float(want) if not isinstance(want, str) else str(text) == want
        except ValueError:
            same = False
        if not same:
            out.append(f"--kopt-{name.replace('_', '-')} {text}: this run's {field} is {want} (state.json, fixed "
                       "by --kopt-init); leave the option out, or start a new run with --kopt-init")
    return out


def _no_generation(run_dir: Path, state: State, found: Any, records: list[GateRecord],
                   ctx_for: Callable[[Path], Context], why: str) -> StepResult:
    """Stop the run: this step's machine does not allow generation (SKILL.md step 0: "stop immediately;
    benchmark-only degradation is forbidden"). The branches as this session judged them are reported; the open
    iteration's files stay in the run, and ``next`` (``start_over``) seeds a new run from the best kernel so far
    and lists them to write again."""
    i = state.open_iter
    results = branch_results(found.branches, records, ctx_for, state.best_sass) if found.branches else None
    reason = f"generation not allowed on this machine (SKILL.md step 0): {why}"
    st.stop_run(run_dir, reason, "hardware", EXIT_HARDWARE)
    return StepResult(EXIT_HARDWARE, f"iterv{i}: run stopped at hardware: {reason}; loop.next.command seeds a new run "
                                     "from the best kernel so far, where loop.next.requires says", next_step(run_dir),
                      stage="hardware", iteration=i, branches=results)


def _next_or_fix(run_dir: Path, exc: ConfigError, env: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run's ``next`` when its state can be read, else ``fix_and_rerun``: the file to fix and the command. On a
    machine that does not allow generation (``env``: this step's, where it was probed), a command that would run
    again here is marked to run elsewhere (:func:`~pytest_kopt.loop.view.elsewhere`): fixed, it would stop the run
    (SKILL.md step 0), unless the fix is a ``finish`` of an iteration waiting for its branches."""
    try:
        step = next_step(run_dir)
    except ConfigError:
        step = {}
    nxt = _fix(run_dir, exc, step)
    problem = generation_problem(env) if env is not None else None
    if problem is not None and nxt.get("command") and nxt.get("runs_here") is not False:
        finish = "; a finish written into methods.json runs here" if step.get("action") == "write_and_close" else ""
        nxt = elsewhere(nxt, f"this one does not allow generation ({problem}){finish}")
    return nxt


def _fix(run_dir: Path, exc: ConfigError, step: dict[str, Any]) -> dict[str, Any]:
    """``step`` (the run's ``next``, {} where its state cannot be read) as the rerun after ``exc``'s file is fixed."""
    layout = RunLayout.of(run_dir)
    # without a readable state no step's report path is known: the plugin adds the session's own (rerun_writing)
    command = step.get("command") or [*PYTEST, option("--kopt-run", layout.root)]
    if step.get("action") in ("write_and_close", "write_ablations"):
        return {**step, "action": "fix_and_rerun", "write": [exc.path] if exc.path else step.get("write", [])}
    if step:
        return step
    return with_derived_fields({"action": "fix_and_rerun", "read": [str(layout.state)],
                                "write": [exc.path] if exc.path else [], "command": command, "reason": exc.message})

