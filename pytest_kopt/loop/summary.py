"""``summary.md`` and the run's plots (``speedup.png``, ``roofline_drift.png``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from .layout import RunLayout


def render_summary(state: Mapping[str, Any], run_dir: Path) -> str:
    """``summary.md``: headline speedup, roofline history, iteration timeline, method buckets, frontier, stop
    reason; embeds the PNG plots written by :func:`plot_history` when present."""
    lines = [f"# pytest-kopt run `{run_dir.name}`", ""]
    base = state.get("baseline_ms")
    best = state.get("best_metric_ms")
    status = state.get("run_status")
    if base and best:
        best_file = str(state.get("best_file") or "")
        if best_file.startswith(str(run_dir)):
            best_file = str(Path(best_file).relative_to(run_dir))
        lines.append(f"**Headline:** {base:.4f} ms → {best:.4f} ms, **{base / best:.2f}x** over the baseline "
                     f"(best kernel `{best_file}`), {state.get('verified_iterations', 0)} verified iteration(s); "
                     f"run {status}.")
    else:
        lines.append(f"**Run {status}.** Baseline {'%.4f ms' % base if base else 'not timed'}.")
    if state.get("completion") == "finished":
        lines += ["", f"**Finished by the agent:** {state.get('stop_reason')}"]
    elif state.get("stop_reason"):
        lines += ["", f"**Stopped** at `{state.get('stop_stage')}`: {state['stop_reason']}"]
    lines += ["", f"Dims: `{json.dumps(state.get('dims'))}`; seeds {state.get('validation_seeds')}; noise threshold "
                  f"{state.get('noise_threshold_pct')}%.", "", "## Roofline history", ""]

    def g(v: Any) -> str:
        return "null" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))

    # a section with nothing yet (a run stopped at its set-up) says so in a sentence, not with an empty table
    if state.get("roofline_history"):
        lines += ["| iter | profile of | Δc | Δm | Δl | bound | budget c/m/l | % fp32 roofline |",
                  "|---|---|---|---|---|---|---|---|"]
    else:
        lines.append("No iteration has been opened, so none has a roofline here (the baseline's, when it was "
                     "profiled, is `baseline/roofline.json`).")
    for r in state.get("roofline_history", []):
        b = r.get("axis_budget") or {}
        what = ("the champion" if r.get("profile") == "champion" else "the best going in") + \
            (f" `{r['kernel']}`" if r.get("kernel") else "")
        lines.append(f"| {r['iter']} | {what} | {g(r.get('delta_compute'))} | {g(r.get('delta_memory'))} | "
                     f"{g(r.get('delta_latency'))} | {r.get('bound')} | {b.get('compute')}/{b.get('memory')}/"
                     f"{b.get('latency')} | {g(r.get('sol_pct_fp32'))} |")
    lines += ["", "## Iterations", ""]
    if state.get("history"):
        lines += ["| iter | champion | ms | against best ms | improved | verified | methods (verdict, attribution %) | "
                  "residual: not explained by any method |", "|---|---|---|---|---|---|---|---|"]
    else:
        lines.append("No iteration has closed yet.")
    for h in state.get("history", []):
        ms = ", ".join(f"{m} ({h['verdicts'].get(m)}, {g((h['attribution'].get(m) or {}).get('attribution_pct'))})"
                       for m in h["methods"])
        if h.get("same_sass_as_best"):
            ms += "; the champion's SASS is the best kernel's: no instruction changed"
        lines.append(f"| {h['iter']} | {h['champion']} | {h['champion_ms']:.4f} | {g(h.get('previous_best_ms'))} | "
                     f"{h['improved']} | {h.get('verified', '—')} | {ms} | {residual_text(h.get('residual'))} |")
    lines += ["", "## Methods", ""]
    buckets = ("effective", "ineffective", "implementation_failed", "unverified")
    if any(state.get(f"{b}_methods") for b in buckets):
        for b in buckets:
            lines.append(f"- {b}: {', '.join(state.get(f'{b}_methods', [])) or '—'}")
    else:
        lines.append("No method has been judged yet.")
    lines += ["", "## Frontier (non-champion branches that passed)", ""]
    for f in state.get("frontier", []):
        lines.append(f"- iter {f['iter']} {f['branch']}: {f['median_ms']:.4f} ms")
    if not state.get("frontier"):
        lines.append("No other branch has passed yet.")
    layout = RunLayout.of(run_dir)
    for png in (layout.speedup_png, layout.roofline_drift_png):
        if png.is_file():
            lines += ["", f"![{png.name}]({png.name})"]
    return "\n".join(lines) + "\n"


def residual_text(res: Mapping[str, Any] | None) -> str:
    """The residual of an iteration in a few words: ms of the gain and its share (—: none computed)."""
    if not res:
        return "—"
    share = res.get("residual_pct_of_gain")
    text = f"{res['residual_ms']:.4f} ms of a {res['gain_ms']:.4f} ms gain"
    return text + (f" ({share:.1f}%)" if share is not None else "")


def plot_history(state: Mapping[str, Any], run_dir: Path) -> list[str]:
    """``speedup.png`` (champion ms and speedup over the baseline per iteration) and ``roofline_drift.png`` (the
    three gaps per iteration). Returns the files written ([] without matplotlib or history)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
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
        ax.set_ylabel("champion's speedup over baseline (x)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(RunLayout.of(run_dir).speedup_png, dpi=100)
        plt.close(fig)
        out.append(str(RunLayout.of(run_dir).speedup_png))
    rh = state.get("roofline_history", [])
    if rh:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        # the best going into iteration i is the state after i - 1 closes; a champion's, after its own close
        xs = [r["iter"] if r.get("profile") == "champion" else r["iter"] - 1 for r in rh]
        for key, label in (("delta_compute", "Δc"), ("delta_memory", "Δm"), ("delta_latency", "Δl")):
            ax.plot(xs, [r.get(key) for r in rh], "o-", label=label)
        ax.set_xlabel("after iteration (0: the baseline)")
        ax.set_ylabel("gap")
        ax.set_ylim(0, 1)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(RunLayout.of(run_dir).roofline_drift_png, dpi=100)
        plt.close(fig)
        out.append(str(RunLayout.of(run_dir).roofline_drift_png))
    return out
