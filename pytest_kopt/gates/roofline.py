"""The ``roofline`` gate: gaps and the method budget (SKILL.md steps 3a-3b) from parsed ncu metrics and the
workload model, the roofline against the GPU's measured peaks, and its chart.

Plain Python over plain dicts: :func:`metric_table` maps a parsed launch onto the logical metrics of
``registries/metric_registry.json``; :func:`gaps` computes Δc, Δm, Δl; :func:`axis_budget` splits the method budget;
:func:`roofline` assembles ``roofline.json``; :func:`gate_roofline` runs them on a kernel's artifacts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from .. import registry
from ..artifacts import Achieved, Floor, NcuTop, Roofline, read_dict
from ..errors import Blocked
from ..settings import dims_label
from .context import Context, Outcome
from .ncu_csv import NcuLaunch, metric_value
from .measure import device_peaks
from .timing import profiled_shape

AXES = ("compute", "memory", "latency")
#: SKILL.md: a gap under 0.10 is noise and earns no method slot; near_peak needs every gap under 0.15.
GAP_FLOOR = 0.10
NEAR_PEAK = 0.15
BUDGET_TOTAL = 3
BUDGET_CAP = 2
#: Tie order when two axes have equal remainders. Upstream's own cases give memory the slot over compute
#: ((.5,.5,0) -> 1/2/0) and over compute again at (.2,.2,.9) -> 0/1/2; latency last.
TIE_ORDER = ("memory", "compute", "latency")
def metric_table(launch: NcuLaunch, registry: Mapping[str, Any]) -> dict[str, float | None]:
    """Logical metric name -> value in the registry's unit (first alias present wins; missing -> None)."""
    return {name: metric_value(launch, *spec["aliases"]) for name, spec in registry["metrics"].items()}


def stall_shares(table: Mapping[str, float | None], registry: Mapping[str, Any]) -> dict[str, float]:
    """Each stall reason's share of all stall cycles, in % (``selected`` is issuing, not a stall, and is left
    out). Empty when no stall metric was collected."""
    stalls = {n: v for n, v in table.items()
              if registry["metrics"][n].get("stall") and v is not None and n != "stall_selected"}
    total = sum(stalls.values())
    if not stalls or total <= 0:
        return {}
    return {n.removeprefix("stall_"): 100.0 * v / total for n, v in stalls.items()}


def gaps(table: Mapping[str, float | None], registry: Mapping[str, Any]) -> dict[str, float | None]:
    """Δc = 1 - max(tensor pipe %, fp32 pipe %, SM throughput %)/100; Δm = 1 - DRAM throughput %/100;
    Δl = (largest stall reason's share of stall cycles, %)/100. A gap whose metrics are all missing is None (never
    0 or 1); values are clamped to [0, 1]."""
    compute = [table.get(n) for n in ("tensor_hmma_pipe_pct", "tensor_gmma_pipe_pct", "tensor_imma_pipe_pct",
                                      "tensor_dmma_pipe_pct", "fp32_pipe_pct", "sm_throughput_pct")]
    known = [v for v in compute if v is not None]
    dram = table.get("dram_throughput_pct")
    shares = stall_shares(table, registry)

    def clamp(x: float) -> float:
        return min(1.0, max(0.0, x))

    return {"compute": clamp(1 - max(known) / 100) if known else None,
            "memory": clamp(1 - dram / 100) if dram is not None else None,
            "latency": clamp(max(shares.values()) / 100) if shares else None}


def axis_budget(delta: Mapping[str, float | None], total: int = BUDGET_TOTAL, cap: int = BUDGET_CAP) -> dict[str, int]:
    """Split ``total`` method slots over the axes in proportion to their gaps (SKILL.md 3b).

    Rules, in order: a gap that is None or under 0.10 counts as 0; if every gap counts 0, each *known* axis gets 1
    (upstream: (.05,.05,.05) -> 1/1/1; all None -> 0/0/0); otherwise largest-remainder rounding of
    total*gap/sum(gaps) with at most ``cap`` per axis, ties broken memory > compute > latency; slots an axis cannot
    take (cap) go to the other axes *with evidence* by the same rule, and stay unfilled when none is left.
    Upstream's code gives such a slot to an axis without evidence ((.9,.05,.05) -> 2/1/0, (.9,None,None) -> 2/1/0,
    (None,.6,None) -> 1/2/0); we return 2/0/0, 2/0/0 and 0/2/0, following SKILL.md's own rule "never add an
    untriggered filler; leave the budget under-filled". The walkthrough in SKILL.md shows 2/0/1 for (.92,.57,.61);
    the proportional rule (and upstream's code) gives 1/1/1, which we follow.
    """
    eff = {a: (d if d is not None and d >= GAP_FLOOR else 0.0) for a, d in ((a, delta.get(a)) for a in AXES)}
    if all(v == 0 for v in eff.values()):
        return {a: (1 if delta.get(a) is not None else 0) for a in AXES}
    weight = sum(eff.values())
    share = {a: total * eff[a] / weight for a in AXES}
    budget = {a: min(cap, math.floor(share[a] + 1e-12)) for a in AXES}
    left = total - sum(budget.values())
    order = sorted((a for a in AXES if eff[a] > 0),
                   key=lambda a: (-round(share[a] - math.floor(share[a] + 1e-12), 12), TIE_ORDER.index(a)))
    while left > 0 and any(budget[a] < cap for a in order):
        for a in order:
            if left and budget[a] < cap:
                budget[a] += 1
                left -= 1
    return budget


def bound_of(delta: Mapping[str, float | None]) -> str | None:
    """Upstream's ``bound``: the axis with the largest known gap (most headroom), ties by TIE_ORDER; None if none."""
    known = [(d, -TIE_ORDER.index(a), a) for a, d in delta.items() if d is not None]
    return max(known)[2] if known else None


def roofline(table: Mapping[str, float | None], registry: Mapping[str, Any], duration_ms: float | None,
             workload: Mapping[str, float] | None, peaks: Mapping[str, Any] | None) -> dict[str, Any]:
    """``roofline.json``'s analysis (:meth:`pytest_kopt.artifacts.Roofline.analysis`): the three gaps, bound,
    near_peak and axis budget; with a workload model also achieved FLOP/s and bytes/s, arithmetic intensity
    (FLOP/byte), the roofline time floor from the measured peaks and the % of speed of light (floor / duration)
    against the fp32 peak (``sol_pct_fp32``) and against the best measured peak, bf16 tensor cores
    (``sol_pct_best``). Without one it is labelled a bottleneck-gap heuristic (SKILL.md)."""
    delta = gaps(table, registry)
    has_model = bool(workload) and workload.get("bytes_min") is not None
    near = has_model and all(delta[a] is not None and delta[a] < NEAR_PEAK for a in AXES)  # type: ignore[operator]
    achieved, floor = None, None
    if has_model and workload and duration_ms:
        flops = float(workload.get("flops") or 0.0)
        bytes_min = float(workload["bytes_min"])
        secs = duration_ms * 1e-3
        achieved = Achieved(flops_per_s=flops / secs, bytes_per_s=bytes_min / secs,
                            arithmetic_intensity=flops / bytes_min if bytes_min else None)
        if peaks:
            bw = peaks.get("dram_bytes_per_s")
            peak = max(peaks.get("bf16_flops") or 0.0, peaks.get("fp32_flops") or 0.0) if flops else 0.0
            peak_fp32 = peaks.get("fp32_flops")
            t_mem = bytes_min / bw if bw else 0.0
            t_fp32 = flops / peak_fp32 if peak_fp32 and flops else 0.0
            floor_fp32 = max(t_mem, t_fp32) * 1e3
            floor_best = max(t_mem, flops / peak if peak else 0.0) * 1e3
            # sol_pct_best is against the best measured peak (bf16 tensor cores): the meaningful one for
            # fp16/bf16/tf32 work, which can run past the fp32 roofline
            floor = Floor(peaks=dict(peaks), floor_ms_fp32=floor_fp32, floor_ms_best=floor_best,
                          sol_pct_fp32=100.0 * floor_fp32 / duration_ms, sol_pct_best=100.0 * floor_best / duration_ms,
                          roofline_bound="memory" if t_mem >= t_fp32 else "compute")
    return Roofline.analysis(delta=delta, bound=bound_of(delta), near_peak=near, axis_budget=axis_budget(delta),
                             method="roofline" if has_model else "bottleneck-gap heuristic",
                             stall_shares_pct=stall_shares(table, registry), duration_ms=duration_ms,
                             achieved=achieved, floor=floor)


def top_metrics(table: Mapping[str, float | None], registry: Mapping[str, Any], n: int = 5) -> dict[str, list]:
    """SKILL.md 3a's ``ncu_top``: per axis, the ``n`` metrics with the largest values (stall reasons by their share
    of stall cycles), each ``{"name", "value", "unit"}``. Missing metrics are left out, never shown as 0."""
    shares = stall_shares(table, registry)
    out: dict[str, list] = {a: [] for a in AXES}
    for name, spec in registry["metrics"].items():
        axis = spec.get("axis")
        if axis not in out or spec["unit"] != "%" and not spec.get("stall"):
            continue
        if spec.get("stall"):
            reason = name.removeprefix("stall_")
            if reason in shares:
                out[axis].append({"name": name, "value": shares[reason], "unit": "% of stalls"})
        elif table.get(name) is not None:
            out[axis].append({"name": name, "value": table[name], "unit": "%"})
    return {a: sorted(v, key=lambda m: -m["value"])[:n] for a, v in out.items()}


def import_plotting() -> None:
    """Import matplotlib (Agg) and its pyplot, ignoring its absence: :func:`plot` and the loop's summary charts then
    find them imported. Run in a thread from a kernel's first item, beside the gates before the roofline's
    (:meth:`pytest_kopt.scheduler.Scheduler.import_plotting_ahead`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except Exception:  # matplotlib missing or broken: plot() says so, not this
        pass


def plot(doc: Mapping[str, Any], history: list[Mapping[str, Any]], path: Path, title: str = "") -> str | None:
    """Draw the roofline chart to ``path`` (PNG): the DRAM roof (its slope, labelled with the measured bandwidth),
    the fp32 and bf16 compute roofs from the measured peaks (each labelled at its ridge), this kernel's point
    (arithmetic intensity, achieved FLOP/s) and earlier points from ``history``, and a legend of the three gaps
    (Δc = 1 − compute utilisation, Δm = 1 − DRAM throughput, Δl = the largest stall reason's share). Returns the
    path, or None when matplotlib, the workload model or the peaks are missing."""
    if "arithmetic_intensity" not in doc or not doc.get("peaks") or not doc.get("arithmetic_intensity"):
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    peaks = doc["peaks"]
    bw = peaks["dram_bytes_per_s"]
    # the ridges among the x values, so each roof bends where it does
    xs = sorted({2.0 ** e for e in range(-4, 13)} | {p / bw for p in (peaks.get("fp32_flops"), peaks.get("bf16_flops"))
                                                      if p and 2.0 ** -4 < p / bw < 2.0 ** 12})
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    ax.plot(xs, [bw * x / 1e12 for x in xs], ":", color="C2", label=f"DRAM roof (measured): {bw / 1e12:.2f} TB/s")
    for label, peak, style, color in (("fp32 roof (measured)", peaks.get("fp32_flops"), "-", "C0"),
                                      ("bf16 tensor roof (measured)", peaks.get("bf16_flops"), "--", "C1")):
        if peak:
            ax.plot(xs, [min(peak, bw * x) / 1e12 for x in xs], style, color=color,
                    label=f"{label}: {peak / 1e12:.0f} TFLOP/s")
            ridge = peak / bw
            ax.annotate(f"{label.split(' roof')[0]} ridge {ridge:.1f} FLOP/B", (ridge, peak / 1e12),
                        textcoords="offset points", xytext=(4, -12), fontsize=7, color=color)
    x0 = xs[1]
    ax.annotate(f"DRAM {bw / 1e12:.2f} TB/s", (x0, bw * x0 / 1e12), textcoords="offset points", xytext=(2, 6),
                fontsize=7, color="C2", rotation=28)
    points = [*history, doc]
    for i, p in enumerate(points):
        if p.get("arithmetic_intensity") and p.get("achieved_flops"):
            last = i == len(points) - 1
            ax.plot(p["arithmetic_intensity"], p["achieved_flops"] / 1e12, "o" if last else "x",
                    color="C3" if last else "C7", label="this kernel" if last else ("earlier profiles" if i == 0
                                                                                     else None))
            ax.annotate(p.get("label", f"#{i}"), (p["arithmetic_intensity"], p["achieved_flops"] / 1e12),
                        textcoords="offset points", xytext=(4, 4), fontsize=8)
    gaps = [f"{sym}={doc[key]:.2f} ({what})" for sym, key, what in (
        ("Δc", "delta_compute", "1 − compute utilisation"), ("Δm", "delta_memory", "1 − DRAM throughput"),
        ("Δl", "delta_latency", "largest stall share")) if doc.get(key) is not None]
    if gaps:
        ax.text(0.99, 0.02, "gaps (0 = at the ceiling):\n" + "\n".join(gaps), transform=ax.transAxes, ha="right",
                va="bottom", fontsize=7, bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte, workload model)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(title or "roofline")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def plotting_missing() -> str | None:
    """Why no chart can be drawn here (matplotlib missing or broken), or None when it can."""
    try:
        import matplotlib  # noqa: F401
    except Exception as exc:  # a broken install raises more than ImportError
        return f"matplotlib cannot be imported ({type(exc).__name__}): pip install matplotlib"
    return None


def gate_roofline(ctx: Context, case: Any = None) -> Outcome:
    """SKILL.md 3b from this session's ``ncu_top.json`` (+ ``bench.json``'s workload model and the measured
    peaks): the three gaps, bound, near_peak, axis budget, achieved FLOP/s and bytes/s, arithmetic intensity;
    writes ``roofline.json`` and ``roofline.png``."""
    top = NcuTop.load(ctx.outdir)
    if top is None:
        ctx.device_for("roofline")  # without a GPU, say so (as the other GPU gates do)
        raise Blocked("ncu", "no ncu_top.json with registry metrics from this session's ncu gate")
    dims, bench = profiled_shape(ctx)
    metrics = registry.load(registry.METRICS)
    analysis = roofline(top.metrics, metrics, top.duration_ms, bench.workload if bench else None, device_peaks(ctx))
    record = Roofline.build(analysis, kernel=top.kernel, dims=dims or ctx.settings.dims)
    path = record.write(ctx.outdir)
    doc = record.doc
    history: list[dict[str, Any]] = []
    state = read_dict(ctx.settings.run_dir / "state.json") if ctx.settings.run_dir is not None else None
    if state:  # the loop's earlier iterations (profiles of the best going into each) as points on the chart
        history = [{**r, "label": f"in{r['iter']}"} for r in state.get("roofline_history", [])]
    ctx.ahead.wait_plotting()  # matplotlib's import started ahead: never two threads importing it
    png = plot({**doc, "label": ctx.kernel.stem}, history, ctx.outdir / "roofline.png",
               title=f"{ctx.kernel.name}: roofline at {dims_label(dims or ctx.settings.dims)}")
    no_chart = f"; no roofline.png: {plotting_missing()}" if png is None and plotting_missing() else ""
    figures = {k: doc[k] for k in ("delta_compute", "delta_memory", "delta_latency", "bound", "near_peak")
               if doc.get(k) is not None}
    figures.update({f"budget_{a}": n for a, n in doc["axis_budget"].items()})
    for k in ("arithmetic_intensity", "sol_pct_fp32", "sol_pct_best", "roofline_bound"):
        if doc.get(k) is not None:
            figures[k] = doc[k]

    def g(v: Any) -> str:
        return "null" if v is None else f"{v:.2f}"

    b = doc["axis_budget"]
    sol = f", {doc['sol_pct_fp32']:.1f}% of the fp32 roofline" if doc.get("sol_pct_fp32") is not None else ""
    if doc.get("sol_pct_fp32") is not None and doc["sol_pct_fp32"] > 100 and doc.get("sol_pct_best") is not None:
        sol += f" (above it: tensor-core work), {doc['sol_pct_best']:.1f}% of the bf16 tensor roofline"
    return Outcome(figures, f"Δc={g(doc['delta_compute'])} Δm={g(doc['delta_memory'])} Δl={g(doc['delta_latency'])}"
                            f", bound {doc['bound']}, budget {b['compute']}/{b['memory']}/{b['latency']}"
                            f" ({doc['method']}){sol}{no_chart}", tuple(str(p) for p in (path, png) if p))
