"""The agent's head for the H200 acceptance drive of issue #37: a kernel the loop has not met before (an fp32 matrix
transpose, 8192 x 8192, naive baseline in ``transpose/transpose.cu``), three iterations closed, then ``finish``.

    python3 benchmarks/drive_loop.py .kopt/drive/transpose --plan benchmarks/drive_plans/transpose_h200.py
    (benchmarks/h200_drive.sh runs it on the device machine and generates the walkthrough)

Every decision reads the report only: the budget (``next.budget``), the evidence it names (``next.files``:
``ncu_top.json`` and the method registry), the methods tried (``selected_methods``), the best kernel so far
(``best_file``: the switches it was built with, from its first line) and, for ablations, the champion's kernel
(``next.champion_kernel``). Kernels are ``transpose/template.cu`` under a block of ``#define`` switches, one per
method (SMEM, VEC, ASYNC, UNROLL, MINB); a branch is a tile shape, an ablation the champion with one switch off.
"""

from __future__ import annotations

import json
import operator
import shutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "transpose"
SETUP = {"baseline": "transpose.cu", "ref": "ref.py", "dims": "M=8192,N=8192", "iterations": 4, "branches": 4,
         "seeds": "1,2,3"}
#: the iteration at which this plan finishes the run (after three closed iterations, the acceptance's number)
FINISH_AT = 4
#: per method: its switch, on and off values, its axis, and the switch the best kernel must have on already
METHODS = {
    "memory.shared_memory_tiling": ("SMEM", 1, 0, "memory", None),
    "memory.vectorized_access": ("VEC", 1, 0, "memory", None),
    "memory.async_copy": ("ASYNC", 1, 0, "memory", "SMEM"),
    "compute.loop_unroll": ("UNROLL", 1, 0, "compute", None),
    "latency.occupancy_tuning": ("MINB", 4, 0, "latency", None),
}
#: what the naive baseline amounts to in the template's switches (it is not the template: nothing is on)
NAIVE = {"SMEM": 0, "VEC": 0, "ASYNC": 0, "UNROLL": 0, "MINB": 0}
#: a branch is a tile shape: (TILE, BROWS)
SHAPES = [(32, 8), (64, 8), (32, 16), (64, 16)]
#: at most this many methods a closed iteration claims (each one's ablation then says what it is worth): one, so the
#: five switches last three closed iterations whatever the budget (SKILL.md's gaps give a transpose, which does no
#: arithmetic, compute slots and, once near its DRAM roof, no memory slot)
PER_ITERATION = 1
MARK = "// kopt-drive switches: "
OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def prepare(workdir: Path) -> None:
    """The baseline and the reference in ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("transpose.cu", "ref.py"):
        shutil.copy(HERE / name, workdir / name)


def switches_of(kernel: Path) -> dict[str, int]:
    """The switches a kernel of this plan was written with (its first line); the naive baseline's otherwise."""
    first = Path(kernel).read_text().split("\n", 1)[0]
    return {**NAIVE, **json.loads(first[len(MARK):])} if first.startswith(MARK) else dict(NAIVE)


def kernel(switches: dict[str, int], note: str) -> str:
    """The template under its switches (the first line records them for the next decision)."""
    lines = [MARK + json.dumps(switches, sort_keys=True), f"// {note}"]
    lines += [f"#define {k} {v}" for k, v in sorted(switches.items())]
    return "\n".join(lines) + "\n" + (HERE / "template.cu").read_text()


def _read(loop: dict[str, Any], name: str) -> dict[str, Any]:
    return json.loads(Path(loop["next"]["files"][name]).read_text())


def choose(loop: dict[str, Any], best: dict[str, int]) -> list[dict[str, Any]]:
    """SKILL.md 3c's scan over what the template can change: per axis with budget, in this plan's priority order,
    the untried methods whose switch is off in the best kernel and whose prerequisite is on; a trigger the evidence
    contradicts is claimed with an override_reason that quotes the measured value (the ablation then says what the
    method is worth). At most :data:`PER_ITERATION`."""
    budget = loop["next"]["budget"] or {}
    metrics = _read(loop, "ncu_top").get("metrics") or {}
    registry = {m["id"]: m for m in _read(loop, "method_registry")["methods"]}
    tried = set(loop.get("selected_methods") or [])
    out: list[dict[str, Any]] = []
    for axis in ("memory", "compute", "latency"):
        left = min(budget.get(axis, 0), 2)
        for mid, (switch, on, _, m_axis, needs) in METHODS.items():
            if m_axis != axis or left == 0 or len(out) >= PER_ITERATION or mid in tried or best[switch] == on:
                continue
            if needs and not best[needs]:
                continue
            entry: dict[str, Any] = {"id": mid, "rationale": f"switch {switch} on, the {axis} axis has budget"}
            trig = registry[mid].get("trigger") or {}
            value = metrics.get(trig.get("metric"))
            if isinstance(value, (int, float)) and not OPS[trig["op"]](value, trig["value"]):
                entry["override_reason"] = (f"{trig['metric']} = {value:g} (its trigger {trig['op']} {trig['value']} "
                                            f"does not hold); {mid} is what this kernel can still change on the "
                                            f"{axis} axis, and its ablation measures what it is worth")
            out.append(entry)
            left -= 1
    return out


def decide(loop: dict[str, Any], run: Path, workdir: Path) -> dict[str, Any]:
    nxt = loop["next"]
    if nxt["action"] == "write_ablations":
        sw = switches_of(Path(nxt["champion_kernel"]))
        out = {}
        for a in nxt["ablations"]:
            switch, _, off, _, _ = METHODS[a["method"]]
            out[a["method"]] = kernel({**sw, switch: off}, f"ablation of {a['method']}: {nxt['champion']} without it")
        return out
    best = switches_of(Path(loop["best_file"]))
    chosen = choose(loop, best)
    left = [m for m in METHODS if m not in set(loop.get("selected_methods") or [])]
    if nxt["iteration"] >= FINISH_AT or not chosen:
        why = ("three iterations closed, the drive this plan was written for" if nxt["iteration"] >= FINISH_AT
               else "no untried method this template can write fits the budget")
        return {"finish": f"{why}; untried: {', '.join(left) or 'none'} (a filler would only spend the budget)"}
    on = {**best, **{METHODS[c["id"]][0]: METHODS[c["id"]][1] for c in chosen}}
    branches = {f"b{k + 1}": kernel({**on, "TILE": t, "BROWS": r}, f"iterv{nxt['iteration']} b{k + 1}: TILE {t}, "
                                    f"BROWS {r}") for k, (t, r) in enumerate(SHAPES[:len(nxt["branch_kernels"])])}
    return {"methods": {"methods": chosen, "skipped_higher": []}, "branches": branches}
