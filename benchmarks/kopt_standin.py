"""Stand-ins for the GPU gates, so that the optimization loop can be driven end to end on a machine without a GPU
(the loop's CPU tests and ``benchmarks/drive_loop.py --standin``). Loaded with ``-p kopt_standin`` (this folder on
``PYTHONPATH``); it replaces module attributes, so it must be imported before the session configures (``-p`` is).

What it stands in for, and nothing else:

- the hardware probe's verdict: the environment is the real one (no GPU), with ``generation_allowed`` true and
  ``standin`` true, so the loop's SKILL.md step-0 check lets the run go on;
- the ``timing`` gate: ``bench.json`` with the median a kernel declares (``STANDIN_MS = 8.0`` at module level of a
  pure-Python candidate), 1.0 ms when it declares none;
- the ``ncu`` gate: ``ncu_top.json`` from the metrics a kernel declares (``STANDIN_METRICS = {"dram_throughput_pct":
  20.0, ...}``, registry names; a fixed set otherwise), its top metrics cut to ``--kopt-ncu-num`` by kopt's own
  :func:`~pytest_kopt.gates.roofline.top_metrics`, the run's ncu set when the loop pins one, and the SASS the kernel
  declares (``STANDIN_SASS = "LDS STS"``: opcodes, written as ``sass/standin.sass``) for the loop's SASS check.

Correctness runs for real (pure-Python candidates on the CPU), as do the roofline (kopt's gate, on the stand-in
metrics), the plan, preflight and the loop itself. Nothing here is a measurement: the figures are the kernel's own
declarations, chosen by whoever wrote it.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest_kopt.plugin as _plugin
from pytest_kopt import registry
from pytest_kopt.gates import builtin as _builtin
from pytest_kopt.gates import hardware as _hardware
from pytest_kopt.gates.context import Context, Outcome
from pytest_kopt.gates.roofline import top_metrics
from pytest_kopt.gates.table import Gate

GPU_UUID = "GPU-standin-0"
#: the metrics of a kernel that declares none: every gap known, budget 1/1/1
DEFAULT_METRICS = {"sm_throughput_pct": 40.0, "fp32_pipe_pct": 20.0, "issue_active_pct": 45.0,
                   "dram_throughput_pct": 30.0, "l1_hit_rate_pct": 60.0, "l2_hit_rate_pct": 70.0,
                   "memory_throughput_pct": 35.0, "achieved_occupancy_pct": 40.0, "stall_long_scoreboard": 3.0,
                   "stall_barrier": 1.0, "stall_wait": 1.0}


def declared(kernel: Path, name: str, default: Any) -> Any:
    """The literal a kernel file assigns to ``name`` at module level (read with ``ast``: the candidate is never
    imported into pytest's process), ``default`` when it assigns none."""
    try:
        tree = ast.parse(kernel.read_text())
    except (OSError, SyntaxError, ValueError):
        return default
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return default
    return default


def standin_timing(ctx: Context, case: Any = None) -> Outcome:
    """The timing gate's stand-in: ``bench.json`` with the kernel's declared median (ms) and a 1% interval."""
    ms = float(declared(ctx.kernel, "STANDIN_MS", 1.0))
    samples = [ms * f for f in (0.995, 0.998, 1.0, 1.0, 1.002, 1.005)]
    ctx.outdir.mkdir(parents=True, exist_ok=True)
    doc = {"timing_valid": True, "median_ms": ms, "samples_ms": samples, "gpu_uuid": GPU_UUID, "standin": True,
           "distribution": {"ci95_low_ms": ms * 0.995, "ci95_high_ms": ms * 1.005, "robust_cv": 0.002}}
    (ctx.outdir / "bench.json").write_text(json.dumps(doc, indent=2))
    return Outcome({"median_ms": ms, "standin": True}, f"stand-in: median {ms:.4f} ms (declared STANDIN_MS)",
                   (str(ctx.outdir / "bench.json"),))


def standin_ncu(ctx: Context, case: Any = None) -> Outcome:
    """The ncu gate's stand-in: ``kernel.ncu-rep`` (a placeholder), ``ncu_top.json`` from the declared metrics
    (top ``--kopt-ncu-num`` per axis, kopt's own selection) and the declared SASS opcodes."""
    ms = float(declared(ctx.kernel, "STANDIN_MS", 1.0))
    metrics = {**DEFAULT_METRICS, **declared(ctx.kernel, "STANDIN_METRICS", {})}
    table = {name: metrics.get(name) for name in registry.load(registry.METRICS)["metrics"]}
    chosen = ctx.settings.ncu_set or ("full" if ms < 10.0 else "light")
    ctx.outdir.mkdir(parents=True, exist_ok=True)
    (ctx.outdir / "kernel.ncu-rep").write_bytes(b"pytest-kopt stand-in: no ncu report")
    top = {"set": chosen, "set_reason": "stand-in", "duration_ms": ms, "metrics": table, "kernel": ctx.kernel.stem,
           "report": str(ctx.outdir / "kernel.ncu-rep"), "ncu_num": ctx.settings.ncu_num, "standin": True,
           "top": top_metrics(table, registry.load(registry.METRICS), ctx.settings.ncu_num)}
    (ctx.outdir / "ncu_top.json").write_text(json.dumps(top, indent=2))
    opcodes = str(declared(ctx.kernel, "STANDIN_SASS", "FFMA")).split()
    sass = ctx.outdir / "sass"
    sass.mkdir(exist_ok=True)
    lines = [f"        /*{16 * k:04x}*/                   {op} R0, R1, R2 ;" for k, op in enumerate(opcodes)]
    (sass / "standin.sass").write_text("\t\tFunction : standin\n" + "\n".join(lines) + "\n")
    return Outcome({"ncu_set": chosen, "standin": True}, f"stand-in: {chosen} set, top {ctx.settings.ncu_num} per "
                   "axis", (str(ctx.outdir / "ncu_top.json"),))


_FAKES = {"timing": standin_timing, "ncu": standin_ncu}
_real_detect = _hardware.detect
_real_gates = _builtin.builtin_gates


def gates() -> list[Gate]:
    """kopt's gates with the timing and ncu rows standing in (the same functions every call, so the session's
    table compares them equal)."""
    return [dataclasses.replace(g, run=_FAKES[g.name]) if g.name in _FAKES else g for g in _real_gates()]


def detect(attempts: int = 1, tools: dict[str, Any] | None = None) -> dict[str, Any]:
    """The real probe, with the loop's step-0 verdict standing in: generation allowed, and said to be a stand-in."""
    env = _real_detect(attempts, tools=tools)
    return {**env, "generation_allowed": True, "standin": True, "sm_arch": env.get("sm_arch") or "sm_90a",
            "reason": "pytest-kopt stand-in (benchmarks/kopt_standin.py): the timing and ncu gates are stand-ins; "
                      f"the real probe said: {env.get('reason')}"}


_plugin.builtin_gates = gates  # the session's table (session_registries, pytest_kopt_gates)
_hardware.detect = detect
