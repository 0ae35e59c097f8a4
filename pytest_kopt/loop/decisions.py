"""The loop's decisions as plain functions: champion, finalists, ablation attribution, method buckets, improvement
(SKILL.md 3e-3j), and the same-GPU re-timing of what a difference between GPUs could flip."""

from __future__ import annotations

import math
from typing import Any, Mapping


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


def classify(contributed: bool | None, sass_status: str) -> str:
    """SKILL.md 3j buckets: effective only when attribution > noise AND SASS verified; implementation_failed on a
    SASS fail (the claimed instructions are not there) unless the ablation shows the method made the kernel faster
    (SKILL.md: "signature missing but kernel is faster: nvcc took a different path, mark it unverified"); ineffective
    when attribution is conclusive and <= noise and verification is conclusive; unverified otherwise (ablation or
    verification inconclusive)."""
    if sass_status == "fail":
        return "unverified" if contributed else "implementation_failed"
    if contributed is None or sass_status in ("not_applicable", "tool_error", "inconclusive"):
        return "unverified"
    return "effective" if contributed else "ineffective"


def improved(new_ms: float, best_ms: float | None, noise_pct: float) -> bool:
    """SKILL.md: a new best only when faster than best x (1 - noise%)."""
    return best_ms is None or new_ms < best_ms * (1 - noise_pct / 100.0)


def retime_plan(results: list[dict[str, Any]], ablations: Mapping[str, tuple[float, str | None]],
                best_ms: float | None, best_gpu: str | None, noise_pct: float) -> dict[str, Any] | None:
    """Which comparisons of a close a difference between GPUs could flip, when the iteration was timed on more
    than one GPU (SKILL.md's decisions are then made on one):

    - the champion: the finalists (:func:`finalists`) when two or more were timed on different GPUs; otherwise the
      fastest finalist wins on its gate time (its rivals shared its GPU, or were more than
      ``FINALIST_MARGIN_PCT`` slower);
    - an ablation's attribution and the improvement over the best so far: re-timed (with the champion) when the
      ratio it is judged on lies within a factor (1 + ``FINALIST_MARGIN_PCT``/100) of its threshold for some
      champion candidate (attribution: ablation/champion against 1 + noise; improvement: best/champion against
      1/(1 - noise), SKILL.md 3h and 3j); farther away no difference between GPUs of that size can flip it.

    ``results``: the branches (``branch``, ``index``, ``kernel``, ``passed``, ``median_ms``, ``gpu_uuid``);
    ``ablations``: method -> (gate median ms, GPU UUID); ``best_ms``/``best_gpu``: the best so far and the GPU
    that timed it. Returns None when one GPU (or none) measured everything, else ``{"contest", "finalists",
    "retime"`` (names to re-time: ``branches/<b>``, ``ablations/<m>``, ``best``), ``"robust"`` (name -> why it needs
    none), ``"measured_on"}``."""
    measured = {r["gpu_uuid"] for r in results if r["passed"]} | {g for _, g in ablations.values()} | {best_gpu}
    measured.discard(None)
    finals = finalists(results)
    if len(measured) < 2 or not finals:
        return None
    contest = len(finals) > 1 and len({r["gpu_uuid"] for r in finals}) > 1
    if not contest:
        finals = finals[:1]
    cands = [float(r["median_ms"]) for r in finals]
    noise = noise_pct / 100.0
    slack = 1.0 + FINALIST_MARGIN_PCT / 100.0
    robust: dict[str, str] = {}
    if not contest:
        robust[f"branches/{finals[0]['branch']}"] = (
            "the only finalist" if len(finalists(results)) == 1 else "its rivals were timed on its GPU")

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

    retime = [f"branches/{r['branch']}" for r in finals]
    for m, (ms, gpu) in ablations.items():
        if needed(f"ablations/{m}", float(ms), 1.0 + noise, "ablation/champion", {gpu}):
            retime.append(f"ablations/{m}")
    if best_ms is not None and needed("best", float(best_ms), 1.0 / (1.0 - noise), "best/champion", {best_gpu}):
        retime.append("best")
    return {"contest": contest, "finalists": finals, "retime": retime, "robust": robust,
            "measured_on": sorted(measured)}


def apply_retimes(results: list[dict[str, Any]], finals: list[Mapping[str, Any]], retimed: Mapping[str, float],
                  gpu_uuid: str | None, retimed_ci95: Mapping[str, tuple[float, float]] | None = None) -> None:
    """Mark each branch's ``finalist`` flag and keep its gate figures (``gate_median_ms``, ``gate_ci95_ms``,
    ``gate_gpu_uuid``); re-timed finalists take their re-timed ``median_ms`` (ms), ``gpu_uuid`` and ``ci95_ms``
    (``retimed_ci95``'s [low, high] ms, else None: a median is never shown with another measurement's interval).
    Only finalists can become champion."""
    keep = {r["branch"] for r in finals}
    for r in results:
        r["gate_median_ms"] = r["median_ms"]
        r["gate_ci95_ms"] = r.get("ci95_ms")
        r["gate_gpu_uuid"] = r["gpu_uuid"]
        r["finalist"] = r["branch"] in keep
        name = f"branches/{r['branch']}"
        if name in retimed:
            r["median_ms"] = retimed[name]
            ci = (retimed_ci95 or {}).get(name)
            r["ci95_ms"] = [float(ci[0]), float(ci[1])] if ci else None
            r["gpu_uuid"] = gpu_uuid


def decided(results: list[dict[str, Any]], ab_gate_ms: Mapping[str, float | None],
            decision: Mapping[str, Any] | None) -> tuple[Mapping[str, Any] | None, dict[str, float | None],
                                                         float | None]:
    """What the close decides on: (champion among the finalists, each ablation's ms, the best so far's ms as
    re-timed or None). ``results``: the branches with ``median_ms`` (ms) and, after a same-GPU decision, their
    ``finalist`` flags; ``ab_gate_ms``: each claimed method's ablation median from its timing gate (None: missing
    or failed); ``decision``: the same-GPU decision's record or None. Re-timed ablations take their re-timed
    median."""
    champion = select_champion([r for r in results if r.get("finalist", True)])
    retimed = (decision or {}).get("retimed_ms", {})
    ab_ms = {m: (retimed.get(f"ablations/{m}", ms) if ms is not None else None) for m, ms in ab_gate_ms.items()}
    return champion, ab_ms, retimed.get("best")


#: The residual's label wherever it is shown (attribution.json, the report, summary.md): the part of an iteration's
#: gain that no claimed method's ablation accounts for (an algorithm change, hyperparameters, interactions).
RESIDUAL_LABEL = "not explained by any method"
#: The residual's ``note`` when the methods explain more than the gain (a negative residual).
NOT_ADDITIVE = ("the methods' ablations cost more than the iteration gained: the champion without one of them is "
                "slower than the previous best, because the rest of it (its shape, the other methods) was built around "
                "that method; attributions here are not additive, so read each as what its method is worth inside "
                "this champion, not as a share of the gain")


def residual(previous_best_ms: float | None, champion_ms: float,
             attr: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """What an iteration's ablations leave unexplained (SKILL.md 3h attributes each method alone; the rest of the
    gain is here). ``gain_ms`` = ``previous_best_ms`` - ``champion_ms`` (ms; the best the improvement test compared
    against, re-timed where the close re-timed it), ``explained_ms`` = the sum of the conclusive attributions
    (``attribution_ms`` of each method whose ablation was judged, negative ones included), ``residual_ms`` = gain -
    explained. Percentages: ``gain_pct`` of the previous best; ``explained_pct_of_gain`` and
    ``residual_pct_of_gain`` of the gain (None when there is no gain to share out). ``inconclusive``: the methods
    whose attribution is missing; what they did is inside the residual. ``note``: :data:`NOT_ADDITIVE` when there was
    a gain and the methods explain more than all of it (the residual is negative), else None. None without a previous
    best."""
    if previous_best_ms is None or not previous_best_ms > 0:
        return None
    gain = previous_best_ms - champion_ms
    counted = {m: a["attribution_ms"] for m, a in attr.items() if a.get("attribution_ms") is not None}
    explained = float(sum(counted.values()))
    rest = gain - explained

    def share(x: float) -> float | None:
        return 100.0 * x / gain if gain > 0 else None

    return {"previous_best_ms": previous_best_ms, "champion_ms": champion_ms, "gain_ms": gain,
            "gain_pct": 100.0 * gain / previous_best_ms, "explained_ms": explained, "residual_ms": rest,
            "explained_pct_of_gain": share(explained), "residual_pct_of_gain": share(rest),
            "methods_counted": sorted(counted), "inconclusive": sorted(set(attr) - set(counted)),
            "label": RESIDUAL_LABEL, "note": NOT_ADDITIVE if gain > 0 and rest < 0 else None}


#: The buckets whose verdict is conclusive: both the ablation and the SASS check said something (SKILL.md 3j).
CONCLUSIVE = ("effective", "ineffective", "implementation_failed")


def verified(verdicts: Mapping[str, str]) -> bool:
    """SKILL.md's verified iteration: its close concluded (the champion passed every strict gate and was profiled
    with the run's ncu bundle, or the close would have stopped the run) and at least one claimed method was
    verified conclusively (effective, ineffective or implementation_failed). An iteration whose every method stayed
    ``unverified`` (ablations inconclusive, no SASS signature, or the champion's SASS the best kernel's) verified
    nothing, and "an unverified iteration never increments verified_iterations"."""
    return any(v in CONCLUSIVE for v in verdicts.values())
