"""The agent's head for a CPU drive of the loop with stand-in GPU gates (``benchmarks/kopt_standin.py``): a row
softmax whose kernels are torch on the CPU (correctness is real) and whose times, ncu metrics and SASS opcodes are
declared in each kernel (``STANDIN_MS``, ``STANDIN_METRICS``, ``STANDIN_SASS``). Two iterations are closed, the
third is ended with ``finish``.

    python3 benchmarks/drive_loop.py WORKDIR --plan benchmarks/drive_plans/softmax_standin.py --standin

Every decision reads the report only: the budget (``next.budget``), the evidence files it names (``next.files``),
the methods tried (``selected_methods``), the best so far (``best_ms``) and, for ablations, the champion's kernel
(``next.champion_kernel``).
"""

from __future__ import annotations

import json
import operator
import shutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SETUP = {"baseline": "softmax.py", "ref": "ref.py", "dims": "M=8,N=64", "iterations": 3, "branches": 2,
         "seeds": "1,2"}

#: per axis, the methods this agent knows how to write, in its priority order: (id, SASS opcodes its kernels
#: show, the share of the time it saves: what the ablation puts back)
KNOWN = {"memory": [("memory.shared_memory_tiling", "LDS STS", 0.40), ("memory.vectorized_access", "LDG.E.128", 0.15)],
         "compute": [("compute.register_tiling", "", 0.10), ("compute.loop_unroll", "", 0.025)],
         "latency": [("latency.warp_shuffle", "SHFL", 0.01)]}
OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}

KERNEL = '''"""{doc}"""
import torch

STANDIN_MS = {ms!r}
STANDIN_SASS = {sass!r}
STANDIN_METRICS = {metrics!r}


def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {{"inputs": {{"x": x, "y": torch.empty_like(x)}}, "outputs": ["y"]}}


def run_kernel(x, y):
    y.copy_(torch.softmax(x, dim=-1))
'''


def prepare(workdir: Path) -> None:
    """The baseline and the reference in ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE.parent.parent / "tests" / "redteam" / "ref_softmax.py", workdir / "ref.py")
    (workdir / "softmax.py").write_text(KERNEL.format(doc="baseline: torch softmax", ms=10.0, sass="FFMA",
                                                      metrics={}))


def _read(loop: dict[str, Any], name: str) -> dict[str, Any]:
    return json.loads(Path(loop["next"]["files"][name]).read_text())


def choose(loop: dict[str, Any]) -> list[tuple[str, str, float]]:
    """SKILL.md 3c's scan over what this agent can write: per budgeted axis, untried methods whose registry
    trigger the evidence supports, up to the axis budget."""
    budget = loop["next"]["budget"]
    metrics = _read(loop, "ncu_top").get("metrics") or {}
    registry = {m["id"]: m for m in _read(loop, "method_registry")["methods"]}
    tried = set(loop.get("selected_methods") or [])
    out = []
    for axis, options in KNOWN.items():
        picked = 0
        for mid, sass, worth in options:
            trig = registry[mid].get("trigger") or {}
            value = metrics.get(trig.get("metric"))
            fires = value is None or OPS[trig["op"]](value, trig["value"])
            if picked < budget.get(axis, 0) and mid not in tried and fires:
                out.append((mid, sass, worth))
                picked += 1
    return out


def kernel(ms: float, chosen: list[tuple[str, str, float]], doc: str, metrics: dict[str, float]) -> str:
    sass = " ".join(["FFMA", *[s for _, s, _ in chosen if s]])
    return KERNEL.format(doc=doc, ms=round(ms, 4), sass=sass, metrics=metrics)


#: what the champion of each iteration's profile shows (the next iteration's evidence)
AFTER = {1: {"dram_throughput_pct": 55.0, "l1_hit_rate_pct": 92.0, "issue_active_pct": 50.0,
             "achieved_occupancy_pct": 70.0, "stall_long_scoreboard": 2.0},
         2: {"dram_throughput_pct": 85.0, "l1_hit_rate_pct": 93.0, "issue_active_pct": 75.0,
             "achieved_occupancy_pct": 72.0, "stall_long_scoreboard": 0.5}}


def decide(loop: dict[str, Any], run: Path, workdir: Path) -> dict[str, Any]:
    nxt = loop["next"]
    best = float(loop["best_ms"])
    if nxt["action"] == "write_ablations":
        champion = Path(nxt["champion_kernel"]).read_text()
        ms = float(champion.split("STANDIN_MS = ", 1)[1].split("\n", 1)[0])
        worth = {m: w for opts in KNOWN.values() for m, _, w in opts}
        return {a["method"]: champion.replace(f"STANDIN_MS = {ms!r}", f"STANDIN_MS = {round(ms * (1 + worth[a['method']]), 4)!r}")
                for a in nxt["ablations"]}
    i = nxt["iteration"]
    chosen = choose(loop)
    if i >= 3 or not chosen:
        return {"finish": "every method this agent can write that the evidence triggers within the budget was "
                          "tried; a filler would only spend the budget (SKILL.md: leave it under-filled)"}
    methods = {"methods": [{"id": m, "rationale": f"iterv{i}: {m} fits the budget and its trigger holds"}
                           for m, _, _ in chosen],
               "skipped_higher": []}
    # two branches: the same methods, two tile shapes; b1 is the better one in iteration 2, b2 in iteration 1
    factors = {1: (0.6, 0.5), 2: (0.8, 0.88)}[i]
    branches = {f"b{k + 1}": kernel(best * f, chosen, f"iterv{i} b{k + 1}", AFTER[i])
                for k, f in enumerate(factors)}
    want: dict[str, Any] = {"methods": methods, "branches": branches}
    if i == 2:  # ablations written before the close, from the branch this agent expects to win: one step
        ms = best * factors[0]
        want["ablations"] = {m: ("b1", kernel(ms * (1 + w), [c for c in chosen if c[0] != m], f"b1 without {m}",
                                              AFTER[i])) for m, _, w in chosen}
    return want
