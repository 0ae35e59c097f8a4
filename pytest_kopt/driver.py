"""Session-end steps of the loop, run by the pytest controller: seed the run (``--kopt-init``) or close the open
iteration (``--kopt-run``): champion, its profile, ablation attribution, SASS verification, next iteration.

Plain Python over the gate functions and :mod:`pytest_kopt.loop`; GPU work happens in child processes only.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any, Callable

from . import gates, loop
from .errors import Blocked, ConfigError, KoptError

#: Gates whose skip means the strict loop cannot go on (SKILL.md: no evidence, no generation).
STRICT_GATES = ("hardware", "preflight", "compile", "correctness", "timing", "ncu", "roofline")


def _kernel_records(records: list[dict[str, Any]], rootpath: Path, kernel: Path) -> list[dict[str, Any]]:
    return [r for r in records if (rootpath / r["nodeid"].split("::")[0]).resolve() == kernel.resolve()]


def _blocker(recs: list[dict[str, Any]], strict: tuple[str, ...]) -> dict[str, Any] | None:
    """The first failed record in gate order, else the first skipped strict gate, else None."""
    order = gates.GATE_ORDER
    failed = [r for r in recs if r["outcome"] == "failed"]
    if failed:
        return min(failed, key=lambda r: order.get(r["gate"] or "", 99))
    skipped = [r for r in recs if r["outcome"] == "skipped" and r["gate"] in strict]
    return min(skipped, key=lambda r: order.get(r["gate"] or "", 99)) if skipped else None


def _stage(block: dict[str, Any]) -> tuple[str, int]:
    """(stop stage, exit code) of a blocking record: a failure's own code; a skip is charged to the gate that
    blocked it (``blocked by hardware: ...`` -> hardware, exit 3)."""
    if block["outcome"] == "failed":
        return block["gate"], int(block.get("exit_code") or 2)
    m = re.search(r"blocked by (\w+)", block.get("message") or "")
    stage = m.group(1) if m else block["gate"]
    return stage, loop.exit_code_for(stage) if stage != block["gate"] or m else 3


def run_overrides(run_dir: Path) -> dict[str, Any]:
    """--kopt-run: kernel, reference, dims and seeds come from the run's state.json; the open iteration's branches
    and ablations are the kernels. Raises ConfigError when the folder is not an open run or methods.json is bad."""
    try:
        state = loop.load_state(run_dir)
    except (FileNotFoundError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--kopt-run: {run_dir} holds no readable state.json ({exc})",
                          fix="pass a run_YYYYMMDD_HHMMSS folder made by --kopt-init") from None
    i = state.get("open_iter")
    if not i:
        raise ConfigError(f"--kopt-run: {run_dir} has no open iteration (run_status {state.get('run_status')}, "
                          f"stop_reason {state.get('stop_reason')})", fix="start a new run with --kopt-init")
    it = run_dir / f"iterv{i}"
    branches, ablations = loop.iteration_kernels(run_dir, int(i))
    if not branches:
        raise ConfigError(f"--kopt-run: {it}/branches/b*/ hold no kernel.cu or kernel.py",
                          fix="write the branch kernels first (SKILL.md step 3d)")
    methods_path = it / "methods.json"
    try:
        methods = json.loads(methods_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{methods_path}: {exc}", fix='write the selected methods as {"methods": [{"id": '
                          '"memory.shared_memory_tiling", "rationale": "..."}]}') from None
    roof = json.loads((it / "roofline.json").read_text())
    arch = (state.get("env") or {}).get("sm_arch") or "sm_90a"
    problems = loop.validate_methods(methods, loop.load_registry("method_registry"), roof["axis_budget"], state, arch)
    if problems:
        raise ConfigError(f"{methods_path} is not valid:\n  - " + "\n  - ".join(problems),
                          fix="follow the axis budget in roofline.json and registries/method_registry.json")
    kernels = [*branches, *ablations.values()]
    return {"baseline": str(kernels[0]), "candidate": [str(k) for k in kernels[1:]], "ref": state["ref_file"],
            "dims": json.dumps(state["dims"]), "seeds": ",".join(map(str, state["validation_seeds"])),
            "_run_dir": str(run_dir)}


def finish_init(run_dir: Path, ctx: gates.Context, records: list[dict[str, Any]], rootpath: Path) -> dict[str, Any]:
    """After the baseline session: stop the run with the first failing (or skipped) strict gate's reason, or record
    the baseline (``best_metric_ms``, ``baseline_ms``) and open iteration 1. Returns ``{"exit_code", "message"}``."""
    recs = _kernel_records(records, rootpath, ctx.kernel)
    block = _blocker(recs, STRICT_GATES)
    if block is not None:
        stage, code = _stage(block)
        loop.stop_run(run_dir, f"{block['gate']} {block['outcome']}: {block.get('message')}", stage, code)
        return {"exit_code": code, "message": f"run stopped at {stage}: {block.get('message')}"}
    bench = json.loads((ctx.outdir / "bench.json").read_text())
    roof = json.loads((ctx.outdir / "roofline.json").read_text())
    top = json.loads((ctx.outdir / "ncu_top.json").read_text())
    state = loop.load_state(run_dir)
    loop.save_state(run_dir, {"baseline_ms": bench["median_ms"], "best_metric_ms": bench["median_ms"],
                              "best_gpu_uuid": bench.get("gpu_uuid"),
                              "best_ncu_rep": str(ctx.outdir / "kernel.ncu-rep"), "ncu_set": top.get("set")})
    it = loop.open_iteration(run_dir, 1, profile_dir=ctx.outdir, roofline=roof, branches=int(state["branches"]),
                             ncu_top=top)
    b = roof["axis_budget"]
    return {"exit_code": 0, "message": f"run {run_dir} seeded: baseline {bench['median_ms']:.4f} ms; {it.name} open, "
                                       f"budget c/m/l {b['compute']}/{b['memory']}/{b['latency']}; write "
                                       f"{it.name}/methods.json, branches/b*/kernel.*, ablations/<method>/kernel.*"}


def _bench(ctx: gates.Context) -> dict[str, Any]:
    """A kernel's ``bench.json`` of this session, {} when it has none or it is unreadable."""
    try:
        return json.loads((ctx.outdir / "bench.json").read_text())
    except (OSError, ValueError):
        return {}


def _same_gpu_decision(run_dir: Path, it: Path, state: dict[str, Any], results: list[dict[str, Any]],
                       ab_kernels: dict[str, Path], ctx_for: Callable[[Path], gates.Context]) -> dict[str, Any] | None:
    """When the iteration's kernels were timed on more than one GPU, make each decision from times of one GPU
    wherever a difference between GPUs could change it, by re-timing those kernels in alternating rounds on this
    process's GPU (:func:`pytest_kopt.gates.retime_interleaved`):

    - the champion: the finalists (:func:`pytest_kopt.loop.finalists`) when two or more of them were timed on
      different GPUs; otherwise the fastest finalist wins on its gate time (its rivals shared its GPU, or were more
      than ``FINALIST_MARGIN_PCT`` slower);
    - an ablation's attribution and the improvement over the best kernel so far: re-timed (with the champion) when
      the ratio it is judged on lies within a factor (1 + ``FINALIST_MARGIN_PCT``/100) of its threshold for some
      champion candidate (attribution: ablation/champion against 1 + noise; improvement: best/champion against
      1/(1 - noise), SKILL.md 3h and 3j); farther away no difference between GPUs of that size can flip it.

    Rewrites the re-timed finalists' ``median_ms`` in ``results`` (the gate's stays as ``gate_median_ms``) and
    marks each result's ``finalist``; only finalists can become champion. Returns the decision record (also
    ``iterv{i}/decision.json``; ``retimed_ms`` holds the re-timed medians, ``robust`` why the others were not
    re-timed), or None when one GPU (or none) measured everything. Raises the harness's KoptError when a
    re-timing fails."""
    measured = {r["gpu_uuid"] for r in results if r["passed"]} | {_bench(ctx_for(k)).get("gpu_uuid")
                                                                  for k in ab_kernels.values()}
    best_gpu = state.get("best_gpu_uuid")  # the GPU that timed best_metric_ms (None in runs made before it was kept)
    measured |= {best_gpu}
    measured.discard(None)
    finals = loop.finalists(results)
    if len(measured) < 2 or not finals:
        return None
    contest = len(finals) > 1 and len({r["gpu_uuid"] for r in finals}) > 1
    if not contest:
        finals = finals[:1]
    cands = [float(r["median_ms"]) for r in finals]
    noise = float(state.get("noise_threshold_pct", loop.DEFAULT_NOISE_PCT)) / 100.0
    slack = 1.0 + loop.FINALIST_MARGIN_PCT / 100.0
    robust: dict[str, str] = {}
    if not contest:
        robust[f"branches/{finals[0]['branch']}"] = (
            "the only finalist" if len(loop.finalists(results)) == 1 else "its rivals were timed on its GPU")

    def needed(name: str, value: float, threshold: float, what: str, gpus: set[Any]) -> bool:
        if gpus <= {finals[0]["gpu_uuid"]} and not contest:
            robust[name] = f"timed on the champion's GPU ({finals[0]['gpu_uuid']})"
            return False
        ratios = [value / c if c > 0 else math.nan for c in cands]
        if all(r < threshold / slack or r > threshold * slack for r in ratios):  # a NaN ratio is never robust
            robust[name] = (f"{what} {', '.join(f'{r:.3f}' for r in ratios)} is outside {threshold:.3f} "
                            f"/ x {slack:.2f}")
            return False
        return True

    names: list[str] = [f"branches/{r['branch']}" for r in finals]
    kernels: list[Path] = [Path(r["kernel"]) for r in finals]
    for m, k in ab_kernels.items():
        b = _bench(ctx_for(k))
        if needed(f"ablations/{m}", float(b["median_ms"]), 1.0 + noise, "ablation/champion", {b.get("gpu_uuid")}):
            names.append(f"ablations/{m}")
            kernels.append(k)
    best_file = Path(str(state.get("best_file") or ""))
    best_note = None
    best_ms = state.get("best_metric_ms")
    if best_ms is not None and needed("best", float(best_ms), 1.0 / (1.0 - noise), "best/champion", {best_gpu}):
        if not best_file.is_file():
            best_note = f"the best kernel so far ({best_file}) is gone; stored best_metric_ms used"
        else:
            try:
                gates.ensure_built(ctx_for(best_file))
                names.append("best")
                kernels.append(best_file)
            except KoptError as exc:  # the improvement test then uses the stored best_metric_ms
                best_note = f"the best kernel so far did not build here ({exc.message}); stored best_metric_ms used"
    retimed: dict[str, float] = {}
    timed: list[dict[str, Any]] = []
    if contest or len(kernels) > 1:
        timed = gates.retime_interleaved([ctx_for(k) for k in kernels])
        retimed = {n: t["median_ms"] for n, t in zip(names, timed)}
    gpu = (ctx_for(kernels[0]).env.get("gpu") or {})
    keep = {r["branch"] for r in finals}
    for r in results:
        r["gate_median_ms"] = r["median_ms"]
        r["gate_gpu_uuid"] = r["gpu_uuid"]
        r["finalist"] = r["branch"] in keep
        if f"branches/{r['branch']}" in retimed:
            r["median_ms"] = retimed[f"branches/{r['branch']}"]
            r["gpu_uuid"] = gpu.get("uuid")
    decision = {"method": "interleaved re-timing on one GPU (pytest_kopt.gates.retime_interleaved)",
                "gpu_uuid": gpu.get("uuid"), "gpu_index": gpu.get("index"), "measured_on": sorted(measured),
                "finalist_margin_pct": loop.FINALIST_MARGIN_PCT, "max_finalists": loop.MAX_FINALISTS,
                "champion_contest": contest, "retimed_ms": retimed, "robust": robust,
                "kernels": dict(zip(names, map(str, kernels))) if retimed else {},
                "stop_reasons": {n: t["stop_reason"] for n, t in zip(names, timed)},
                "reported_gpu": {n: t["gpu_uuid"] for n, t in zip(names, timed)}, "best_note": best_note}
    loop.write_json(it / "decision.json", decision)
    return decision


def decided(results: list[dict[str, Any]], ab_gate_ms: dict[str, float | None],
            decision: dict[str, Any] | None) -> tuple[dict[str, Any] | None, dict[str, float | None], float | None]:
    """What the close decides on: (champion among the finalists, each ablation's ms, the best so far's ms as
    re-timed or None). ``results``: the branches with ``median_ms`` (ms) and, after a same-GPU decision, their
    ``finalist`` flags; ``ab_gate_ms``: each claimed method's ablation median from its timing gate (None: missing
    or failed); ``decision``: :func:`_same_gpu_decision`'s record or None. Re-timed ablations take their re-timed
    median."""
    champion = loop.select_champion([r for r in results if r.get("finalist", True)])
    retimed = (decision or {}).get("retimed_ms", {})
    ab_ms = {m: (retimed.get(f"ablations/{m}", ms) if ms is not None else None) for m, ms in ab_gate_ms.items()}
    return champion, ab_ms, retimed.get("best")


def finish_run(run_dir: Path, ctx_for: Callable[[Path], gates.Context], records: list[dict[str, Any]],
               rootpath: Path, finalize: bool) -> dict[str, Any]:
    """Close the open iteration from this session's results. Returns ``{"exit_code", "message"}``."""
    state = loop.load_state(run_dir)
    i = int(state["open_iter"])
    it = run_dir / f"iterv{i}"
    branches, ablations = loop.iteration_kernels(run_dir, i)
    methods_doc = json.loads((it / "methods.json").read_text())
    methods = [m["id"] for m in methods_doc["methods"]]
    results = []
    for index, kernel in enumerate(branches, start=1):
        ctx = ctx_for(kernel)
        recs = _kernel_records(records, rootpath, kernel)
        block = _blocker(recs, ("compile", "correctness", "timing"))
        bench = _bench(ctx) if block is None else {}
        median = bench.get("median_ms")
        results.append({"branch": kernel.parent.name, "index": index, "kernel": str(kernel), "median_ms": median,
                        "passed": block is None and median is not None,
                        "failed_gate": block["gate"] if block else None,
                        "status": block["status"] if block else "PASSED", "gpu_uuid": bench.get("gpu_uuid")})
    ab_kernels = {m: k for m, k in ablations.items() if m in methods
                  and _blocker(_kernel_records(records, rootpath, k), ("compile", "correctness", "timing")) is None
                  and _bench(ctx_for(k)).get("median_ms") is not None}
    try:
        decision = _same_gpu_decision(run_dir, it, state, results, ab_kernels, ctx_for)
    except KoptError as exc:
        loop.stop_run(run_dir, f"re-timing the finalists on one GPU failed: {exc.message}", "timing", exc.exit_code)
        return {"exit_code": exc.exit_code, "message": f"{it.name}: the finalists could not be re-timed on one GPU: "
                                                      f"{exc.message}"}
    ab_gate_ms = {m: _bench(ctx_for(ab_kernels[m])).get("median_ms") if m in ab_kernels else None for m in methods}
    champion, ab_ms, best_ms_now = decided(results, ab_gate_ms, decision)
    if champion is None:
        loop.write_json(it / "branch_results.json", {"iter": i, "branches": results, "champion": None})
        loop.stop_run(run_dir, "all branches failed a strict gate", "branch_explore", 2, results)
        return {"exit_code": 2, "message": f"{it.name}: every branch failed a strict gate; run stopped"}
    cctx = ctx_for(Path(champion["kernel"]))
    try:
        gates.gate_ncu(cctx)
        gates.gate_roofline(cctx)
    except (KoptError, Blocked) as exc:
        text = exc.message if isinstance(exc, KoptError) else str(exc)
        loop.stop_run(run_dir, f"champion profile failed: {text}", "ncu", 3)
        return {"exit_code": 3, "message": f"{it.name}: champion {champion['branch']} could not be profiled: {text}"}
    shutil.copy2(cctx.outdir / "kernel.ncu-rep", it / "kernel.ncu-rep")
    top = json.loads((cctx.outdir / "ncu_top.json").read_text())
    roof = json.loads((cctx.outdir / "roofline.json").read_text())
    loop.write_json(it / "kernel_ncu_top.json", top)  # never over the best-input profile's ncu_top.json
    loop.write_json(it / "kernel_roofline.json", roof)
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
    attr = loop.attribution(champion["median_ms"], ab_ms, float(state["noise_threshold_pct"]), why)
    texts = [p.read_text() for p in sorted((cctx.outdir / "sass").glob("*.sass"))]
    sass = loop.sass_verify(methods, texts, loop.load_registry("sass_signatures"))
    bench = json.loads((cctx.outdir / "bench.json").read_text())
    state = loop.close_iteration(run_dir, i, results=results, champion=champion, methods=methods, attr=attr,
                                 sass=sass, champion_roofline=roof, champion_bench=bench,
                                 best_ms_now=best_ms_now, decision=decision)
    done = finalize or i >= int(state["iterations_total"]) or bool(roof.get("near_peak"))
    if done:
        reason = "finalized" if finalize else ("near_peak" if roof.get("near_peak") else "iterations done")
        state = loop.save_state(run_dir, {"run_status": "completed", "open_iter": None, "completion": reason})
        msg = f"{it.name} closed: champion {champion['branch']} {champion['median_ms']:.4f} ms; run completed ({reason})"
    else:
        nxt = loop.open_iteration(run_dir, i + 1, profile_dir=cctx.outdir, roofline=roof,
                                  branches=int(state["branches"]), ncu_top=top)
        state = loop.load_state(run_dir)
        msg = f"{it.name} closed: champion {champion['branch']} {champion['median_ms']:.4f} ms; {nxt.name} open"
    loop.plot_history(state, run_dir)
    (run_dir / "summary.md").write_text(loop.render_summary(state, run_dir))
    return {"exit_code": 0, "message": msg}
