"""The optimization loop's state (SKILL.md steps 1-4): run directory, iterations, champion, ablation attribution,
SASS verification, method buckets, stop records and the summary.

Plain Python over files: every function reads and writes the SKILL.md layout (``run_YYYYMMDD_HHMMSS/state.json``,
``baseline/``, ``iterv{i}/branches/b{k}/``, ``iterv{i}/ablations/<method>/``...). Only the pytest controller calls
the writers, once per session, atomically (temp file + ``os.replace``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

from .errors import EXIT_CONFIG, EXIT_HARDWARE, EXIT_KERNEL

STATE_SCHEMA = 5
#: SKILL.md: improvement and attribution are judged against a 2% noise threshold by default.
DEFAULT_NOISE_PCT = 2.0
REGISTRIES = Path(__file__).resolve().parent.parent / "registries"


def write_json(path: Path, data: Any) -> None:
    """Atomic JSON write: a temp file in the same folder, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, default=str)
    os.replace(tmp, path)


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
    (run_dir / "summary.md").write_text(render_summary(state, run_dir))
    return stop


def open_iteration(run_dir: Path, i: int, *, profile_dir: Path, roofline: Mapping[str, Any], branches: int,
                   ncu_top: Mapping[str, Any]) -> Path:
    """Publish ``iterv{i}/`` once its pre-generation gates passed: the profile of the current best
    (``best_input.ncu-rep``, ``ncu_top.json``), ``roofline.json``, empty ``branches/b1..bK/`` and ``ablations/``."""
    it = run_dir / f"iterv{i}"
    (it / "ablations").mkdir(parents=True, exist_ok=True)
    for k in range(1, branches + 1):
        (it / "branches" / f"b{k}").mkdir(parents=True, exist_ok=True)
    rep = profile_dir / "kernel.ncu-rep"
    if rep.is_file():
        shutil.copy2(rep, it / "best_input.ncu-rep")
    write_json(it / "ncu_top.json", dict(ncu_top))
    write_json(it / "roofline.json", dict(roofline))
    if not (it / "analysis.md").exists():
        (it / "analysis.md").write_text(analysis_template(i, roofline, ncu_top))
    state = load_state(run_dir)
    save_state(run_dir, {"open_iter": i, "run_status": "iterating",
                         "roofline_history": [*state["roofline_history"], {"iter": i, **{
                             k: roofline.get(k) for k in ("delta_compute", "delta_memory", "delta_latency", "bound",
                                                          "near_peak", "axis_budget", "achieved_flops",
                                                          "arithmetic_intensity", "sol_pct_fp32")}}]})
    return it


def analysis_template(i: int, roofline: Mapping[str, Any], ncu_top: Mapping[str, Any]) -> str:
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
              "## Branch plan (same methods, different hyperparameters)", "", "- b1: ", "- b2: ", ""]
    return "\n".join(lines)


def kernel_in(folder: Path) -> Path | None:
    """The ``kernel.cu`` or ``kernel.py`` of a branch/ablation folder, or None when the agent wrote none."""
    for ext in (".cu", ".py"):
        if (folder / f"kernel{ext}").is_file():
            return folder / f"kernel{ext}"
    return None


def iteration_kernels(run_dir: Path, i: int) -> tuple[list[Path], dict[str, Path]]:
    """Branch kernels in ``b1..bK`` order and ablation kernels by method id, as written by the agent."""
    it = run_dir / f"iterv{i}"
    branch_dirs = sorted((it / "branches").glob("b*"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0))
    branches = [k for k in (kernel_in(d) for d in branch_dirs) if k is not None]
    ablations = {d.name: k for d in sorted((it / "ablations").glob("*")) if (k := kernel_in(d)) is not None}
    return branches, ablations


# ------------------------------------------------------------------------------------------------ methods


def load_registry(name: str) -> dict[str, Any]:
    """``registries/<name>.json`` (``method_registry`` or ``sass_signatures``)."""
    return json.loads((REGISTRIES / f"{name}.json").read_text())


def validate_methods(doc: Mapping[str, Any], registry: Mapping[str, Any], budget: Mapping[str, int],
                     state: Mapping[str, Any], arch: str) -> list[str]:
    """Check ``methods.json`` (``{"methods": [{"id", "axis"?, "rationale"?, "override_reason"?,
    "acknowledge_failure"?}], "skipped_higher": [...]}``) against the registry and the iteration's axis budget.

    Rules (SKILL.md 3c): known ids; axis as registered; no duplicates; per axis at most min(2, budget[axis]) and in
    total at most sum(budget), where methods of one same-budget group count once (upstream rejects such pairs by
    mistake); no conflicting pair; the arch meets the method's minimum (and ``a`` suffix where required);
    ineffective methods need ``override_reason``; implementation-failed ones ``acknowledge_failure: true``.
    Returns the list of problems (empty when valid)."""
    errors: list[str] = []
    by_id = {m["id"]: m for m in registry["methods"]}
    chosen = list(doc.get("methods") or [])
    if not chosen:
        return ["methods.json lists no method"]
    ids = [m.get("id") for m in chosen]
    for dup in sorted({i for i in ids if ids.count(i) > 1}):
        errors.append(f"{dup}: listed twice")
    m_arch = re.match(r"sm_(\d+)([af]?)", arch)
    cc, suffix = (int(m_arch.group(1)), m_arch.group(2)) if m_arch else (0, "")
    for m in chosen:
        spec = by_id.get(m.get("id"))
        if spec is None:
            errors.append(f"{m.get('id')}: not in registries/method_registry.json")
            continue
        if m.get("axis") not in (None, spec["axis"]):
            errors.append(f"{spec['id']}: axis is {spec['axis']}, not {m['axis']}")
        if cc < spec["min_arch"] or (spec.get("arch_suffix") == "a" and suffix != "a"):
            errors.append(f"{spec['id']}: needs sm_{spec['min_arch']}{spec.get('arch_suffix', '')}+, target is {arch}")
        if spec["id"] in state.get("ineffective_methods", []) and not m.get("override_reason"):
            errors.append(f"{spec['id']}: was ineffective before; give override_reason (changed bottleneck)")
        if spec["id"] in state.get("implementation_failed_methods", []) and not m.get("acknowledge_failure"):
            errors.append(f"{spec['id']}: failed to implement before; set acknowledge_failure: true")
    known = [i for i in ids if i in by_id]
    for a, b in registry["relations"].get("conflicts", []):
        if a in known and b in known:
            errors.append(f"{a} and {b} conflict")
    slots = _slots(known, registry)
    for axis in ("compute", "memory", "latency"):
        used = sum(1 for s in slots if by_id[s[0]]["axis"] == axis)
        if used > min(2, budget.get(axis, 0)):
            errors.append(f"axis {axis}: {used} method slot(s), budget {budget.get(axis, 0)} (cap 2)")
    if len(slots) > sum(budget.values()):
        errors.append(f"{len(slots)} method slots, total budget {sum(budget.values())}")
    return errors


def _slots(ids: list[str], registry: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Group ids into budget slots: ids of one same-budget group share a slot."""
    slots: list[tuple[str, ...]] = []
    used: set[str] = set()
    for i in dict.fromkeys(ids):
        if i in used:
            continue
        group = [i]
        for pair in registry["relations"].get("same_budget", []):
            if i in pair:
                group += [j for j in pair if j != i and j in ids and j not in used]
        used.update(group)
        slots.append(tuple(group))
    return slots


# ------------------------------------------------------------------------------------------------ decisions


def select_champion(results: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """SKILL.md 3e: the fastest branch that passed every strict gate (compile, contract, correctness, timing);
    ties by the lower branch index. ``results`` items: ``{"branch": "b1", "index": 1, "median_ms", "passed"}``."""
    ok = [r for r in results if r.get("passed") and r.get("median_ms") is not None]
    return min(ok, key=lambda r: (r["median_ms"], r["index"])) if ok else None


#: Finalists of a decision timed on several GPUs: the passing branches within this many percent of the fastest;
#: also the allowance for a difference between GPUs when deciding whether a comparison needs re-timing on one GPU.
#: Measured: on two H200 x2 machines (2026-11-29) the same 8 SGEMM kernels timed within 0.25% on either GPU of a
#: machine; 10% leaves room for GPUs of one model with unequal clocks, power limits or cooling.
FINALIST_MARGIN_PCT = 10.0
#: At most this many finalists (each is re-timed in its own process, in alternating rounds).
MAX_FINALISTS = 4


def finalists(results: list[Mapping[str, Any]], margin_pct: float = FINALIST_MARGIN_PCT,
              limit: int = MAX_FINALISTS) -> list[Mapping[str, Any]]:
    """The branches a decision re-times on one GPU: those that passed every strict gate with a median (ms) within
    ``margin_pct`` percent of the fastest, fastest first (ties by branch index), at most ``limit``. [] when none
    passed."""
    ok = sorted((r for r in results if r.get("passed") and r.get("median_ms") is not None),
                key=lambda r: (r["median_ms"], r["index"]))
    if not ok:
        return []
    cut = ok[0]["median_ms"] * (1 + margin_pct / 100.0)
    return [r for r in ok if r["median_ms"] <= cut][:limit]


def attribution(champion_ms: float, ablations: Mapping[str, float | None], noise_pct: float,
                inconclusive: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """attribution(m) = ms_without_m - ms_champion (SKILL.md 3h), also as % of the champion's time; ``contributed``
    is True when that % exceeds ``noise_pct``, False when it does not, None (inconclusive) when the ablation is
    missing or failed (upstream counts a missing ablation as contributed: we do not)."""
    out: dict[str, dict[str, Any]] = {}
    for method, ms in ablations.items():
        why = (inconclusive or {}).get(method)
        if ms is None or why:
            out[method] = {"ms_without": ms, "attribution_ms": None, "attribution_pct": None, "contributed": None,
                           "reason": why or "ablation missing or failed"}
            continue
        delta = ms - champion_ms
        pct = 100.0 * delta / champion_ms
        out[method] = {"ms_without": ms, "attribution_ms": delta, "attribution_pct": pct,
                       "contributed": pct > noise_pct}
    return out


_OPCODE_RE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:\{\s*)?(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", re.M)


def sass_opcodes(sass_texts: list[str]) -> set[str]:
    """Full opcodes (mnemonic + modifiers) in the instruction lines of the kernel functions' SASS only, so a symbol
    name or header comment never matches (upstream matched substrings of the whole dump)."""
    ops: set[str] = set()
    for text in sass_texts:
        ops.update(_OPCODE_RE.findall(text))
    return ops


def _has(ops: set[str], pattern: str) -> bool:
    return any(op == pattern or op.startswith(pattern + ".") for op in ops)


def sass_verify(methods: list[str], sass_texts: list[str], signatures: Mapping[str, Any]) -> dict[str, str]:
    """Per claimed method: ``pass`` (its signature's opcodes appear), ``fail`` (they do not), ``not_applicable``
    (no signature: counts as unverified) or ``tool_error`` (no SASS at all: never pass)."""
    if not sass_texts or not any(t.strip() for t in sass_texts):
        return {m: "tool_error" for m in methods}
    ops = sass_opcodes(sass_texts)
    out: dict[str, str] = {}
    for m in methods:
        sig = signatures["signatures"].get(m)
        if not sig:
            out[m] = "not_applicable"
            continue
        ok_all = all(_has(ops, p) for p in sig.get("require_all", []))
        ok_any = not sig.get("require_any") or any(_has(ops, p) for p in sig["require_any"])
        out[m] = "pass" if ok_all and ok_any else "fail"
    return out


def classify(contributed: bool | None, sass_status: str) -> str:
    """SKILL.md 3j buckets: effective only when attribution > noise AND SASS verified; implementation_failed on a
    SASS fail (the claimed instructions are not there); ineffective when attribution is conclusive and <= noise
    and verification is conclusive; unverified otherwise (ablation or verification inconclusive)."""
    if sass_status == "fail":
        return "implementation_failed"
    if contributed is None or sass_status in ("not_applicable", "tool_error", "inconclusive"):
        return "unverified"
    return "effective" if contributed else "ineffective"


def improved(new_ms: float, best_ms: float | None, noise_pct: float) -> bool:
    """SKILL.md: a new best only when faster than best x (1 - noise%)."""
    return best_ms is None or new_ms < best_ms * (1 - noise_pct / 100.0)


def close_iteration(run_dir: Path, i: int, *, results: list[dict[str, Any]], champion: Mapping[str, Any],
                    methods: list[str], attr: Mapping[str, Mapping[str, Any]], sass: Mapping[str, str],
                    champion_roofline: Mapping[str, Any] | None, champion_bench: Mapping[str, Any],
                    best_ms_now: float | None = None, decision: Mapping[str, Any] | None = None) -> dict[str, Any]:
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
    write_json(it / "sass_check.json", {"methods": dict(sass)})
    write_json(it / "bench.json", dict(champion_bench))
    src = Path(champion["kernel"])
    shutil.copy2(src, it / f"kernel{src.suffix}")
    buckets = {b: list(state.get(f"{b}_methods", [])) for b in
               ("effective", "ineffective", "implementation_failed", "unverified")}
    verdicts = {}
    for m in methods:
        bucket = classify((attr.get(m) or {}).get("contributed"), sass.get(m, "tool_error"))
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
                       best_ncu_rep=str(it / "kernel.ncu-rep"), best_gpu_uuid=champion.get("gpu_uuid"))
    updates["frontier"] = [*state.get("frontier", []),
                           *[{"iter": i, **r} for r in results if r["branch"] != champion["branch"] and r.get("passed")]]
    updates["history"] = [*state.get("history", []), {
        "iter": i, "champion": champion["branch"], "champion_ms": champion["median_ms"], "improved": is_better,
        "previous_best_ms": best, "methods": methods, "verdicts": verdicts, "attribution": dict(attr),
        "sass": dict(sass), "roofline": dict(champion_roofline or {}),
        "decision_gpu": (decision or {}).get("gpu_uuid")}]
    updates["verified_iterations"] = int(state.get("verified_iterations", 0)) + 1
    updates["last_verified_iter"] = i
    return save_state(run_dir, updates)


EXIT_FOR_STAGE = {"hardware": EXIT_HARDWARE, "ncu": EXIT_HARDWARE, "preflight": EXIT_CONFIG, "methods": EXIT_CONFIG}


def exit_code_for(stage: str) -> int:
    """SKILL.md's exit code of a stop at ``stage``: 3 hardware/ncu, 4 contract/methods, else 2."""
    return EXIT_FOR_STAGE.get(stage, EXIT_KERNEL)


# ------------------------------------------------------------------------------------------------ summary


def render_summary(state: Mapping[str, Any], run_dir: Path) -> str:
    """``summary.md``: headline speedup, roofline history, iteration timeline, method buckets, frontier, stop
    reason; embeds the PNG plots written by :func:`plot_history` when present."""
    lines = [f"# pytest-kopt run `{run_dir.name}`", ""]
    base = state.get("baseline_ms")
    best = state.get("best_metric_ms")
    status = state.get("run_status")
    if base and best:
        lines.append(f"**Headline:** {base:.4f} ms → {best:.4f} ms, **{base / best:.2f}x** over the baseline "
                     f"(`{Path(state['best_file']).relative_to(run_dir) if str(state['best_file']).startswith(str(run_dir)) else state['best_file']}`), "
                     f"{state.get('verified_iterations', 0)} verified iteration(s); run {status}.")
    else:
        lines.append(f"**Run {status}.** Baseline {'%.4f ms' % base if base else 'not timed'}.")
    if state.get("stop_reason"):
        lines += ["", f"**Stopped** at `{state.get('stop_stage')}`: {state['stop_reason']}"]
    lines += ["", f"Dims: `{json.dumps(state.get('dims'))}`; seeds {state.get('validation_seeds')}; noise threshold "
                  f"{state.get('noise_threshold_pct')}%.", "", "## Roofline history", "",
              "| iter | Δc | Δm | Δl | bound | budget c/m/l | % fp32 roofline |", "|---|---|---|---|---|---|---|"]

    def g(v: Any) -> str:
        return "null" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))

    for r in state.get("roofline_history", []):
        b = r.get("axis_budget") or {}
        lines.append(f"| {r['iter']} | {g(r.get('delta_compute'))} | {g(r.get('delta_memory'))} | "
                     f"{g(r.get('delta_latency'))} | {r.get('bound')} | {b.get('compute')}/{b.get('memory')}/"
                     f"{b.get('latency')} | {g(r.get('sol_pct_fp32'))} |")
    lines += ["", "## Iterations", "", "| iter | champion | ms | improved | methods (verdict, attribution %) |",
              "|---|---|---|---|---|"]
    for h in state.get("history", []):
        ms = ", ".join(f"{m} ({h['verdicts'].get(m)}, {g((h['attribution'].get(m) or {}).get('attribution_pct'))})"
                       for m in h["methods"])
        lines.append(f"| {h['iter']} | {h['champion']} | {h['champion_ms']:.4f} | {h['improved']} | {ms} |")
    lines += ["", "## Methods", ""]
    for b in ("effective", "ineffective", "implementation_failed", "unverified"):
        lines.append(f"- {b}: {', '.join(state.get(f'{b}_methods', [])) or '—'}")
    lines += ["", "## Frontier (non-champion branches that passed)", ""]
    for f in state.get("frontier", []):
        lines.append(f"- iter {f['iter']} {f['branch']}: {f['median_ms']:.4f} ms")
    if not state.get("frontier"):
        lines.append("- —")
    for png in ("speedup.png", "roofline_drift.png"):
        if (run_dir / png).is_file():
            lines += ["", f"![{png}]({png})"]
    return "\n".join(lines) + "\n"


def plot_history(state: Mapping[str, Any], run_dir: Path) -> list[str]:
    """``speedup.png`` (champion ms and speedup over the baseline per iteration) and ``roofline_drift.png`` (the
    three gaps per iteration). Returns the files written ([] without matplotlib or history)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    out = []
    base = state.get("baseline_ms")
    hist = state.get("history", [])
    if base and hist:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        xs = [0] + [h["iter"] for h in hist]
        ax.plot(xs, [1.0] + [base / h["champion_ms"] for h in hist], "o-")
        ax.set_xlabel("iteration")
        ax.set_ylabel("speedup over baseline (x)")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(run_dir / "speedup.png", dpi=100)
        plt.close(fig)
        out.append(str(run_dir / "speedup.png"))
    rh = state.get("roofline_history", [])
    if rh:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key, label in (("delta_compute", "Δc"), ("delta_memory", "Δm"), ("delta_latency", "Δl")):
            ax.plot([r["iter"] for r in rh], [r.get(key) for r in rh], "o-", label=label)
        ax.set_xlabel("iteration (profile of the best going in)")
        ax.set_ylabel("gap")
        ax.set_ylim(0, 1)
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(run_dir / "roofline_drift.png", dpi=100)
        plt.close(fig)
        out.append(str(run_dir / "roofline_drift.png"))
    return out
