"""The ``plan`` gate: the case's buffers as the kernel and reference describe them, made on torch's ``meta`` device
in harness processes (nothing allocated), checked for layout, size and names, and the memory a case will take
estimated and compared with what the GPU (or, on the CPU, the machine) has free, before any gate allocates it."""

from __future__ import annotations

import os
import time
from typing import Any

from ..artifacts import write_json
from ..errors import ContractError, NotApplicable, TooLargeError
from .context import Context, Outcome
from .inputs import draw_plan
from .preflight import preflight

#: bytes per element of the harness's dtypes
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
            "int64": 8, "uint64": 8, "int32": 4, "uint32": 4, "int16": 2, "uint16": 2, "int8": 1, "uint8": 1,
            "bool": 1}
#: An allowance per harness process for the CUDA context and torch's own workspace (not a measurement: what the
#: estimate adds so that a case that fills the GPU to the last byte is refused too).
CONTEXT_BYTES = 512 * 2**20
#: The judge's fast path's float64 temporaries: about six of :data:`pytest_kopt.child.judge.CHUNK` (2^24) elements.
JUDGE_BLOCK_BYTES = 6 * 8 * (1 << 24)
_GPU_INIT_HINTS = ("NVIDIA driver", "CUDA driver", "no CUDA GPUs", "Torch not compiled with CUDA", "cuda")


def numel(shape: list[int]) -> int:
    """Elements of a shape."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


def memory_estimate(spec: list[dict[str, Any]], *, l2_bytes: int, rotating_fraction: float,
                    free_bytes: int | None) -> dict[str, int]:
    """Peak bytes of one case, from its buffer spec (``name``, ``role``, ``shape``, ``dtype``), per the harness's
    allocations:

    - ``set_bytes``: one input set (inputs and outputs), ``input_bytes``/``output_bytes`` its parts;
    - ``candidate_bytes``: the candidate's correctness process: set A, the pristine copy of its inputs and set B's
      fresh buffers (2 sets + inputs), the copies of its four calls' outputs it keeps for the judge (4 x
      outputs), plus :data:`CONTEXT_BYTES`;
    - ``reference_bytes``: the judge, in the reference's process: one set, the copy of its inputs before the call
      and of its float inputs for the low-precision runs (1 set + 2 x inputs), its own four outputs (set A, set B,
      bf16 and fp16 inputs) and the candidate's four, imported (8 x outputs), the fast path's float64 blocks
      (:data:`JUDGE_BLOCK_BYTES`), plus :data:`CONTEXT_BYTES`; while it runs, the candidate's kept copies are
      still held (4 x outputs more on the GPU);
    - ``timing_bytes``: the timing process: the rotating sets (at least one, at most what ``rotating_fraction`` of
      ``free_bytes`` holds, 8 at most) and the L2 flush buffer (2 x ``l2_bytes``), plus :data:`CONTEXT_BYTES`;
    - ``device_bytes``: the largest of the three (with the candidate's kept copies beside the judge);
    - ``host_bytes``: the judge when a case fails and the numpy path words the failure: every array of both
      sides on the host, 8 x outputs.
    """
    size = {s["name"]: numel(s["shape"]) * ITEMSIZE.get(s["dtype"], 8) for s in spec}
    # a buffer of unknown role (taken from ref.shapes(): the candidate's setup() needs real memory) counts as both
    inputs = sum(size[s["name"]] for s in spec if s["role"] in ("input", "unknown"))
    outputs = sum(size[s["name"]] for s in spec if s["role"] in ("output", "unknown"))
    total = sum(size.values())
    sets = 1 if not free_bytes or total == 0 else max(1, min(8, int(free_bytes * rotating_fraction // total)))
    cand = 2 * total + inputs + 4 * outputs + CONTEXT_BYTES
    ref = total + 2 * inputs + 8 * outputs + min(JUDGE_BLOCK_BYTES, 6 * 8 * outputs) + CONTEXT_BYTES
    timing = sets * total + 2 * l2_bytes + CONTEXT_BYTES
    return {"set_bytes": total, "input_bytes": inputs, "output_bytes": outputs, "candidate_bytes": cand,
            "reference_bytes": ref, "timing_bytes": timing, "device_bytes": max(cand, ref + 4 * outputs, timing),
            "host_bytes": 8 * outputs}


def host_available() -> int | None:
    """Bytes of memory the machine has available (``MemAvailable`` of /proc/meminfo), None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def gib(n: float) -> str:
    """Bytes as GiB (MiB below 1 GiB), for messages."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def make_plan(ctx: Context) -> dict[str, Any]:
    """The case's spec, from the harness processes (the candidate's ``setup()`` on the meta device in a fresh
    process, the reference's checks in its own), and where the item's seconds went (``phase_s``: the processes'
    start asked for, each request's wall time and the harness's account of it, :func:`_request_phases`). Raises
    ContractError naming the buffer or parameter; NotApplicable when, without a GPU, the files cannot even be
    imported (they need one)."""
    params = [{"name": p.name, "dtype": p.dtype, "ctype": p.ctype, "role": p.role} for p in preflight(ctx)]
    base = {**ctx.kind.request_fields(ctx), "kernel": str(ctx.kernel), "ref": str(ctx.ref), "dims": ctx.settings.dims,
            "seed": ctx.settings.seeds[0], "params": params, "device": "meta", "env": {},
            "plan": draw_plan(ctx.settings.seeds[0], 0, ctx.regimes), "precision": ctx.settings.precision}
    t0 = time.time()
    ctx.ahead.prestart_harness(ctx)
    phase_s: dict[str, float] = {"prestart": time.time() - t0}
    try:
        scalars: dict[str, Any] = {}
        spec, note = None, None
        if ctx.kind.plans_candidate:
            # in the candidate's correctness process, the one its compile (and, on a GPU, correctness) requests go to
            t1 = time.time()
            cand = ctx.pool.run({**base, "mode": "plan_candidate", "env": ctx.kind.compile_env(ctx)}, gate="plan",
                                timeout_s=ctx.settings.gate_timeout_s, path=ctx.display, workdir=ctx.work,
                                server=ctx.server("check"))
            phase_s.update(_request_phases("candidate", time.time() - t1, cand))
            spec, scalars, note = cand["spec"], cand["scalars"], cand.get("meta_error")
        t1 = time.time()
        ref = ctx.pool.run({**base, "mode": "plan_reference", "spec": spec, "scalars": scalars}, gate="plan",
                           timeout_s=max(ctx.settings.gate_timeout_s, 120.0), path=str(ctx.ref), workdir=ctx.work,
                           server=ctx.server("judge"))
        phase_s.update(_request_phases("reference", time.time() - t1, ref))
    except ContractError as exc:
        if not ctx.gpu and "import failed" in exc.message and any(h in exc.message for h in _GPU_INIT_HINTS):
            raise NotApplicable(f"the plan needs a GPU here: {exc.message}") from None
        raise
    return {"spec": ref["spec"], "scalars": scalars, "note": note,
            "phase_s": {k: round(v, 3) for k, v in phase_s.items()}}


def _request_phases(who: str, wall_s: float, result: dict[str, Any]) -> dict[str, float]:
    """One plan request's wall seconds (``<who>_request``: from the item's ask to the answer, a process still
    starting included) and the harness's own account of it (``<who>_harness_<phase>``: the mode's seconds, the
    process's age and, its first request, the seconds its imports took; ``*_end`` stamps are Unix seconds)."""
    out = {f"{who}_request": wall_s}
    for k, v in (result.get("harness_s") or {}).items():
        if isinstance(v, (int, float)):
            out[f"{who}_harness_{k}"] = float(v)
    return out


def gate_plan(ctx: Context, case: Any = None) -> Outcome:
    """The plan gate: the buffers (shape, dtype, strides; each owning its elements and non-empty), the reference's
    parameters against them, and the memory estimate (:func:`memory_estimate`) against the GPU's free memory (the
    probe's figure) or, where a gate will run on the CPU, the machine's. Raises ContractError (exit 4) or
    TooLargeError (TOO_LARGE, exit 4) with the figure and the fix."""
    plan = make_plan(ctx)
    gpu = ctx.env.get("gpu") or {}
    free = gpu.get("free_bytes") if ctx.gpu else None
    est = memory_estimate(plan["spec"], l2_bytes=int(gpu.get("l2_bytes") or 50 * 2**20),
                          rotating_fraction=ctx.settings.rotating_memory, free_bytes=free)
    host = host_available()
    figures: dict[str, Any] = {k: v for k, v in est.items()}
    figures.update(buffers=len(plan["spec"]), gpu_free_bytes=free, host_available_bytes=host)
    cpu_run = not ctx.gpu and "correctness" in ctx.kind.cpu_gates  # correctness runs on the CPU here
    # the plan is written before any verdict, so a TOO_LARGE case keeps its estimate on disk as well as in figures
    write_json(ctx.outdir / "plan.json", {"kernel": str(ctx.kernel), "dims": ctx.settings.dims, "spec": plan["spec"],
                                          "note": plan["note"], "estimate": est, "phase_s": plan["phase_s"]})
    if free is not None and est["device_bytes"] > free:
        raise TooLargeError(f"the case needs about {gib(est['device_bytes'])} on the GPU per harness process "
                            f"({gib(est['set_bytes'])} per input set) but {gpu.get('name', 'the GPU')} has "
                            f"{gib(free)} free", gate="plan", path=ctx.display, figures=figures,
                            fix=f"give smaller --kopt-dims (the estimate is in this item's figures and in "
                                f"{ctx.outdir / 'plan.json'})")
    # the judge copies outputs to the host only where correctness runs: with a GPU, or on the CPU for Triton/Python
    need_host = est["host_bytes"] + (est["candidate_bytes"] if cpu_run else 0)
    if host is not None and (ctx.gpu or cpu_run) and need_host > host:
        raise TooLargeError(f"the case needs about {gib(need_host)} of this machine's memory (the outputs of every "
                            f"call, {gib(est['output_bytes'])} each, to judge them) but {gib(host)} are available",
                            gate="plan", path=ctx.display, figures=figures, fix="give smaller --kopt-dims")
    shown = ", ".join(f"{s['name']} {s['dtype']}{list(s['shape'])} {s['role'][:3]}" for s in plan["spec"][:4])
    where = f"{gib(free)} free on the GPU" if free is not None else "no GPU to check against"
    if not plan["spec"]:
        shown = "buffers unknown (setup() needs real memory and ref.py has no shapes())"
    elif plan["note"]:
        shown += " (from ref.shapes(): setup() needs real memory)"
    return Outcome(figures, f"{shown}{' ...' if len(plan['spec']) > 4 else ''}; {gib(est['set_bytes'])} per set, "
                            f"about {gib(est['device_bytes'])} per harness process ({where})")
