"""The walkthrough agent's branches and ablations, written from a template and per-branch macros
(docs/walkthrough/typed-2026-12-02.md). ``python3 docs/walkthrough/plan.py NAME ITER OUT [REPORT]`` writes ``OUT/iterv<ITER>/``
(iteration 1 as planned from the baseline; iterations 2 and 3 chosen by :func:`choose` from the last report):
``methods.json``, ``branches/b<k>/kernel.cu`` and, for every branch as possible champion,
``<branch>/<method>/kernel.cu`` (that branch without the method), which benchmarks/walk_agent.py copies to the
paths a close's ``next`` names."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

HERE = Path(__file__).parent

#: name -> iteration -> (template, methods, branch macros, method -> macros that turn it off)
PLANS: dict[str, dict[int, tuple[str, list[dict], list[dict[str, int]], dict[str, dict[str, int]]]]] = {
    "gemm": {
        1: ("gemm_iter1.cu",
            [{"id": "memory.shared_memory_tiling",
              "rationale": "every A and B element is read K times from L1/L2/DRAM by the naive kernel; BK-deep "
                           "shared-memory tiles cut global loads by the tile width"},
             {"id": "compute.register_tiling",
              "rationale": "one FFMA per two loads in the naive loop; a TM x TN register tile gives TM*TN FFMA "
                           "per TM+TN shared-memory loads"}],
            [dict(BM=64, BN=64, BK=8, TM=4, TN=4), dict(BM=128, BN=128, BK=8, TM=8, TN=8),
             dict(BM=128, BN=64, BK=16, TM=8, TN=4), dict(BM=64, BN=128, BK=8, TM=4, TN=8)],
            {"memory.shared_memory_tiling": dict(USE_SMEM=0),
             "compute.register_tiling": dict(BM=16, BN=16, TM=1, TN=1)}),
    },
    "layernorm": {
        1: ("layernorm_iter1.cu",
            [{"id": "memory.coalescing",
              "rationale": "one thread per row: a warp's 32 loads touch 32 rows 16 KB apart, 32 sectors per "
                           "request; T threads stepping through one row together read whole lines"},
             {"id": "latency.warp_shuffle",
              "rationale": "a row shared by T threads needs a reduction for mean and variance; shuffles avoid a "
                           "barrier per tree level",
              "override_reason": "the naive kernel has no reduction, so no barrier stall to trigger on; the "
                                 "coalesced row split of this iteration introduces one"}],
            [dict(T=128, ROWS=1), dict(T=256, ROWS=1), dict(T=32, ROWS=4), dict(T=512, ROWS=1)],
            {"memory.coalescing": dict(COALESCED=0), "latency.warp_shuffle": dict(USE_SHFL=0)}),
    },
}


#: Iterations 2 and 3: per baseline, the template, the methods the agent may pick in priority order (id, axis,
#: macros that turn it on, macros of the state before it, rationale), and the branch variations around the best
#: kernel's configuration.
LATER: dict[str, tuple[str, list[tuple[str, dict[str, int], dict[str, int], str]], list[dict[str, int]]]] = {
    "gemm": ("gemm_iter2.cu", [
        ("memory.vectorized_access", dict(VEC=1), dict(VEC=0),
         "tile loads are 4-byte LDG; float4 (LDG.E.128) moves a tile row in a quarter of the instructions"),
        ("latency.double_buffering", dict(DB=1), dict(DB=0),
         "two barriers per K step and the next tile's loads wait behind the multiply; a second stage loaded into "
         "registers during the multiply hides that latency"),
        ("latency.occupancy_tuning", dict(MINB=2), dict(MINB=1),
         "asking for two resident blocks per SM caps registers so a second block can hide the barrier waits"),
        ("memory.async_copy", dict(ASYNC=1), dict(ASYNC=0),
         "long-scoreboard stalls on the tile loads: cp.async copies the B tile to shared memory without a register "
         "round trip, and its wait sits after the A tile's stores"),
        ("compute.loop_unroll", dict(UNROLL=1), dict(UNROLL=0),
         "the BK loop of TM x TN FFMAs is short and its loads of the next fragment wait on the last; fully unrolled, "
         "the fragment loads of step k+1 issue under the FFMAs of step k"),
    ], [dict(BM=128, BN=128, BK=8, TM=8, TN=8), dict(BM=128, BN=128, BK=16, TM=8, TN=8),
        dict(BM=64, BN=128, BK=8, TM=8, TN=8), dict(BM=128, BN=64, BK=16, TM=8, TN=8)]),
    "layernorm": ("layernorm_iter2.cu", [
        ("memory.shared_memory_tiling", dict(SMEM_ROW=1), dict(SMEM_ROW=0),
         "the row is read from DRAM/L2 three times (mean, variance, output); staged in shared memory it is read once"),
        ("memory.vectorized_access", dict(VEC=1), dict(VEC=0),
         "scalar 4-byte loads and stores; float4 moves 16 bytes per instruction"),
        ("compute.loop_unroll", dict(UNROLL=1), dict(UNROLL=-1),
         "each pass is a short loop with a dependent add; unrolled by 4 the loads of a thread overlap"),
        ("latency.occupancy_tuning", dict(MINB=4), dict(MINB=1),
         "__launch_bounds__ with 4 resident blocks keeps more rows in flight per SM"),
    ], [dict(TPR=256, ROWS=1), dict(TPR=128, ROWS=1), dict(TPR=512, ROWS=1), dict(TPR=128, ROWS=2)]),
}


def best_macros(best_file: Path) -> dict[str, int]:
    """The macros of the best kernel so far, read from its first line (``// walkthrough plan: T with {...}``)."""
    first = best_file.read_text().splitlines()[0]
    return ast.literal_eval(first.split(" with ", 1)[1]) if " with " in first else {}


def choose(name: str, i: int, report: dict) -> tuple[str, list[dict], list[dict[str, int]], dict[str, dict[str, int]]]:
    """Iteration ``i`` (2 or 3) from the last report alone: the axis budget in ``loop.next.budget``, the methods
    already tried in ``loop.selected_methods``, the best kernel in ``loop.best_file``. Methods are taken in priority order
    while their axis has budget left (at most the total budget); every other switch stays as the best kernel has
    it; the branches are the template's tile variations. When no triggered method fits the budget (SGEMM's
    iteration 3: compute budget 1, every compute option untriggered), the first untried method of a budgeted axis
    is taken with an ``override_reason`` that quotes the metric, since an iteration needs at least one method."""
    loop = report["loop"]
    budget = dict(loop["next"]["budget"])
    state_file = next((Path(p) for p in loop["next"]["read"] if p.endswith("state.json")), None)
    tried = set(loop.get("selected_methods") or
                (json.loads(state_file.read_text()).get("selected_methods", []) if state_file else []))
    template, options, variations = LATER[name]
    specs = {m["id"]: m for m in json.loads((HERE.parents[1] / "registries" / "method_registry.json")
                                            .read_text())["methods"]}
    evidence = next((json.loads(Path(p).read_text()) for p in loop["next"]["read"] if p.endswith("ncu_top.json")), {})
    metrics = evidence.get("metrics") or {}

    def triggered(mid: str) -> bool:  # SKILL.md 3c: the registry's trigger against the best kernel's ncu metrics
        trig = specs[mid].get("trigger") or {}
        value = metrics.get(trig.get("metric"))
        ops = {">": float.__gt__, "<": float.__lt__, ">=": float.__ge__, "<=": float.__le__}
        return not isinstance(value, (int, float)) or trig.get("op") not in ops or \
            ops[trig["op"]](float(value), float(trig["value"]))
    state = {k: v for _, _, before, _ in options for k, v in before.items()}
    best_file = Path(loop["best_file"])
    if template in best_file.read_text().splitlines()[0]:  # the best came from this template: keep its switches
        state.update({k: v for k, v in best_macros(best_file).items() if k in state})
    methods, off = [], {}
    left = sum(budget.values())
    for mid, on, before, why in options:
        axis = specs[mid]["axis"]
        if mid in tried or budget.get(axis, 0) <= 0 or left <= 0 or not triggered(mid):
            continue
        budget[axis] -= 1
        left -= 1
        methods.append({"id": mid, "rationale": why})
        state.update(on)
        off[mid] = before
    if not methods:  # nothing triggered fits the budget: the first untried method of a budgeted axis, overridden
        for mid, on, before, why in options:
            trig = specs[mid].get("trigger") or {}
            if mid in tried or budget.get(specs[mid]["axis"], 0) <= 0:
                continue
            value = metrics.get(trig.get("metric"))
            methods.append({"id": mid, "rationale": why, "override_reason":
                            f"{trig.get('metric')} = {value} (its trigger {trig.get('op')} {trig.get('value')} does "
                            f"not hold), yet it is the one untried method on the {specs[mid]['axis']} axis, which "
                            "has budget left; the ablation measures what it is worth"})
            state.update(on)
            off[mid] = before
            break
    branches = [{**state, **v} for v in variations]
    return template, methods, branches, off


def kernel(template: str, macros: dict[str, int]) -> str:
    head = "".join(f"#define {k} {v}\n" for k, v in macros.items())
    return f"// walkthrough plan: {template} with {macros}\n{head}" + (HERE / template).read_text()


def write(name: str, i: int, out: Path, report: dict | None = None) -> None:
    template, methods, branches, off = PLANS[name][i] if i in PLANS[name] else choose(name, i, report or {})
    it = out / f"iterv{i}"
    (it / "branches").mkdir(parents=True, exist_ok=True)
    (it / "methods.json").write_text(json.dumps({"methods": methods}, indent=2) + "\n")
    for k, macros in enumerate(branches, start=1):
        b = it / "branches" / f"b{k}"
        b.mkdir(parents=True, exist_ok=True)
        (b / "kernel.cu").write_text(kernel(template, macros))
        for m, changes in off.items():
            a = it / f"b{k}" / m
            a.mkdir(parents=True, exist_ok=True)
            (a / "kernel.cu").write_text(kernel(template, {**macros, **changes}))


if __name__ == "__main__":
    write(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]),
          json.loads(Path(sys.argv[4]).read_text()) if len(sys.argv) > 4 else None)
