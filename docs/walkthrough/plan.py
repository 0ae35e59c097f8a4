"""The walkthrough agent's branches and ablations, written from a template and per-branch macros
(docs/loop-walkthrough.md). ``python3 docs/walkthrough/plan.py NAME ITER OUT`` writes ``OUT/iterv<ITER>/``:
``methods.json``, ``branches/b<k>/kernel.cu`` and, for every branch as possible champion,
``<branch>/<method>/kernel.cu`` (that branch without the method), which benchmarks/walk_agent.py copies to the
paths a close's ``next`` names."""

from __future__ import annotations

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


def kernel(template: str, macros: dict[str, int]) -> str:
    head = "".join(f"#define {k} {v}\n" for k, v in macros.items())
    return f"// walkthrough plan: {template} with {macros}\n{head}" + (HERE / template).read_text()


def write(name: str, i: int, out: Path) -> None:
    template, methods, branches, off = PLANS[name][i]
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
    write(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
