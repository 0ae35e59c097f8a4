"""The run as the agent reads it: ``next`` (what to write and the command to run) and the run's part of the
``--kopt-json`` report's ``loop`` section, both from a validated :class:`~pytest_kopt.loop.runstate.State`.

A command is built only from validated values (state.json's schema: absolute paths of the expected kind, numbers,
an enum), each option written as ``--kopt-x=VALUE``, so no value can ever be read as another option (a
``baseline_file`` of ``-pNAME`` would otherwise load ``NAME`` as a pytest plugin).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .. import defaults, registry
from ..artifacts import read_dict
from ..artifacts.io import cut
from ..errors import EXIT_HARDWARE, ConfigError
from .layout import RunLayout
from .records import Stop
from .runstate import State, load_or_none

#: The start of ``next.command``: pytest through this process's interpreter (an absolute path), so an agent that
#: runs the command gets the installation that wrote the report, not whatever ``python3`` is first on its PATH.
PYTEST = (sys.executable or "python3", "-m", "pytest")


def option(flag: str, value: Any) -> str:
    """``--kopt-x=VALUE``: one argv element, which argparse never splits or reads as another option."""
    return f"{flag}={value}"


def run_command(layout: RunLayout, report: Path, state: State, *, finalize: bool = False) -> list[str]:
    """The ``--kopt-run`` command of the run (``-n``: :data:`pytest_kopt.defaults.CLOSE_WORKERS`) with the run's
    ``ncu_num`` (the close uses the state's; a different ``--kopt-ncu-num`` is refused), its report at ``report``
    (last)."""
    return [*PYTEST, option("--kopt-run", layout.root), "-n", str(defaults.CLOSE_WORKERS),
            option("--kopt-ncu-num", state.ncu_num), *(["--kopt-finalize"] if finalize else []),
            option("--kopt-json", report)]


def seed_of(state: State, layout: RunLayout) -> Path:
    """The kernel a new run starts from: the best kernel so far (its copy in this run: ``iterv<i>/kernel.<ext>``)
    once an iteration improved on the baseline, else the baseline as given to ``--kopt-init``."""
    best = Path(state.best_file)
    return best if best != layout.baseline_kernel(Path(state.baseline_file).name) and best.is_file() \
        else Path(state.baseline_file)


def init_command(state: State, layout: RunLayout | None = None) -> list[str]:
    """The ``--kopt-init`` command that seeds a new run from this one's best kernel (:func:`seed_of`) with
    everything else this one was seeded with (the reference as given, dims, iterations, branches, noise, numerics
    mode, ncu_num); the new run is made beside this one (:func:`pytest_kopt.loop.state.run_home`), its report
    there as :func:`start_over_report`."""
    layout = layout or RunLayout.of(state.run_dir)
    return [*PYTEST, "--kopt-init", option("--kopt-baseline", seed_of(state, layout)),
            option("--kopt-ref", state.ref_source), option("--kopt-dims", json.dumps(state.dims)),
            option("--kopt-iterations", state.iterations_total), option("--kopt-branches", state.branches),
            option("--kopt-noise", state.noise_threshold_pct), option("--kopt-numerics-mode", state.numerics_mode),
            option("--kopt-ncu-num", state.ncu_num), option("--kopt-json", start_over_report(layout))]


def start_over_report(layout: RunLayout) -> Path:
    """Where the ``start_over`` command of the run at ``layout`` writes its report: beside the run, named after it
    (``kopt-init-<run>.json``, the run's name cut to 200 bytes: a file name holds 255), so two stopped runs of one
    folder started over at once write two reports."""
    return layout.root.parent / f"kopt-init-{cut(layout.root.name, 200)}.json"


def report_of(command: list[str] | None) -> str | None:
    """Where ``command`` (argv) writes its JSON report: its ``--kopt-json`` value, None where it has none."""
    for arg in command or []:
        if arg.startswith("--kopt-json="):
            return arg.split("=", 1)[1]
    return None


def rerun_writing(nxt: dict[str, Any], report: Path | None) -> dict[str, Any]:
    """``nxt`` (a ``loop.next``) with its ``report`` read from its command; a ``fix_and_rerun`` command that writes
    no report (the run's state could not be read, so no step's report path is known) made to write ``report`` (the
    session's own ``--kopt-json`` path, absolute)."""
    command = nxt.get("command")
    if nxt.get("action") == "fix_and_rerun" and report is not None and report_of(command) is None:
        command = [*(command or []), f"--kopt-json={report}"]
    return with_derived_fields({**nxt, "command": command})


#: What ``requires`` names: a machine where the loop's GPU steps can run (SKILL.md step 0's generation_allowed).
GPU_MACHINE = "a machine with an NVIDIA GPU, nvcc and ncu that can read its counters"


def elsewhere(nxt: dict[str, Any], why: str) -> dict[str, Any]:
    """``nxt`` to be run on another machine: ``requires`` names it (:data:`GPU_MACHINE`, then ``why``: what this
    one lacks or where it stopped), and its derived fields follow (``runs_here`` False)."""
    return with_derived_fields({**nxt, "requires": f"{GPU_MACHINE}: {why}"})


def with_derived_fields(nxt: dict[str, Any]) -> dict[str, Any]:
    """``nxt`` with the fields read off its others: ``report`` (its command's ``--kopt-json``) and ``runs_here``
    (None without a command; False where ``requires`` names another machine, as the command would stop here the
    same way; else as ``nxt`` says, True where it does not: None is "not known", from a session that stopped
    while it was being configured, or a stop whose exit code cannot be read)."""
    command = nxt.get("command")
    here = None if not command else False if nxt.get("requires") else nxt.get("runs_here", True)
    return {**nxt, "report": report_of(command), "runs_here": here}


def next_step(run_dir: Path) -> dict[str, Any]:
    """What the agent does next, as data (the ``--kopt-json`` report's ``loop.next``): ``action``, the files to
    ``read`` (the evidence) and to ``write``, the ``command`` to run (argv), the ``report`` it writes (its
    ``--kopt-json`` path; None without a command) and ``runs_here`` (:func:`with_derived_fields`). Paths are absolute.
    Actions:

    - ``write_and_close`` while an iteration is open: ``methods.json``, one kernel per branch, optionally an
      ablation per selected method (``ablations/<method>/kernel.*`` with a ``base`` file naming its branch); with
      the axis ``budget``;
    - ``write_ablations`` after the first step of a close: the ``champion`` and, in ``ablations``, per method the
      ``kernel`` and ``base`` paths to write (``base`` holds the champion's name); the same command concludes;
    - ``done`` once completed (finished by the agent too: ``finish`` holds its reason), ``start_over`` once
      stopped: the ``--kopt-init`` command that seeds a new run from the best kernel so far (``seeds_from``), its
      report beside this run (:func:`start_over_report`), and in ``reuse`` the files the agent wrote into the iteration
      the stop left (to write again into the new run's iteration 1 once it opens); a stop for want of a GPU or tool
      (exit 3) says in ``requires`` where the command can succeed: here it would stop the same way.

    In ``write`` only concrete paths: ``write_and_close`` lists methods.json and the branch kernels; the optional
    ablations are in ``ablations`` (one entry per method methods.json claims, once it is written) and, as a
    pattern, ``ablation_pattern``; ``finish`` says how to end the run instead.

    Raises the loop's ConfigError when the run's state is bad."""
    return with_derived_fields(_next_step(run_dir))


def _next_step(run_dir: Path) -> dict[str, Any]:
    layout = RunLayout.of(run_dir)
    state = State.load(run_dir)
    if state.run_status == "completed":
        read = [str(layout.summary), str(layout.state), *([str(layout.stop)] if layout.stop.is_file() else [])]
        return {"action": "done", "read": read, "write": [], "command": None,
                **({"finish": state.stop_reason} if state.completion == "finished" else {})}
    i = state.open_iter
    if state.run_status == "stopped" or not i:
        stop = stop_record(run_dir)
        # the machine, not the kernel (exit 3), stopped it: the same command here stops the same way. Where
        # stop.json (which holds the exit code) cannot be read, state.json's stage says so for a hardware stop;
        # for another stage it is not known (a run still initializing has no stop)
        machine = stop.exit_code == EXIT_HARDWARE if stop is not None else True if state.stop_stage == "hardware" \
            else None if state.run_status == "stopped" else False
        stage = stop.stop_stage if stop is not None else state.stop_stage
        step = {"action": "start_over", "reason": state.stop_reason, "requires": None,
                "seeds_from": str(seed_of(state, layout)), "reuse": left_behind(layout),
                "read": [str(p) for p in (layout.state, layout.stop, layout.summary) if p.is_file()], "write": [],
                "command": init_command(state, layout), **({"runs_here": None} if machine is None else {})}
        return elsewhere(step, f"this one stopped at {stage} ({state.stop_reason})") if machine else step
    it = layout.iteration(i)
    ext = Path(state.baseline_file).suffix
    pending = state.pending
    if pending is not None:
        cext = Path(pending.champion_kernel).suffix  # the champion's language
        abl = [{"method": m, "kernel": str(it.ablation_dir(m) / f"kernel{cext}"), "base": str(it.base_file(m))}
               for m in pending.needed]
        return {"action": "write_ablations", "iteration": i, "champion": pending.champion,
                "champion_kernel": pending.champion_kernel, "ablations": abl,
                "read": [str(it.branch_results), pending.champion_kernel, str(it.champion_ncu_top),
                         str(it.champion_roofline)],
                "write": [p for a in abl for p in (a["kernel"], a["base"])],
                # the branch step's report stays as it was
                "command": run_command(layout, it.report_ablations, state, finalize=pending.finalize)}
    roof = read_dict(it.roofline) or {}
    top = read_dict(it.ncu_top) or {}
    rows = top.get("top") if isinstance(top.get("top"), dict) else {}
    return {"action": "write_and_close", "iteration": i, "budget": roof.get("axis_budget"),
            "bound": roof.get("bound"), "evidence_of": top.get("evidence_of"),
            "top": {axis: [{"name": r.get("name"), "value": r.get("value"), "unit": r.get("unit")}
                           for r in (v if isinstance(v, list) else []) if isinstance(r, dict)]
                    for axis, v in rows.items()},
            "ablations_when": "optional here: written now with a base naming the eventual champion, the close takes "
                              "one step; otherwise the close asks for the champion's (action write_ablations)",
            "ablations": [{"method": m, "kernel": str(it.ablation_dir(m) / f"kernel{ext}"), "base": str(it.base_file(m))}
                          for m in claimed(it)],
            "ablation_pattern": {"kernel": str(it.ablations_dir / "{method}" / f"kernel{ext}"),
                                 "base": str(it.ablations_dir / "{method}" / "base")},
            "finish": f'to end the run instead, write {{"finish": "<why>"}} into {it.methods} (beside "methods": '
                      "after this close) and run the command",
            "numerics_mode": state.numerics_mode,
            # the registries the methods come from, where this install keeps them (site-packages for a wheel)
            "read": [str(it.roofline), str(it.ncu_top), str(it.analysis), str(layout.state)]
            + [str(registry.path(n)) for n in (registry.METHODS, "optimization_catalog.md", "ncu_metrics_guide.md")],
            # the same files by what they are
            "files": {"roofline": str(it.roofline), "ncu_top": str(it.ncu_top), "analysis": str(it.analysis),
                      "state": str(layout.state), "method_registry": str(registry.path(registry.METHODS)),
                      "optimization_catalog": str(registry.path("optimization_catalog.md")),
                      "ncu_metrics_guide": str(registry.path("ncu_metrics_guide.md"))},
            "write": [str(it.methods), *(str(it.branch_dir(b) / f"kernel{ext}") for b in range(1, state.branches + 1))],
            # the same paths by what they are, so an agent never takes a path apart
            "methods_file": str(it.methods),
            "branch_kernels": {f"b{b}": str(it.branch_dir(b) / f"kernel{ext}") for b in range(1, state.branches + 1)},
            "command": run_command(layout, it.report, state)}


def claimed(it: Any) -> list[str]:
    """The method ids the iteration's methods.json claims, [] when it is not written or cannot be read (a view
    never fails on it; the close validates it)."""
    doc = read_dict(it.methods)
    listed = doc.get("methods") if isinstance(doc, dict) else None
    ids = [m if isinstance(m, str) else m.get("id") if isinstance(m, dict) else None for m in listed or []]
    return [m for m in dict.fromkeys(ids) if isinstance(m, str) and m]


def left_behind(layout: RunLayout) -> list[str]:
    """The files the agent wrote into the last iteration a stopped run left (methods.json, branch and ablation
    kernels), to write again into a new run's iteration 1; [] when there is none."""
    # the iteration the stop left: the last one opened and not concluded (no attribution.json)
    iters = [p for p in layout.root.glob("iterv*") if p.name.removeprefix("iterv").isdigit() and p.is_dir()
             and not (p / "attribution.json").is_file()]
    iters.sort(key=lambda p: int(p.name.removeprefix("iterv")))
    if not iters:
        return []
    it = iters[-1]
    found = [it / "methods.json", *sorted(it.glob("branches/b*/kernel.*")), *sorted(it.glob("ablations/*/kernel.*"))]
    return [str(p) for p in found if p.is_file() and not p.is_symlink()]


def run_view(run_dir: Path) -> dict[str, Any]:
    """The run as the ``--kopt-json`` report's ``loop`` section shows it beside the step's own result: ``phase``
    (``iterating``, ``ablations`` while a close waits for the champion's ablations, ``completed``, ``stopped``),
    ``open_iter``, ``baseline_ms``, ``best_ms`` and ``best_file`` (the best kernel so far), ``verified_iterations``
    the method ``buckets`` (SKILL.md 3j: ``effective``, ``ineffective``, ``implementation_failed``,
    ``unverified``, each a list of method ids, with each method's latest ``reasons``), every ``selected_methods``
    so far (re-selecting one needs an ``override_reason``), the run's ``numerics_mode`` and ``ncu_num``, its
    ``completion`` and the ``machine`` of its latest step. {} when there is no valid state."""
    state = load_or_none(run_dir)
    if state is None:
        return {}
    phase = "ablations" if state.run_status == "iterating" and state.ablation_step else state.run_status
    reasons: dict[str, str] = {}
    for h in state.history:
        for m, a in (h.get("attribution") or {}).items():
            pct = a.get("attribution_pct")
            sass = (h.get("sass") or {}).get(m)
            same = ("; the champion's SASS is the best kernel's, instruction for instruction (the method changed "
                    "nothing the GPU runs)" if h.get("same_sass_as_best") else "")
            reasons[m] = (f"iterv{h['iter']}: {(h.get('verdicts') or {}).get(m)}; attribution "
                          f"{'inconclusive (' + str(a.get('reason')) + ')' if pct is None else f'{pct:.1f}%'}; "
                          f"SASS {sass}{same}")
    gpu = state.env.get("gpu") or {}
    return {"phase": phase, "open_iter": state.open_iter, "baseline_ms": state.baseline_ms,
            "best_ms": state.best_metric_ms, "best_file": state.best_file,
            "verified_iterations": state.verified_iterations, "last_verified_iter": state.last_verified_iter,
            "buckets": state.buckets, "reasons": reasons, "selected_methods": list(state.selected_methods),
            "numerics_mode": state.numerics_mode, "ncu_num": state.ncu_num, "completion": state.completion,
            # the machine of the run's latest step (env.json; each close's own is iterv<i>/env.json)
            "machine": {"gpu": gpu.get("name"), "gpu_uuid": gpu.get("uuid"), "sm_arch": state.env.get("sm_arch"),
                        "generation_allowed": state.generation_allowed}}


def stop_record(run_dir: Path) -> Stop | None:
    """The run's ``stop.json``, None when there is none or it is unreadable (a view never fails on it)."""
    path = RunLayout.of(run_dir).stop
    if not path.is_file():
        return None
    try:
        return Stop.load(path)
    except ConfigError:  # a bad stop.json reads as none here: state.json holds the stop's reason
        return None
