"""``--kopt-run``'s configuration from the run directory: every loop file validated (state.json, its pinned inputs,
the open iteration's folders, methods.json against the registry and the budget, the ablation step's claims and
champion), then the session's kernels, pinned reference, dims and seeds. Any problem is the loop's ConfigError
(exit 4), every problem listed; nothing here writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import registry
from ..artifacts import Roofline, read_dict
from ..errors import ConfigError
from . import pins, schema
from .layout import RunLayout
from .methods import validate_methods
from .runstate import State
from .written import METHODS_FIX, Written, read_methods, scan


def load_open_run(run_dir: Path) -> tuple[State, Written, dict[str, Any]]:
    """The run's state, what the agent wrote into its open iteration and its methods.json (full form), each
    validated: the state's schema and paths (:meth:`~pytest_kopt.loop.runstate.State.check_paths`), the pinned
    inputs unchanged (:func:`pytest_kopt.loop.pins.check`), an ablation step's champion as its branch step judged
    it (:meth:`~pytest_kopt.loop.runstate.AblationStep.champion_problem`), the iteration's folders
    (:func:`pytest_kopt.loop.written.scan`), methods.json's types. Raises the loop's ConfigError (exit 4)."""
    layout = RunLayout.of(run_dir)
    state = State.load(run_dir)
    i = state.open_iter
    if state.run_status != "iterating" or not i:
        raise schema.loop_error(f"--kopt-run: {run_dir} has no open iteration",
                                [f"state.json: run_status is {state.run_status}, open_iter {i} (stop_reason "
                                 f"{state.stop_reason})"], path=layout.state, fix="start a new run with --kopt-init")
    state.check_paths(layout)
    changed = pins.check(layout, state.pinned_sha256, state.registries_sha256)
    if changed:
        raise schema.loop_error(f"--kopt-run: the inputs {run_dir} pinned at --kopt-init changed", changed,
                                path=layout.state, fix="restore the run's copies as --kopt-init made them (the "
                                "reference and baseline given to --kopt-init are copied in reference/ and "
                                "baseline/; the registries are pytest-kopt's), or start a new run with --kopt-init")
    pending = state.pending
    if pending is not None and (changed_champion := pending.champion_problem()) is not None:
        raise schema.loop_error(f"--kopt-run: {changed_champion}", [changed_champion], path=pending.champion_kernel,
                                fix="restore it as it was judged: the branch results, the profile and the ablations "
                                    "asked for are of that kernel")
    it = layout.iteration(i)
    methods = read_methods(it)
    found = scan(layout, i, state.branches, [m["id"] for m in methods["methods"]])
    return state, found, methods


def run_overrides(run_dir: Path) -> dict[str, Any]:
    """--kopt-run: the session's options from the run (the open iteration's branches and ablations as kernels,
    the run's private copy of the reference, its dims, seeds, ncu set and ``ncu_num``), as ``{"baseline",
    "candidate", "ref", "dims", "seeds", "ncu_set", "ncu_num", "_run_dir"}``. A methods.json that only finishes the
    run (:mod:`pytest_kopt.loop.finish`) names the best kernel so far as the session's kernel, which the loop's
    plugin then leaves unjudged. Raises ConfigError (exit 4) when the folder is not an open run or any of its files
    is bad (see :func:`load_open_run`, :func:`check_methods`)."""
    try:
        state, found, methods = load_open_run(run_dir)
    except (OSError, UnicodeError) as exc:  # a file that vanished or cannot be read between the checks
        raise schema.loop_error(f"--kopt-run: {run_dir} cannot be read", [str(exc)], path=run_dir,
                                fix="check the run directory's files and permissions") from None
    i = int(state.open_iter or 0)
    it = RunLayout.of(run_dir).iteration(i)
    common = {"ncu_set": state.ncu_set, "ncu_num": state.ncu_num, "ref": state.ref_file,
              "dims": json.dumps(state.dims), "seeds": ",".join(str(int(s)) for s in state.validation_seeds),
              "_run_dir": str(run_dir)}
    if finishes_now(state, methods):
        return {**common, "baseline": state.best_file, "candidate": []}
    if not found.branches:
        raise schema.loop_error(f"--kopt-run: {it.branches_dir}/b*/ hold no kernel.cu or kernel.py",
                                [f"{it.branch_dir(b)}: no kernel.cu or kernel.py" for b in found.not_written],
                                path=it.branches_dir, fix="write the branch kernels first (SKILL.md step 3d)")
    check_methods(state, it.dir, methods)
    kernels = [*found.branches, *found.ablations.values()]
    pending = state.pending
    if pending is not None:
        now = [m["id"] for m in methods["methods"]]
        if now != list(pending.methods):
            raise schema.loop_error(f"{it.methods} changed since the close's branch step judged the branches",
                                    [f"methods.json claims {now}; the branches were judged under {pending.methods}"],
                                    path=it.methods, gate="methods",
                                    fix="restore methods.json as it was: the ablation step concludes on the claims "
                                        "the branches were judged under (to end the run after this close, keep "
                                        'them and add "finish": "<why>")')
        # the second step of a close judges only the champion's ablations (the branches were judged in the first);
        # with none written, the champion itself, so that the session has a kernel and the step concludes
        ids = set(now)
        kernels = [k for m, k in found.ablations.items() if m in ids and m in pending.needed
                   and found.bases[m] == pending.champion] or [Path(pending.champion_kernel)]
    return {**common, "baseline": str(kernels[0]), "candidate": [str(k) for k in kernels[1:]]}


def finishes_now(state: State, methods: dict[str, Any]) -> bool:
    """True when methods.json ends the run now: ``finish`` with no method, and no close waiting for ablations
    (:mod:`pytest_kopt.loop.finish`)."""
    return bool(methods.get("finish")) and not methods.get("methods") and state.pending is None


def check_methods(state: State, it: Path, methods: dict[str, Any], arch: str | None = None) -> None:
    """methods.json against the registry, the iteration's axis budget (``roofline.json``), the method history
    (methods selected in earlier iterations), the iteration's ncu evidence (SKILL.md 3c) and, with ``arch``, the
    target the step builds for (None at configure: the step's machine is not probed yet; the step's end checks it
    with that machine's arch). Raises ConfigError (gate ``methods``) listing each broken rule, with its fields in
    ``figures["problem_details"]``."""
    i = int(state.open_iter or 0)
    path = it / "methods.json"
    roof = Roofline.load(it)
    budget = roof.axis_budget if roof is not None else {}
    bad = [f"roofline.json: axis_budget.{axis} is {budget.get(axis)!r}, not a count of method slots"
           for axis in ("compute", "memory", "latency") if axis in budget
           and (not isinstance(budget[axis], int) or isinstance(budget[axis], bool) or budget[axis] < 0)]
    if bad:
        raise schema.loop_error(f"{it / 'roofline.json'} is not the iteration's evidence as pytest-kopt wrote it",
                                bad, path=it / "roofline.json",
                                fix="restore roofline.json (the iteration's evidence is not the agent's to edit)")
    top = read_dict(it / "ncu_top.json") or {}
    launches = top.get("launches") if isinstance(top.get("launches"), list) else []
    metrics = top.get("metrics") if isinstance(top.get("metrics"), dict) else {}
    first = launches[0].get("metrics") if launches and isinstance(launches[0], dict) else None
    evidence = dict(metrics) or (dict(first) if isinstance(first, dict) else {})
    # methods selected in earlier iterations (a close re-run after a crash has its own claims in the history)
    earlier = [m for h in state.history if int(h["iter"]) < i for m in h["methods"]]
    view = {**state.to_json(), "selected_methods": list(dict.fromkeys(earlier))}
    problems = validate_methods(methods, registry.load(registry.METHODS), budget, view, arch, evidence)
    if problems:
        raise ConfigError(f"{path} is not valid:\n  - " + "\n  - ".join(problems), gate="methods", path=str(path),
                          details="\n".join(f"- {p}" for p in problems),
                          figures={"problem_details": [getattr(p, "detail", {"message": str(p)}) for p in problems]},
                          fix=f"follow the axis budget in roofline.json and {registry.path(registry.METHODS)}")


__all__ = ["METHODS_FIX", "check_methods", "finishes_now", "load_open_run", "run_overrides"]
