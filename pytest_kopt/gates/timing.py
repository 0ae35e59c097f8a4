"""The ``timing`` gate: the kernel and its reference (and a PR gate's baseline) timed in alternating rounds, each
in its own warm harness process; the statistics, the sanity checks and ``bench.json``. Also the re-timing the
loop's decisions use, and the GPU's measured peaks."""

from __future__ import annotations

import dataclasses
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from .. import stats
from ..artifacts import Bench, read_dict, write_json
from ..errors import HardwareError, IncorrectError, KernelRuntimeError, KoptError, TimingError
from ..settings import dims_label
from .build import built, ensure_built
from .context import Context, Outcome
from .correctness import check_report, judge_request, require_correct, verdict_from
from .gpus import same_device
from .request import harness_request
from .trust import digest, local_sources

#: Timing policy: warmup 100 ms of wall time; then samples until the median's relative standard error is under
#: 0.5% (nvbench's default noise target) with at least 10 samples and 0.2 s, or 2 s / 2000 samples; up to 8
#: rotating input sets within ``--kopt-rotating-memory`` (a quarter by default) of the free device memory.
TIMING = {"warmup_ms": 100.0, "min_samples": 10, "min_time_s": 0.2, "budget_s": 2.0, "max_samples": 2000,
          "target_rse": 0.005, "max_sets": 8, "mem_fraction": 0.25}
#: Calls per CUDA graph in ``--kopt-timing graph`` (each after its own L2 flush).
GRAPH_CALLS = 20
#: Seconds of samples one party takes per round of an interleaved measurement (candidate vs reference).
ROUND_S = 0.05
#: ms per µs: CUPTI spans come in µs.
_US = 1e-3
#: A kernel-only median under (the event median - 20 µs) / 1.5 is SUSPECT: calls that do their work when not profiled
#: only. Honest calls differ by launch gaps and the flush's tail: 2.5 to 3 µs on an H200 (events/span 2.795 at
#: 1.41 µs, 1.061 at 43.7 µs, 1.049 at 60.3 µs; timing_fidelity.py, 2026-12-03).
EVENTS_OVER_KERNEL = 1.5
EVENTS_GAP_MS = 0.020

Party = tuple[dict[str, Any], "str | None", str]  # (request, warm server identity, display path)


def timing_policy(ctx: Context) -> dict[str, Any]:
    """The timing policy a request carries: :data:`TIMING` with the session's method and memory fraction."""
    return {**TIMING, "method": ctx.settings.timing_method, "graph_calls": GRAPH_CALLS,
            "mem_fraction": ctx.settings.rotating_memory,
            # a .cu solve() launches on the legacy default stream: a capture on torch's capture stream would run
            # it eagerly instead of recording it, so its graph mode queues the pairs
            "capture": ctx.kind != "cuda"}


def timing_request(ctx: Context, device: str) -> dict[str, Any]:
    """A timing request for ``ctx``'s kernel (first validation seed's plan), its build made or reused."""
    return harness_request(ctx, "timing", device, ctx.settings.seeds[0], ensure_built(ctx),
                           timing=timing_policy(ctx))


class Rounds:
    """Alternating timing rounds of several parties, each in its own process: a first round of 3 samples each, then
    rounds of about :data:`ROUND_S` per party until every party's stopping rule is met (or 4x the timing budget +
    30 s), then each party's final result. The caller holds the GPU lock around all of it."""

    def __init__(self, ctx: Context, parties: list[Party]) -> None:
        self.ctx, self.parties = ctx, parties
        self.key = uuid.uuid4().hex
        self.timeout = max(ctx.settings.gate_timeout_s, 120.0)
        self.last: list[dict[str, Any]] = []

    def run(self, i: int, count: int, final: bool = False) -> dict[str, Any]:
        """One round of ``count`` samples of party ``i`` (``final``: end it and return its whole result)."""
        r, server, path = self.parties[i]
        return self.ctx.pool.run({**r, "round": {"key": f"{self.key}-{i}", "count": count, "final": final}},
                                 gate="timing", timeout_s=self.timeout, path=path, workdir=self.ctx.work,
                                 server=server)

    def start(self, i: int) -> dict[str, Any]:
        """Party ``i``'s first round (3 samples); kept as its latest."""
        self.last.append(self.run(i, 3))
        return self.last[-1]

    def finish(self) -> list[dict[str, Any]]:
        """Rounds until every party has stopped, then each party's final result, in party order."""
        t0 = time.monotonic()
        cap = 4 * TIMING["budget_s"] + 30.0
        while any(r["stop_reason"] is None for r in self.last) and time.monotonic() - t0 < cap:
            for i in range(len(self.parties)):
                if self.last[i]["stop_reason"] is None:
                    per = max(self.last[i]["sample_wall_s"], 1e-6)
                    self.last[i] = self.run(i, int(min(500, max(1, ROUND_S / per))))
        return [self.run(i, 0, final=True) for i in range(len(self.parties))]


def ready_for_timing(ctx: Context, parties: list[Party]) -> None:
    """Each warm timing process of ``parties`` started and its CUPTI warm-up done (a ``ready`` request), before the
    GPU lock is taken: a process still importing torch or warming the profiler up (seconds) would otherwise hold
    the lock while other workers' correctness seeds wait behind it. Only processes that have served nothing yet are
    asked (a process that has is warm, and a kernel's code that ran in it must not run again outside the lock:
    its process is stopped between requests, and ``ready`` would let what it left running run); fresh processes
    (identity None) are skipped. Raises the harness's errors."""
    for preq, identity, display in parties:
        env = dict(preq.get("env") or {})
        if identity is not None and not ctx.pool.served(identity, env):
            ctx.pool.run({"mode": "ready", "device": preq.get("device", "cuda"), "env": env},
                         gate="timing", timeout_s=max(ctx.settings.gate_timeout_s, 120.0), path=display,
                         workdir=ctx.work, server=identity)


def interleaved(ctx: Context, req: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """Candidate and reference (and, for the PR gate, the baseline kernel) timed in alternating rounds, each in its
    own warm process, so a drift of clocks or temperature during the measurement hits all of them and the ratios'
    CIs stay honest. Returns (candidate result, reference result, baseline result or None) as the one-shot timing
    modes do. The reference is prepared on the candidate's spec, which the candidate's first round returns (its
    process checks it against ``ref.shapes()``)."""
    parties: list[Party] = [(req, ctx.server("candidate"), ctx.display)]
    ready_for_timing(ctx, [(req, ctx.server("candidate"), ctx.display),
                           ({"device": req["device"], "env": {}}, ctx.server("reference"), str(ctx.ref))])
    rounds = Rounds(ctx, parties)
    # one hold of the GPU lock for every round: taken per round, another worker's correctness seed (seconds at
    # 4096^3) could slip in between 50 ms rounds, and the rounds would spend their time cap waiting for the lock
    with ctx.device_lock(req["device"]):
        first = rounds.start(0)
        rreq = {**req, "mode": "time_reference", "spec": first["spec"], "scalars": first.get("scalars", {}),
                "env": {}}
        parties.append((rreq, ctx.server("reference"), str(ctx.ref)))
        rounds.start(1)
        base = ctx.settings.baseline
        if ctx.settings.pr_gate and base is not None and Path(base).resolve() != ctx.kernel:
            bctx = dataclasses.replace(ctx, kernel=Path(base).resolve(), display=str(base))
            try:
                breq: dict[str, Any] | None = timing_request(bctx, req["device"])
            except KoptError:
                breq = None  # the baseline's own items report it; the PR gate falls back to its timing gate
            if breq is not None:
                parties.append((breq, bctx.server("candidate"), bctx.display))
                rounds.start(2)
        finals = rounds.finish()
    if len(finals) > 2 and finals[2].get("npz"):
        Path(finals[2]["npz"]).unlink(missing_ok=True)
    return finals[0], finals[1], finals[2] if len(finals) > 2 else None


def retime_interleaved(ctxs: list[Context]) -> list[dict[str, Any]]:
    """Re-time kernels that a decision compares (the loop's finalists and ablations) in alternating rounds on this
    process's GPU, each in its own warm process, so clock or temperature drift, and the differences between two
    GPUs of one model, hit them all alike. ``ctxs``: built, correct kernels of one session. Returns, per kernel,
    ``{"median_ms", "samples_ms", "stop_reason", "gpu_uuid"}`` (ms). Raises the harness's errors
    (:class:`~pytest_kopt.errors.KoptError`: a kernel that no longer builds, crashes or times out). Outputs are not
    judged again: each kernel passed its correctness seeds and timed-output check earlier in the session. The samples
    are every kernel's kernel-only (CUPTI) spans under ``--kopt-timing cupti`` when each kernel has them, else the
    CUDA event samples (``timing_basis``)."""
    parties: list[Party] = []
    for c in ctxs:
        r = timing_request(c, "cuda")
        parties.append((r, c.server("candidate"), c.display))
        c.pool.prestart(c.server("candidate"), dict(r["env"]), c.work)  # the processes' starts overlap
    ready_for_timing(ctxs[0], parties)
    rounds = Rounds(ctxs[0], parties)
    with ctxs[0].gpu_lock():
        for i in range(len(parties)):
            rounds.start(i)
        finals = rounds.finish()
    # one basis for every kernel of the decision: the kernel-only spans when each has them (the timing gate's
    # default), else the events
    spans = [(f.get("cupti") or {}).get("spans_us") for f in finals]
    cupti = ctxs[0].settings.timing_method == "cupti" and all(spans)
    out = []
    for f, sp in zip(finals, spans):
        if f.get("npz"):
            Path(f["npz"]).unlink(missing_ok=True)
        samples = [x * _US for x in sp] if cupti and sp else f["event_ms"]
        out.append({"median_ms": stats.median(samples), "samples_ms": samples,
                    "timing_basis": "cupti" if cupti else f.get("method", "events"),
                    "stop_reason": f["stop_reason"], "gpu_uuid": f.get("gpu_uuid")})
    return out


def reference_timing(ctx: Context, req: dict[str, Any], cand: dict[str, Any]) -> dict[str, Any]:
    """The reference timed in its own process on the candidate's spec (``--kopt-fresh-process``, where no rounds
    alternate): shared through the session's signed cache per (reference, spec, dims, GPU), so a session's
    candidates share one measurement of it. Returns ``{"event_ms", "stop_reason", "cupti"}``."""
    key = digest("time", local_sources(ctx.ref), cand["spec"], cand.get("scalars"), req["plan"], req["seed"],
                 req["dims"], (ctx.env.get("gpu") or {}).get("uuid"), TIMING)

    def compute() -> tuple[dict[str, Any], None]:
        rreq = {**req, "mode": "time_reference", "spec": cand["spec"], "scalars": cand.get("scalars", {}), "env": {}}
        result = ctx.pool.run(rreq, gate="timing", timeout_s=max(ctx.settings.gate_timeout_s, 120.0),
                              path=str(ctx.ref), workdir=ctx.work, lock=ctx.gpu_lock(),
                              server=ctx.server("reference"))
        return {"event_ms": result["event_ms"], "stop_reason": result["stop_reason"],
                "cupti": result.get("cupti")}, None

    payload, _, _ = ctx.trust.cached(ctx.cache_dir / "refs", f"{key}.timing", compute, gate="timing",
                                     display=ctx.display)
    return payload


def device_peaks(ctx: Context) -> dict[str, Any] | None:
    """Measured ceilings of this GPU (copy bandwidth, bf16/fp32 matmul FLOP/s), measured once and kept per GPU UUID
    under ``<cache>/peaks/`` across sessions, unsigned (measuring costs seconds; a planted file could only move the
    roofline floor of the SUSPECT check, which a run on a clean cache restores). None without a GPU."""
    gpu = ctx.env.get("gpu")
    if not gpu:
        return None

    def compute() -> tuple[dict[str, Any], None]:
        # in the reference's warm process (torch imported, its context made): a fresh process costs ~5 s to start
        ready_for_timing(ctx, [({"device": "cuda", "env": {}}, ctx.server("reference"), str(ctx.ref))])
        with ctx.gpu_lock():
            result = ctx.pool.run({"mode": "peaks"}, gate="timing", timeout_s=300.0,
                                  path=ctx.display, workdir=ctx.work, server=ctx.server("reference"))
        return {k: result[k] for k in ("dram_bytes_per_s", "bf16_flops", "fp32_flops", "gpu", "method")}, None

    payload, _, _ = ctx.trust.cached(ctx.cache_dir / "peaks", gpu["uuid"], compute, signed=False, gate="timing",
                                     display=ctx.display)
    return payload


def race_safe(ctx: Context) -> bool | None:
    """SKILL.md's ``race_safe``: from this session's racecheck record, None when racecheck did not run."""
    if "racecheck" not in ctx.settings.sanitizer:
        return None
    rec = read_dict(ctx.outdir / "sanitizer_racecheck.json")
    errors = (rec or {}).get("errors")
    return None if errors is None else errors == 0


def bench_head(ctx: Context, result: dict[str, Any]) -> dict[str, Any]:
    """The fields every ``bench.json`` starts with: the kernel, its dims, arch, the GPU that timed it (name and UUID
    as the timed process reported them, the session's index of it) and SKILL.md's pass flags of the earlier
    gates; ``autotune``: per ``@triton.autotune`` kernel, the config the build pinned and every gate ran."""
    return {"kernel": str(ctx.kernel), "dims": ctx.settings.dims, "requested_dims": ctx.settings.dims,
            "realized_dims": ctx.settings.dims, "arch": ctx.arch, "gpu": result.get("gpu"),
            "gpu_uuid": result.get("gpu_uuid"), "gpu_index": (ctx.env.get("gpu") or {}).get("index"),
            "compile_pass": True, "contract_pass": True, "correctness_pass": True,
            "autotune": {name: c["config"] for name, c in built(ctx).autotune.items()} if ctx.kind == "triton" else {}}


def _timed_output_check(ctx: Context, req: dict[str, Any], result: dict[str, Any]) -> Any:
    """The judge, in the reference's process, on the timed process's check call: the reference on that call's
    inputs, the verdict on its outputs (:func:`pytest_kopt.child.correctness.mode_check_timed`). Raises
    KernelRuntimeError when the timed process handed over no outputs (or none the judge could read)."""
    check_report(ctx, result, req, "timing")
    try:
        judged = judge_request(ctx, req, result, mode="check_timed")
    finally:
        if result.get("npz") and Path(result["npz"]).is_file():
            Path(result["npz"]).unlink(missing_ok=True)
    if judged.get("unreadable") or judged.get("missing") or judged.get("verdict") is None:
        what = judged.get("unreadable") or ", ".join(judged.get("missing") or []) or "outputs"
        raise KernelRuntimeError(f"the timed call's process returned no {what}", gate="timing", path=ctx.display,
                                 fix="the kernel must not touch the harness (its modules, files or pipes)")
    return verdict_from(judged["verdict"])


def _measure(ctx: Context, req: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None,
                                                         dict[str, Any] | None, Any]:
    """One measurement: (the candidate's result, the reference's, the PR baseline's, the timed-output verdict).
    The candidate's result gains ``gate_phase_s``: the wall seconds of the measurement and of the output check, as
    the pytest process saw them (lock waits included)."""
    ref_result: dict[str, Any] | None = None
    base_result: dict[str, Any] | None = None
    t0 = time.perf_counter()
    if ctx.settings.fresh_process:
        result = ctx.pool.run(req, gate="timing", timeout_s=max(ctx.settings.gate_timeout_s, 120.0),
                              path=ctx.display, workdir=ctx.work, lock=ctx.gpu_lock())
    else:
        result, ref_result, base_result = interleaved(ctx, req)
    t1 = time.perf_counter()
    verdict = _timed_output_check(ctx, req, result)
    result["gate_phase_s"] = {"measure": round(t1 - t0, 3), "output_check": round(time.perf_counter() - t1, 3)}
    return result, ref_result, base_result, verdict


#: Share of samples whose launch call took longer on the host than the stream hold, from which the host's own time
#: is taken to be inside the timed window (the GPU idles waiting for the rest of the launches).
HOST_BOUND_SHARE = 0.10
#: Share of throttled samples from which clocks are named as a cause.
THROTTLED_SHARE = 0.10


def unstable_causes(result: dict[str, Any]) -> dict[str, Any]:
    """Why an events-method timing is unstable, from what the timed process recorded: host work inside the call (a
    launch whose host time exceeded the stream hold in at least :data:`HOST_BOUND_SHARE` of the samples: the GPU
    waited for the host inside the window), other processes with a context on the GPU (NVML), throttled clocks.
    Returns ``{"causes": [sentences], "remedy": what a second measurement changes ("" for nothing), "hold_us": the
    hold for it (2 x the 90th percentile of the launches' host time + 20 µs), "wait_s": seconds to wait first}``."""
    causes: list[str] = []
    remedy: list[str] = []
    hold_us = float(result.get("hold_us") or 0)
    wait_s = 0.0
    launches = [x for x in (result.get("launch_host_us") or []) if x is not None]
    if launches:
        p90 = stats.quantile(launches, 0.9)
        over = sum(x > hold_us for x in launches) / len(launches)
        if over >= HOST_BOUND_SHARE:
            causes.append(f"host work inside the timed call: its launch took {stats.quantile(launches, 0.5):.0f} µs "
                          f"(p90 {p90:.0f} µs) on the host, longer than the {hold_us:.0f} µs stream hold in "
                          f"{over:.0%} of the samples, so the GPU waited for the host inside the window")
            remedy.append(f"with a {2 * p90 + 20:.0f} µs hold")
            hold_us = 2 * p90 + 20
    others = result.get("gpu_processes") or []
    if others:
        causes.append(f"{len(others)} other process(es) hold a context on this GPU (pids "
                      f"{', '.join(str(o['pid']) for o in others[:5])})")
        remedy.append("after 2 s")
        wait_s = 2.0
    throttled = result.get("throttled") or []
    if throttled and sum(throttled) / len(throttled) >= THROTTLED_SHARE:
        causes.append(f"{sum(throttled)} of {len(throttled)} samples ran at throttled clocks (power/thermal "
                      "slowdown or an SM clock under 75% of its maximum)")
    return {"causes": causes, "remedy": " and ".join(remedy), "hold_us": hold_us, "wait_s": wait_s}


def timing_cases(ctx: Context) -> list[tuple[str, Any]]:
    """One timing item for one benchmark shape (no case: ``timing``); with several, one per shape
    (``timing[M=4096,N=1024]``, the case is its dims)."""
    shapes = ctx.benchmarks
    if len(shapes) < 2:
        return [("", None)]
    return [(dims_label(d), dict(d)) for d in shapes]


def gate_timing(ctx: Context, case: Any = None) -> Outcome:
    """Time the kernel and (in its own process) the reference: rotating input sets with fresh values, L2 flushed
    before every call, adaptive stopping on the median's standard error, NVML clocks. Writes ``bench.json`` with
    SKILL.md's fields. Fails with UNSTABLE_TIMING (robust CV > 0.10), SUSPECT (under the roofline floor from the
    measured peaks, or host clock far beyond the event time: work on another stream), or the guard status of the
    timed-output check (a timed call's output is checked against the reference in another process).

    ``case``: one of several benchmark shapes (its dims). That shape's ``bench.json`` goes to
    ``shapes/<M=..,N=..>/``, and the kernel's own ``bench.json`` becomes their summary (:func:`shapes_summary`):
    ``median_ms`` the geometric mean of the shapes' medians, ``speedup_vs_ref`` the geometric mean of their
    speedups with a bootstrap CI."""
    device = ctx.device_for("timing")
    res = built(ctx)
    require_correct(ctx, res, device)
    if device == "cuda":
        from .ncu import profile_ahead

        try:
            profile_ahead(ctx)  # the estimate's set only; its kernels wait for the ncu item's turn
        except (OSError, KoptError):
            pass  # the ncu item starts its own
    if case is None:
        return _time_shape(ctx, res, device)
    try:
        outcome = _time_shape(ctx.at(case), res, device)
    finally:
        shapes_summary(ctx)
    return outcome


def profiled_shape(ctx: Context) -> tuple[dict[str, Any] | None, Bench | None]:
    """The shape ncu and the roofline work on, and its timing: with several benchmark shapes the first one (its
    dims, its own ``shapes/<label>/bench.json``), else (None, the kernel's ``bench.json``)."""
    if len(ctx.benchmarks) < 2:
        return None, Bench.load(ctx.outdir)
    first = dict(ctx.benchmarks[0])
    return first, Bench.load(ctx.at(first).outdir)


def shapes_summary(ctx: Context) -> dict[str, Any]:
    """Write (and return) the kernel's ``bench.json`` over its benchmark shapes from each shape's own
    ``shapes/<label>/bench.json``: ``shapes`` (dims, label, median_ms, speedup_vs_ref, timing_valid, path per
    shape), ``median_ms`` (geometric mean of the medians, ms; None until every shape has valid timing),
    ``speedup_vs_ref`` and ``speedup_ci95`` (geometric mean over shapes, bootstrap CI), ``samples_ms`` [] (each
    shape has its own), ``timing_valid`` (every shape timed and valid)."""
    rows, pairs, medians = [], [], []
    for dims in ctx.benchmarks:
        folder = ctx.at(dims).outdir
        b = Bench.load(folder)
        rows.append({"dims": dims, "label": dims_label(dims), "path": str(folder / "bench.json"),
                     "timing_valid": bool(b and b.timing_valid), "median_ms": b.median_ms if b else None,
                     "speedup_vs_ref": (b.doc.get("speedup_vs_ref") if b else None)})
        if b and b.valid_samples:
            medians.append(b.median_ms)
            ref = (b.doc.get("reference") or {}).get("samples_ms")
            if ref:
                pairs.append((ref, b.valid_samples))
    valid = all(r["timing_valid"] for r in rows)
    doc: dict[str, Any] = {"kernel": str(ctx.kernel), "dims": ctx.settings.dims, "arch": ctx.arch, "shapes": rows,
                           "geomean_over": len(rows), "timing_valid": valid, "samples_ms": [],
                           "median_ms": stats.geomean(medians) if valid and medians else None,
                           "speedup_vs_ref": None, "speedup_ci95": None}
    if valid and len(pairs) == len(rows):
        sp, lo, hi = stats.bootstrap_geomean_ratio_ci(pairs)
        doc.update(speedup_vs_ref=sp, speedup_ci95=[lo, hi])
    first = Bench.load(ctx.at(ctx.benchmarks[0]).outdir)
    if first is not None:  # what the loop and the reports read besides the figures: the first shape's
        doc.update({k: first.doc.get(k) for k in ("gpu", "gpu_uuid", "gpu_index", "compile_pass", "contract_pass",
                                                   "correctness_pass", "autotune", "race_safe", "seeds")})
    write_json(ctx.outdir / "bench.json", doc)
    return doc


def timing_basis(ctx: Context, result: dict[str, Any], ref_result: dict[str, Any],
                 base_result: dict[str, Any] | None = None) -> dict[str, Any]:
    """Which samples a timing reports and every decision reads, and why. ``--kopt-timing cupti`` (the default):
    the kernel-only spans from CUPTI (:func:`pytest_kopt.child.timer.cupti_samples`) of the kernel, its reference
    and a PR gate's baseline alike, so no ratio mixes two clocks; CUDA events for all of them when the profiler
    gave any party none (``note`` says why). ``events``/``graph``: those samples. Returns ``{"basis", "kernel",
    "reference", "baseline" (ms lists; baseline None without one), "note"}``. A candidate whose profiled calls
    launched nothing gets an empty ``kernel`` list under ``cupti``: it is caught, never timed by events instead."""
    events = {"basis": result.get("method", "events"),
              "kernel": result["event_ms"], "reference": ref_result["event_ms"],
              "baseline": base_result["event_ms"] if base_result else None, "note": None}
    if ctx.settings.timing_method != "cupti":
        return events
    cupti = result.get("cupti") or {}
    if not cupti.get("spans_us") and cupti.get("empty_calls"):
        return {**events, "basis": "cupti", "kernel": [], "note": "the profiled calls launched no GPU work"}
    parties = [("kernel", result), ("reference", ref_result)] + ([("baseline", base_result)] if base_result else [])
    missing = [(who, (p.get("cupti") or {}).get("error") or "no CUPTI pass") for who, p in parties
               if not (p.get("cupti") or {}).get("spans_us")]
    if missing:
        return {**events, "note": "timed by CUDA events: CUPTI gave no kernel-only samples for the " + "; ".join(
            f"{who} ({why[:120]})" for who, why in missing)}
    spans = {who: [x * _US for x in p["cupti"]["spans_us"]] for who, p in parties}
    return {"basis": "cupti", "kernel": spans["kernel"], "reference": spans["reference"],
            "baseline": spans.get("baseline"), "note": None}


def cupti_suspects(cupti: dict[str, Any]) -> list[tuple[str, str]]:
    """What the kernel-only records say of a call that does not do its work every time: calls that launched no GPU
    work, or calls that launched different kernels (by the sorted list of kernel names) from one call to the next.
    Returns (finding, fix) pairs."""
    out: list[tuple[str, str]] = []
    empty, calls = int(cupti.get("empty_calls") or 0), int(cupti.get("calls") or 0)
    if empty:
        out.append((f"{empty} of {empty + calls} profiled calls launched no GPU work (a result computed once and "
                    "replayed, or work skipped on some calls)",
                    "launch the kernel's work on every call; a call that does no GPU work has no kernel time"))
    sets = cupti.get("launch_sets") or []
    if len(sets) > 1:
        shown = "; ".join(f"{', '.join(d['kernels'])[:120] or 'nothing'} in {d['calls']} call(s)" for d in sets[:3])
        out.append((f"the calls launched different kernels from call to call ({shown})",
                    "launch the same work on every call; if the work truly depends on the input values, time it "
                    "with --kopt-timing events"))
    return out


def _time_shape(ctx: Context, res: Any, device: str) -> Outcome:
    t_peaks = time.perf_counter()
    peaks = device_peaks(ctx)
    t_peaks = time.perf_counter() - t_peaks
    req = harness_request(ctx, "timing", device, ctx.settings.seeds[0], res, timing=timing_policy(ctx))
    result, ref_result, base_result, verdict = _measure(ctx, req)
    if ref_result is None:
        ref_result = reference_timing(ctx, req, result)
    basis = timing_basis(ctx, result, ref_result, base_result)
    first_attempt: dict[str, Any] | None = None
    k0 = stats.describe(basis["kernel"]) if verdict.ok and basis["kernel"] and \
        statistics.median(basis["kernel"]) > 0 else None
    if k0 is not None and k0.stability == "unstable" and result.get("method") != "graph":
        # before failing, find out why; where a cause can be taken out of the measurement, measure once more
        causes = unstable_causes(result)
        first_attempt = {"robust_cv": k0.robust_cv, "median_ms": k0.median_ms, "samples": k0.n,
                         "causes": causes["causes"], "remeasured": causes["remedy"], "basis": basis["basis"]}
        if causes["remedy"]:
            if causes["wait_s"]:
                time.sleep(causes["wait_s"])
            req = {**req, "timing": {**req["timing"], "hold_us": causes["hold_us"]}}
            result, ref_result, base_result, verdict = _measure(ctx, req)
            if ref_result is None:
                ref_result = reference_timing(ctx, req, result)
            basis = timing_basis(ctx, result, ref_result, base_result)
    cupti = result.get("cupti") or {}
    nothing = (basis["basis"] == "cupti" and not basis["kernel"]) or statistics.median(result["event_ms"]) <= 0
    if not verdict.ok or nothing:
        # judged before any statistics: a timed call that did no work (a graph captured empty, a call that launches
        # nothing) has a median of noise around 0, which no distribution describes; the bench.json left says why
        # timing is not valid
        write_json(ctx.outdir / "bench.json", {
            **bench_head(ctx, result), "timing_valid": False, "median_ms": None, "samples_ms": basis["kernel"],
            "event_samples_ms": result["event_ms"], "timing_basis": basis["basis"],
            "timed_output_check": verdict.status, "kernel_time": {"method": "cupti", **cupti} if cupti else None,
            "timing_method": {**req["timing"], "method": result.get("graph_method") or result.get("method")}})
        if not verdict.ok:
            raise IncorrectError(f"a timed call's output is wrong: {verdict.message}", gate="timing",
                                 path=ctx.display, status=verdict.status, details="\n".join(verdict.details),
                                 fix="the kernel behaves differently while timed (cached results, stale pointers)")
        what = ("its profiled calls launched no GPU work (CUPTI recorded no kernel, memset or copy between the "
                "flushes)" if basis["basis"] == "cupti" and not basis["kernel"] else
                f"the timed calls' median is {statistics.median(result['event_ms']) * 1e3:.3f} µs, not above zero")
        raise TimingError(f"{what}: the timed work did nothing measurable", gate="timing", path=ctx.display,
                          status="SUSPECT", fix="the kernel must launch its work on the current stream inside "
                                                "solve()/run_kernel(), on every call and also while a CUDA graph is "
                                                "captured")
    pinned = (ctx.env.get("gpu") or {}).get("uuid") if ctx.env.get("pinned") else None
    if not same_device(result.get("gpu_uuid"), pinned):
        raise HardwareError(f"the timed process ran on {result.get('gpu_uuid')}, not on {pinned}, the GPU this "
                            "worker is pinned to", gate="timing", path=ctx.display,
                            fix="leave CUDA_VISIBLE_DEVICES to pytest-kopt (--kopt-gpus) in the kernel's process")
    k = stats.describe(basis["kernel"])
    r = stats.describe(basis["reference"])
    ke = stats.describe(result["event_ms"])
    host_med = statistics.median(result["host_ms"])
    # expected host time of one un-held call: its launch + the kernel + a synchronise round trip (calibrated);
    # against the event median, the clock the host's own time is comparable with
    gap = host_med - ke.median_ms - result["host_launch_ms"] - result["host_overhead_ms"]
    wm = result.get("workload") or {}
    floor = stats.roofline_floor_ms(wm.get("flops"), wm.get("bytes_min"),
                                    max((peaks or {}).get("bf16_flops") or 0, (peaks or {}).get("fp32_flops") or 0)
                                    or None, (peaks or {}).get("dram_bytes_per_s"))
    throttled = result.get("throttled")
    speedup, sp_lo, sp_hi = stats.bootstrap_ratio_ci(basis["reference"], basis["kernel"])
    # graph samples are differences of two replays: their spread is the flush's, so judge the median's precision
    graph = basis["basis"] == "graph"
    stability = stats.stability_class_rse(k.median_rse, TIMING["min_samples"]) if graph else k.stability
    stat_basis = "median_rse" if graph else "robust_cv"
    figures: dict[str, Any] = {"median_ms": k.median_ms, "mean_ms": k.mean_ms, "min_ms": k.min_ms,
                               "p10_ms": k.p10_ms, "p90_ms": k.p90_ms, "ci95_low_ms": k.ci95_low_ms,
                               "ci95_high_ms": k.ci95_high_ms, "robust_cv": round(k.robust_cv, 5),
                               "median_rse": round(k.median_rse, 5), "stability": stability,
                               "stability_basis": stat_basis, "samples": k.n, "timing_basis": basis["basis"],
                               "events_median_ms": ke.median_ms,
                               "stop_reason": result["stop_reason"], "rotating_sets": result["rotating_sets"],
                               "timing_method": result.get("graph_method") or result.get("method", "events"),
                               "host_gap_ms": gap, "ref_median_ms": r.median_ms, "speedup_vs_ref": speedup,
                               "speedup_ci95_low": sp_lo, "speedup_ci95_high": sp_hi,
                               "gpu_uuid": result.get("gpu_uuid")}  # as the timed process reported it
    if throttled is not None:
        figures["throttled_samples"] = sum(throttled)
    if cupti.get("median_us") is not None:
        figures["cupti_median_ms"] = cupti["median_us"] * _US
    if wm.get("flops") is not None:
        figures["gflops"] = wm["flops"] / (k.median_ms * 1e-3) / 1e9
    if wm.get("bytes_min") is not None:
        figures["gbytes_per_s"] = wm["bytes_min"] / (k.median_ms * 1e-3) / 1e9
    if floor is not None:
        figures["roofline_floor_ms"] = floor
    suspect: list[tuple[str, str]] = []
    if floor is not None and k.median_ms < floor:
        suspect.append((f"median {stats.fmt_ms(k.median_ms)} is under the roofline floor {stats.fmt_ms(floor)} "
                        f"(bytes_min / measured bandwidth, flops / measured peak, each with {stats.FLOOR_HEADROOM:g}x "
                        "headroom)", "check workload_model's flops and bytes_min; synchronise all work inside "
                                     "solve()/run_kernel()"))
    # work outside the timed stream: the host saw the device busy far longer than the events did
    if gap > max(0.02, 0.25 * ke.median_ms):
        suspect.append((f"the host clock (synchronised) saw {stats.fmt_ms(host_med)} per call but CUDA events "
                        f"{stats.fmt_ms(ke.median_ms)} (work on another stream or a background thread?)",
                        "synchronise all work inside solve()/run_kernel(): launch it on the current stream"))
    if basis["basis"] == "cupti" or (ctx.settings.timing_method == "cupti" and cupti.get("spans_us")):
        suspect += cupti_suspects(cupti)
    if basis["basis"] == "cupti" and ke.median_ms > EVENTS_OVER_KERNEL * k.median_ms + EVENTS_GAP_MS:
        # honest calls differ by launch gaps and the flush's tail (2.5 to 3 µs on an H200, EVENTS_OVER_KERNEL)
        suspect.append((f"CUDA events saw {stats.fmt_ms(ke.median_ms)} per call but the kernels' own records "
                        f"{stats.fmt_ms(k.median_ms)} (more than {EVENTS_OVER_KERNEL:g}x + "
                        f"{EVENTS_GAP_MS * 1e3:g} µs): the calls do work the profiled calls did not",
                        "launch the same work whether or not a profiler is attached; move host work out of "
                        "solve()/run_kernel()"))
    ref_cupti = ref_result.get("cupti") or {}
    if ctx.settings.timing_method == "cupti" and basis["basis"] == "events" and cupti.get("error") \
            and ref_cupti.get("spans_us"):
        suspect.append((f"the profiler recorded the reference's calls but not the kernel's ({cupti['error'][:160]})",
                        "leave the profiler alone in solve()/run_kernel(); --kopt-timing events times without it"))
    timing_valid = stability != "unstable" and not suspect
    dist = {f: getattr(k, f) for f in k.__dataclass_fields__}
    clock = {"cupti": "cupti_kernel_span", "graph": "cuda_graph_events"}.get(basis["basis"], "cuda_events")
    bench = {**bench_head(ctx, result), "race_safe": race_safe(ctx), "timing_valid": timing_valid,
             "average_ms": k.mean_ms, "median_ms": k.median_ms, "timing_basis": basis["basis"],
             "timing_basis_note": basis["note"],
             "robust_cv": k.robust_cv, "stability": stability, "stability_basis": stat_basis, "distribution": dist,
             "samples_ms": basis["kernel"], "event_samples_ms": result["event_ms"],
             "events": {f: getattr(ke, f) for f in ke.__dataclass_fields__},
             "host_ms": result["host_ms"], "throttled": throttled,
             "nvml": result.get("nvml"), "stop_reason": result["stop_reason"],
             "reference": {**{f: getattr(r, f) for f in r.__dataclass_fields__}, "samples_ms": basis["reference"],
                           "event_samples_ms": ref_result["event_ms"]},
             "speedup_vs_ref": speedup, "speedup_ci95": [sp_lo, sp_hi], "workload": wm or None,
             "gflops": figures.get("gflops"), "gbytes_per_s": figures.get("gbytes_per_s"),
             "roofline_floor_ms": floor, "peaks": peaks, "suspect": [text for text, _ in suspect],
             "timed_output_check": verdict.status,
             "timing_method": {**req["timing"], "clock": clock, "l2_flush_bytes": result.get("flush_bytes"),
                               "rotating_sets": result["rotating_sets"], "fresh_values_every_call": True,
                               "graph_method": result.get("graph_method"), "graph_note": result.get("graph_note"),
                               "graph_hold": result.get("graph_hold"),
                               "interleaved_with_reference": not ctx.settings.fresh_process},
             "seeds": list(ctx.settings.seeds), "timing_seed": ctx.settings.seeds[0],
             # the kernels' own execution span from CUPTI activity records (child/timer.cupti_samples): the basis by
             # default; beside it the event time, which also holds launch gaps and the flush's tail
             "kernel_time": {"method": "cupti", **{k2: v for k2, v in cupti.items() if k2 != "spans_us"}}
             if cupti else None}
    # where the item's wall time went (s): the GPU's peaks (cached after the first session), the measurement and
    # the output check as this process saw them, and each timed process's own phases
    bench["phase_s"] = {"peaks": round(t_peaks, 3), **result.get("gate_phase_s", {}),
                        "candidate": {k2: round(v, 3) for k2, v in (result.get("phase_s") or {}).items()},
                        "reference": {k2: round(v, 3) for k2, v in (ref_result.get("phase_s") or {}).items()}}
    if first_attempt is not None:  # an unstable first measurement, its causes and what was done about them
        bench["first_attempt"] = first_attempt
    if base_result is not None:  # the PR gate's baseline, timed in the same rounds as this kernel
        bench["pr_baseline"] = {"kernel": str(ctx.settings.baseline), "samples_ms": basis["baseline"],
                                "event_samples_ms": base_result["event_ms"], "timing_basis": basis["basis"],
                                "stop_reason": base_result["stop_reason"]}
    path = write_json(ctx.outdir / "bench.json", bench)
    if suspect:
        raise TimingError("; ".join(text for text, _ in suspect), gate="timing", path=ctx.display, status="SUSPECT",
                          fix="; ".join(dict.fromkeys(fix for _, fix in suspect)))
    ms = stats.fmt_ms
    if stability == "unstable":
        what = (f"the median's relative standard error {k.median_rse:.1%} > 4.0% (graph samples, robust CV "
                f"{k.robust_cv:.3f})" if graph else f"robust CV {k.robust_cv:.3f} > 0.10")
        why = unstable_causes(result)["causes"] if not graph else []
        again = f" (measured twice: {first_attempt['remeasured']})" if first_attempt and first_attempt["remeasured"] \
            else ""
        raise TimingError(f"timing is unstable: {what} over {k.n} {basis['basis']} samples (median "
                          f"{ms(k.median_ms)}){again}; why: {'; '.join(why) or 'no cause found'}", gate="timing",
                          path=ctx.display,
                          fix="make sure nothing else runs on the GPU; keep host work (allocations, copies, "
                              "synchronisations) out of solve()/run_kernel(); a kernel of a few µs needs more "
                              "samples or --kopt-timing graph")
    extra = f", {figures['gflops']:.1f} GFLOP/s" if "gflops" in figures else ""
    if first_attempt is not None:
        figures["first_attempt_robust_cv"] = round(first_attempt["robust_cv"], 5)
        extra += (f"; the first measurement was unstable (robust CV {first_attempt['robust_cv']:.3f}: "
                  f"{'; '.join(first_attempt['causes'])}), measured again {first_attempt['remeasured']}")
    if throttled:
        extra += f", {sum(throttled)} throttled samples"
    if basis["basis"] == "cupti":
        extra += f"; CUDA events {ms(ke.median_ms)}"
    elif cupti.get("median_us") is not None:
        extra += f"; kernel-only (CUPTI) {ms(cupti['median_us'] * _US)}"
    if basis["note"]:
        extra += f"; {basis['note']}"
    elif cupti.get("error") and basis["basis"] != "cupti":
        extra += f"; no CUPTI time ({cupti['error'][:80]})"
    what = {"cupti": "kernel-only (CUPTI)", "graph": "graph", "events": "events"}.get(basis["basis"], basis["basis"])
    return Outcome(figures, f"median {ms(k.median_ms)} [{ms(k.ci95_low_ms)}, {ms(k.ci95_high_ms)}] {what} "
                            f"(robust CV {k.robust_cv:.3f}, {stability}, n={k.n}, {result['stop_reason']}), "
                            f"reference {ms(r.median_ms)}, speedup {speedup:.2f}x [{sp_lo:.2f}, {sp_hi:.2f}]"
                            f"{extra}", (str(path),))
