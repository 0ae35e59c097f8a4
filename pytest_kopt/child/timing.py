"""Timing requests in a harness process: the candidate or the reference over rotating input sets, at once or in
alternating rounds (the timer kept in this process between rounds), and the GPU's measured peaks."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from . import HarnessError
from .inputs import Inputs, check_spec
from .kernels import Candidate
from .formats import load_reference
from .reference import trusted_scalars
from .cupti import cupti_samples
from .timer import GraphTimer, Timer, make_timer
from .candidate import Keeper

#: Timers of parties timed in alternating rounds, kept in a warm harness process between requests (round key ->
#: (Timer, finish function)). One interleaved measurement at a time.
_ROUNDS: dict[str, tuple[Timer, Callable[[dict[str, Any]], dict[str, Any]]]] = {}
#: What a ``warm`` round made ahead of its measurement's first round (round key -> (the mode's own object, the
#: seconds it took)): the mode's ``warm`` function's return, handed to its ``prepare``. One at a time, as rounds are.
_WARM: dict[str, tuple[Any, float]] = {}


def device_uuid(torch: Any) -> str | None:
    """The UUID of the GPU this process runs on, ``GPU-xxxxxxxx-...`` as nvidia-smi prints it; None when this torch
    does not report it."""
    uuid = getattr(torch.cuda.get_device_properties(0), "uuid", None)
    return None if uuid is None else "GPU-" + str(uuid).removeprefix("GPU-")


def rotating_sets(torch: Any, first: Inputs, plan: dict[str, Any], seed: int, ref: Any, dims: dict[str, Any],
                  kept: dict[str, Any], t: dict[str, Any]) -> list[Inputs]:
    """``first`` plus up to ``t["max_sets"] - 1`` more input sets (different values, different addresses), as many
    as fit in ``t["mem_fraction"]`` of the free device memory."""
    free = torch.cuda.mem_get_info()[0]
    count = max(1, min(int(t["max_sets"]), int(free * t["mem_fraction"] // max(1, first.nbytes))))
    sets = [first]
    for j in range(1, count):
        extra = Inputs(torch, first.spec, first.scalars, first.device)
        extra.fill(plan, seed + 7919 * j, ref, dims, kept)
        sets.append(extra)
    return sets


def timed(req: dict[str, Any], prepare: Callable[[Any], tuple[Timer, Callable[[dict[str, Any]], dict[str, Any]]]],
          warm: Callable[[], Any] = lambda: None) -> dict[str, Any]:
    """Run a timing request: all at once, or (``req["round"]`` = {key, count, final}) one round of an interleaved
    measurement, its Timer kept between rounds in this process. ``warm()`` does the work that need not run alone on
    the GPU (loading the kernel, its first call) and returns what it made; ``prepare(made)`` the rest, returning
    (Timer, finish), where ``finish(result)`` adds the mode's own figures to the Timer's result. A round with
    ``warm`` (before the measurement's GPU lock is held exclusively: ``gates/measure.py``'s
    :meth:`~pytest_kopt.gates.measure.Rounds.warm`) runs ``warm()`` alone and keeps its object for the first round of
    its key; a first round without it warms at once. A non-final round returns the samples taken so far and the
    stop reason; ``phase_s`` has ``warm`` (where it ran inside the measurement) or ``warm_ahead`` (before it)."""
    rnd = req.get("round")
    if rnd is None:
        t0 = time.perf_counter()
        made = warm()
        timer, finish = prepare(made)
        timer.phase_s["prepare"] = time.perf_counter() - t0
        return finish(timer.result(timer.take()))
    if rnd.get("warm"):
        _ROUNDS.clear()  # one interleaved measurement at a time: drop what an aborted one left
        _WARM.clear()
        t0 = time.perf_counter()
        made = warm()
        _WARM[rnd["key"]] = (made, time.perf_counter() - t0)
        return {"round": True, "warm": True, "event_ms": [], "stop_reason": None}
    if rnd["key"] not in _ROUNDS:
        _ROUNDS.clear()
        ahead = _WARM.pop(rnd["key"], None)
        _WARM.clear()
        t0 = time.perf_counter()
        made, warm_s = ahead if ahead is not None else (warm(), time.perf_counter() - t0)
        _ROUNDS[rnd["key"]] = prepare(made)
        phase = _ROUNDS[rnd["key"]][0].phase_s
        phase["prepare"] = time.perf_counter() - t0
        phase["warm_ahead" if ahead is not None else "warm"] = warm_s
    timer, finish = _ROUNDS[rnd["key"]]
    reason = timer.take(int(rnd["count"]))
    if not rnd.get("final"):
        return {"event_ms": list(timer.event_ms), "stop_reason": reason, "round": True,
                "sample_wall_s": timer.elapsed_s / max(1, len(timer.event_ms)), **timer.info}
    del _ROUNDS[rnd["key"]]
    return finish(timer.result(reason or "rounds"))


def call_wall_ms(timer: Timer) -> float:
    """The wall ms one event sample took (its refresh, flush, hold, call and synchronisation), 0 before any."""
    return 1e3 * timer.elapsed_s / len(timer.event_ms) if timer.event_ms else 0.0


def _scalars(inp: Inputs) -> dict[str, Any]:
    return {k: v for k, v in inp.scalars.items() if isinstance(v, (int, float, str))}


def mode_timing(req: dict[str, Any]) -> dict[str, Any]:
    """Time the candidate over rotating input sets (:mod:`pytest_kopt.child.timer`). Keeps the inputs and outputs of
    a check call on the last timed set (:class:`~pytest_kopt.child.candidate.Keeper`) for the judge in the
    reference's process (:func:`~pytest_kopt.child.correctness.mode_check_timed`)."""
    def warm() -> Candidate:
        cand = Candidate(req)
        if cand.device != "cuda":
            raise HarnessError("runtime", "timing needs a CUDA device")
        cand.run()  # module load / JIT outside the measurement; checks the launch once
        return cand

    def prepare(cand: Candidate) -> tuple[Timer, Callable[[dict[str, Any]], dict[str, Any]]]:
        torch = cand.torch
        t = req["timing"]
        sets = rotating_sets(torch, cand.inputs, req["plan"], int(req["seed"]), cand.ref, cand.dims, cand.kept, t)

        def launch(s: Inputs) -> None:
            cand.inputs = s
            cand.launch()

        def refresh(s: Inputs, k: int) -> None:
            s.fill(req["plan"], int(req["seed"]) + 104729 * (k + 1), cand.ref, cand.dims, cand.kept)

        if any(s["role"] == "inout" for s in cand.inputs.spec):
            t = {**t, "refresh_every_call": True}
        timer = make_timer(torch, sets, launch, refresh, t)

        def finish(result: dict[str, Any]) -> dict[str, Any]:
            # kernel-only time from the GPU's own records, beside the events
            t0 = time.perf_counter()
            med_ms = statistics.median(result["event_ms"]) if result.get("event_ms") else 1.0
            cupti = cupti_samples(timer, med_ms, call_wall_ms(timer)) if req.get("mode") == "timing" else None
            timer.phase_s["cupti"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            last = sets[(len(result["event_ms"]) - 1) % len(sets)]
            cand.inputs = last  # the profiled calls went over every set: the check call is on this one
            inout = any(s["role"] == "inout" for s in last.spec)
            # the values the pytest process chose for the check call (the judge draws the same ones itself, and
            # runs the reference on its own copy)
            last.fill(req["plan"], int(req["check_seed"]), cand.ref, cand.dims, cand.kept)
            # for the judge in the reference's process: CUDA IPC, else (or in a fresh process) an .npz
            keep = Keeper(torch, "cuda", ipc=req.get("transport", "ipc") == "ipc")
            got: dict[str, Any] = {}
            if isinstance(timer, GraphTimer) and timer.graph_method == "cuda_graph" and not cand.returned \
                    and not inout:
                # what was timed is the graph: poison the outputs, replay it and check *its* results (a kernel that
                # skips its work while a capture is under way leaves them NaN)
                last.poison_outputs()
                timer.replay_pairs()
            else:
                got = cand.run()  # surfaces an error raised by any timed launch (sticky CUDA errors)
            # the check call rewrote the outputs from the chosen inputs; a stale timed output shows up too
            keep.add("cand1", cand.results(got))
            # the inputs as the check call left them, which the judge compares with the ones it drew
            keep.add("in", {s["name"]: last.tensors[s["name"]] for s in last.spec if s["role"] in ("input", "inout")})
            shared = keep.result(req["out"], {})
            timer.phase_s["check_call"] = time.perf_counter() - t0
            workload = None
            if callable(getattr(cand.ref, "workload_model", None)):
                try:
                    workload = {k: float(v) for k, v in dict(cand.ref.workload_model(**cand.dims)).items()}
                except Exception as exc:
                    raise HarnessError("contract", f"{req['ref']}: workload_model(**dims) raised "
                                       f"{type(exc).__name__}: {exc}") from exc
            return {**result, **shared, "workload": workload, "spec": cand.inputs.spec,
                    "returned": sorted(got), "cupti": cupti,
                    "scalars": _scalars(cand.inputs), "gpu": torch.cuda.get_device_name(0),
                    "gpu_uuid": device_uuid(torch), "phase_s": timer.phase_s}

        timer.info = {"spec": cand.inputs.spec, "scalars": _scalars(cand.inputs)}
        return timer, finish

    return timed(req, prepare, warm)


def mode_time_reference(req: dict[str, Any]) -> dict[str, Any]:
    """Time ``reference(**kwargs)`` in its own process the same way the candidate is timed (so a candidate cannot
    slow it down to inflate its speedup)."""
    import torch

    def prepare(_: None) -> tuple[Timer, Callable[[dict[str, Any]], dict[str, Any]]]:
        ref = load_reference(req["ref"], req.get("seed"), req.get("ref_sha"), req.get("precision"))
        dims = req["dims"]
        check_spec(ref, req["spec"], dims, req["ref"])
        first = Inputs(torch, req["spec"], trusted_scalars(ref, req), "cuda")
        first.fill(req["plan"], int(req["seed"]), ref, dims, {})
        t = req["timing"]
        sets = rotating_sets(torch, first, req["plan"], int(req["seed"]), ref, dims, {}, t)

        def launch(s: Inputs) -> None:
            ref.reference(**s.kwargs())

        def refresh(s: Inputs, k: int) -> None:
            s.fill(req["plan"], int(req["seed"]) + 104729 * (k + 1), ref, dims, {})

        timer = make_timer(torch, sets, launch, refresh, t)

        def finish(result: dict[str, Any]) -> dict[str, Any]:
            # the reference's kernel-only time too, so a speedup compares like with like
            t0 = time.perf_counter()
            med_ms = statistics.median(result["event_ms"]) if result.get("event_ms") else 1.0
            cupti = cupti_samples(timer, med_ms, call_wall_ms(timer))
            timer.phase_s["cupti"] = time.perf_counter() - t0
            return {**result, "cupti": cupti}

        return timer, finish

    return timed(req, prepare)


def mode_peaks(req: dict[str, Any]) -> dict[str, Any]:
    """Measured ceilings of this GPU: device-to-device copy bandwidth (bytes read + written per s, 1 GiB copy) and
    dense matmul rates (bf16 8192^3 and fp32 without TF32, 4096^3), each the median of 10 event-timed runs."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False

    def med(fn: Callable[[], Any], reps: int = 10) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        out = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b) / 1e3)
        return statistics.median(out)

    n = 2**28  # 1 GiB of fp32
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    copy_s = med(lambda: dst.copy_(src))
    src = dst = None  # free the 2 GiB before the matmuls
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    bf16_s = med(lambda: x @ x)
    y = torch.randn(4096, 4096, device="cuda")
    fp32_s = med(lambda: y @ y)
    return {"dram_bytes_per_s": 2 * 4 * n / copy_s, "bf16_flops": 2 * 8192**3 / bf16_s,
            "fp32_flops": 2 * 4096**3 / fp32_s, "gpu": torch.cuda.get_device_name(0),
            "method": "torch copy 1 GiB (read+write), bf16 8192^3 and fp32 (no TF32) 4096^3 matmul, median of 10"}
