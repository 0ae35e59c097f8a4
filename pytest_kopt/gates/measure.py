"""How the timing gate measures: the timing policy, alternating rounds of several parties each in its own warm
harness process (:class:`Rounds`), the kernel against its reference (:func:`interleaved`, :func:`measure_shape`, a
second measurement after an unstable first one), the loop's re-timing, the reference timed alone, the GPU's measured
peaks, the timed output's check, and which samples a timing reports (:func:`timing_basis`)."""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import stats
from ..artifacts import Basis, FirstAttempt, TimedRun
from ..errors import KernelRuntimeError, KoptError, TimingError
from .build import ensure_built
from .context import Context
from .correctness import check_report, judge_request, verdict_from
from .leaks import ProcessMemory
from .request import harness_request
from .suspects import host_inside_ms, host_work, unstable_causes
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
#: Seconds of samples per round of a party timed alone (a loop's close times each branch without its reference):
#: half the policy's minimum sampling time, so two rounds after the first reach it and the LEAK check has its three
#: readings (``gates/leaks.py`` ``MIN_READINGS``). Its rounds alternate with no one, and every round is a request
#: to its process with two NVML process-list reads: 50 ms rounds made 221 round trips in a close of 32 branches at
#: 1024^3, 13.5 ms each above the samples (H100, 2026-12-07, docs/loop.md).
SOLO_ROUND_S = TIMING["min_time_s"] / 2
#: Wall seconds the alternating rounds of one measurement may run before the parties still sampling are ended
#: (``stop_reason`` ``capped``): for a kernel of one benchmark shape 4x the timing budget + 30 s; a kernel of n
#: shapes shares that among them, each shape at least :data:`SHAPE_ROUNDS_MIN_S` (each party's own stopping rule
#: needs at most its 2 s budget of samples, so a shape whose rounds run longer spends the rest on round trips and
#: slow refreshes: a GPU MODE problem with 5 benchmark shapes had not finished its timing items after 230 s on the
#: H200, issue #41).
ROUNDS_CAP_S = 4 * TIMING["budget_s"] + 30.0
SHAPE_ROUNDS_MIN_S = 6.0


def rounds_cap_s(shapes: int) -> float:
    """The wall seconds one shape's alternating rounds may run (:data:`ROUNDS_CAP_S`) when the kernel has
    ``shapes`` benchmark shapes: 38 s for one, 7.6 s each for five, never under 6 s."""
    return max(SHAPE_ROUNDS_MIN_S, ROUNDS_CAP_S / max(1, shapes))
#: ms per µs: CUPTI spans come in µs.
MS_PER_US = 1e-3

Party = tuple[dict[str, Any], "str | None", str]  # (request, warm server identity, display path)


def timing_policy(ctx: Context) -> dict[str, Any]:
    """The timing policy a request carries: :data:`TIMING` with the session's method and memory fraction."""
    return {**TIMING, "method": ctx.settings.timing_method, "graph_calls": GRAPH_CALLS,
            "mem_fraction": ctx.settings.rotating_memory,
            # a .cu solve() launches on the legacy default stream: a capture on torch's capture stream would run
            # it eagerly instead of recording it, so its graph mode queues the pairs
            "capture": ctx.kind.graph_capture}


def timing_request(ctx: Context, device: str) -> dict[str, Any]:
    """A timing request for ``ctx``'s kernel (first validation seed's plan), its build made or reused."""
    return harness_request(ctx, "timing", device, ctx.settings.seeds[0], ensure_built(ctx),
                           timing=timing_policy(ctx))


class Rounds:
    """Alternating timing rounds of several parties, each in its own process: a first round of 3 samples each, then
    rounds of about :data:`ROUND_S` per party (:data:`SOLO_ROUND_S` for a party alone) until every party's stopping
    rule is met or ``cap_s`` wall seconds have passed (:data:`ROUNDS_CAP_S`; a party still sampling then is
    ``capped``), then each party's final result.
    The caller holds the GPU lock around all of it. With ``memory``, the first party's device memory is read after
    each of its sampling rounds, while its process is stopped (:class:`~pytest_kopt.gates.leaks.ProcessMemory`), and
    its final result carries the readings as ``memory_outside``."""

    def __init__(self, ctx: Context, parties: list[Party], cap_s: float = ROUNDS_CAP_S,
                 memory: ProcessMemory | None = None) -> None:
        self.ctx, self.parties = ctx, parties
        self.memory = memory
        #: the first party's readings: samples it had taken, the fewest any party had taken, its bytes (or None)
        self.memory_readings: list[dict[str, Any]] = []
        self.key = uuid.uuid4().hex
        self.cap_s = cap_s
        self.timeout = max(ctx.settings.gate_timeout_s, 120.0)
        self.last: list[dict[str, Any]] = []
        #: per party, this process's own account of its rounds: samples asked for, and the wall seconds of the
        #: sampling rounds and of the final one (the profiled calls), by this process's clock
        self.asked: dict[int, int] = {}
        self.wall_s: dict[int, float] = {}
        self.final_s: dict[int, float] = {}
        #: wall seconds spent reading the first party's memory between its rounds (NVML's process list)
        self.memory_read_s = 0.0

    def run(self, i: int, count: int, final: bool = False) -> dict[str, Any]:
        """One round of ``count`` samples of party ``i`` (``final``: end it and return its whole result, with
        ``outside_clock``: what this process asked of it and measured of it, :func:`outside_clock`)."""
        r, server, path = self.parties[i]
        t0 = time.perf_counter()
        result = self.ctx.pool.run({**r, "round": {"key": f"{self.key}-{i}", "count": count, "final": final}},
                                   gate="timing", timeout_s=self.timeout, path=path, workdir=self.ctx.work,
                                   server=server)
        took = time.perf_counter() - t0
        if final:
            self.final_s[i] = took
            result["outside_clock"] = {"samples_asked": self.asked.get(i, 0),
                                       "rounds_wall_s": round(self.wall_s.get(i, 0.0), 6),
                                       "final_wall_s": round(took, 6)}
            if i == 0 and self.memory is not None:
                result["memory_outside"] = {"readings": self.memory_readings, "note": self.memory.note,
                                            "read_s": round(self.memory_read_s, 6)}
        else:
            self.asked[i] = self.asked.get(i, 0) + count
            self.wall_s[i] = self.wall_s.get(i, 0.0) + took
            if i == 0 and self.memory is not None:
                t1 = time.perf_counter()
                pids = self.ctx.pool.pids(server, dict(r.get("env") or {}))
                self.memory_readings.append({"samples": self.asked[0],
                                             "parties_min": min(self.asked.get(j, 0) for j in range(len(self.parties))),
                                             "bytes": self.memory.read(pids)})
                self.memory_read_s += time.perf_counter() - t1
        return result

    def warm(self, i: int) -> None:
        """Party ``i``'s kernel loaded and called once in its process (a ``warm`` round, :func:`pytest_kopt.child.
        timing.timed`), kept there for its first round. The caller holds the GPU lock shared, beside other workers'
        correctness seeds, so the exclusive hold of the measurement does not spend its time on it."""
        r, server, path = self.parties[i]
        self.ctx.pool.run({**r, "round": {"key": f"{self.key}-{i}", "count": 0, "warm": True}}, gate="timing",
                          timeout_s=self.timeout, path=path, workdir=self.ctx.work, server=server)

    def start(self, i: int) -> dict[str, Any]:
        """Party ``i``'s first round (3 samples); kept as its latest."""
        self.last.append(self.run(i, 3))
        return self.last[-1]

    def finish(self) -> list[dict[str, Any]]:
        """Rounds until every party has stopped or :attr:`cap_s` has passed, then each party's final result, in
        party order; a party the cap ended reports ``stop_reason`` ``capped`` and ``rounds_cap_s``."""
        t0 = time.monotonic()
        round_s = ROUND_S if len(self.parties) > 1 else SOLO_ROUND_S
        while any(r["stop_reason"] is None for r in self.last) and time.monotonic() - t0 < self.cap_s:
            for i in range(len(self.parties)):
                if self.last[i]["stop_reason"] is None:
                    per = max(self.last[i]["sample_wall_s"], 1e-6)
                    self.last[i] = self.run(i, int(min(500, max(1, round_s / per))))
        capped = [r["stop_reason"] is None for r in self.last]
        finals = [self.run(i, 0, final=True) for i in range(len(self.parties))]
        for final, cut in zip(finals, capped):
            if cut:  # its own rule had not stopped it: the samples are what the cap left, said as such
                final.update(stop_reason="capped", rounds_cap_s=self.cap_s)
        return finals


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


def interleaves_reference(ctx: Context) -> bool:
    """Whether the timing gate times the reference in rounds alternating with the kernel (the default), or once per
    session, shared by its kernels (:func:`reference_timing`): with ``--kopt-fresh-process``, where no rounds
    alternate, and in a loop's close (``--kopt-run``), whose decisions compare the branches' own medians (and
    re-time the finalists side by side, :func:`retime_interleaved`), so the reference's rounds in each branch's
    measurement (about a third of its GPU time, 2026-12-06) bought only the ratio's drift-free CI."""
    return not ctx.settings.fresh_process and not (ctx.settings.loop_mode == "run" and not ctx.settings.pr_gate)


def interleaved(ctx: Context, req: dict[str, Any],
                within: Callable[[dict[str, Any], dict[str, Any] | None], None] | None = None
                ) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]:
    """Candidate and reference (and, for the PR gate, the baseline kernel) timed in alternating rounds, each in its
    own warm process, so a drift of clocks or temperature during the measurement hits all of them and the ratios'
    CIs stay honest. Returns (candidate result, reference result, baseline result or None) as the one-shot timing
    modes do. The reference is prepared on the candidate's spec, which the candidate's first round returns (its
    process checks it against ``ref.shapes()``). Where :func:`interleaves_reference` is False the candidate is
    timed alone in its rounds and the reference's result is None (the caller takes :func:`reference_timing`).
    ``within(candidate result, PR baseline's result or None)`` runs before the GPU lock's hold ends (the timed
    output's check: taken after it, its hold waited behind every timing queued meanwhile, 4 to 7 s in a close of 32
    branches on 8 workers, H100, 2026-12-06); what it raises ends the measurement."""
    with_reference = interleaves_reference(ctx)
    parties: list[Party] = [(req, ctx.server("candidate"), ctx.display)]
    ready_for_timing(ctx, [(req, ctx.server("candidate"), ctx.display)]
                     + ([({"device": req["device"], "env": {}}, ctx.server("reference"), str(ctx.ref))]
                        if with_reference else []))
    # the candidate's device memory, read here between its rounds (the LEAK check, gates/leaks.py)
    memory = ProcessMemory((ctx.env.get("gpu") or {}).get("uuid"))
    rounds = Rounds(ctx, parties, cap_s=rounds_cap_s(len(ctx.benchmarks)), memory=memory)
    # NVML shut down whatever happens, after the exclusive hold ends (never inside it)
    with contextlib.closing(memory):
        if ctx.shares_gpu and req["device"] == "cuda" and parties[0][1] is not None \
                and not ctx.gpu_lock(shared=True).writers_waiting():
            # in a loop's close, the candidate's load and first call under a shared hold, beside other branches'
            # seeds, not in the exclusive hold: the first rounds of 32 branches at 1024^3 took 0.149 s (median) with
            # it against 0.202 s without, the warm round itself 0.018 s (H100, 2026-12-06, docs/loop.md). Not while
            # other timings hold or wait for the GPU: a shared hold waits for all of them, and the exclusive queue
            # could run dry meanwhile (it did 14 times in that close, 6.6 s in all, each time with no timing ready)
            with ctx.device_lock(req["device"], shared=True):
                rounds.warm(0)
        # one hold of the GPU lock for every round: taken per round, another worker's correctness seed (seconds at
        # 4096^3) could slip in between 50 ms rounds, and the rounds would spend their time cap waiting for the lock
        with ctx.device_lock(req["device"]):
            first = rounds.start(0)
            if with_reference:
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
            try:
                if within is not None:
                    within(finals[0], finals[2] if len(finals) > 2 else None)
            finally:  # the PR baseline's timed outputs are never judged: removed whatever the check raised
                if len(finals) > 2 and finals[2].get("npz"):
                    Path(finals[2]["npz"]).unlink(missing_ok=True)
    if not with_reference:
        return finals[0], None, None
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
    # every party's process stays warm through the rounds (the pool's cap would end the least recently used one,
    # to be started again inside the GPU lock's hold); the cap is the pool's own again afterwards
    pool = ctxs[0].pool
    cap = pool.max_servers
    pool.max_servers = max(cap, len(ctxs) + 2)
    try:
        for c in ctxs:
            r = timing_request(c, "cuda")
            parties.append((r, c.server("candidate"), c.display))
            # the processes' starts overlap (started ahead, none ends another's)
            c.pool.prestart(c.server("candidate"), dict(r["env"]), c.work, ahead=True)
        ready_for_timing(ctxs[0], parties)
        rounds = Rounds(ctxs[0], parties)
        with ctxs[0].gpu_lock():
            for i in range(len(parties)):
                rounds.start(i)
            finals = rounds.finish()
    finally:
        pool.max_servers = cap
    # one basis for every kernel of the decision: the kernel-only spans when each has them (the timing gate's
    # default), else the events
    spans = [(f.get("cupti") or {}).get("spans_us") for f in finals]
    cupti = ctxs[0].settings.timing_method == "cupti" and all(spans)
    out = []
    for f, sp in zip(finals, spans):
        if f.get("npz"):
            Path(f["npz"]).unlink(missing_ok=True)
        samples = [x * MS_PER_US for x in sp] if cupti and sp else f["event_ms"]
        out.append({"median_ms": stats.median(samples), "samples_ms": samples,
                    "timing_basis": "cupti" if cupti else f.get("method", "events"),
                    "stop_reason": f["stop_reason"], "gpu_uuid": f.get("gpu_uuid")})
    return out


def reference_timing(ctx: Context, req: dict[str, Any], cand: dict[str, Any]) -> dict[str, Any]:
    """The reference timed in its own process on the candidate's spec, where no rounds alternate with it
    (:func:`interleaves_reference`): shared through the session's signed cache per (reference, spec, dims, GPU), so
    a session's candidates (a close's branches) share one measurement of it. Returns ``{"event_ms",
    "stop_reason", "cupti"}``."""
    key = digest("time", local_sources(ctx.ref), cand["spec"], cand.get("scalars"), req["plan"], req["seed"],
                 req["dims"], (ctx.env.get("gpu") or {}).get("uuid"), TIMING)

    def compute() -> tuple[dict[str, Any], None]:
        rreq = {**req, "mode": "time_reference", "spec": cand["spec"], "scalars": cand.get("scalars", {}), "env": {}}
        # its process started (where it was not started ahead: a loop's close) and its context and CUPTI made
        # before the GPU lock is taken
        ready_for_timing(ctx, [(rreq, ctx.server("reference"), str(ctx.ref))])
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


def _timed_output_check(ctx: Context, req: dict[str, Any], result: dict[str, Any], held: bool = False) -> Any:
    """The judge, in the reference's process, on the timed process's check call: the reference on that call's
    inputs, the verdict on its outputs (:func:`pytest_kopt.child.correctness.mode_check_timed`); ``held``: the
    caller holds the GPU lock already. ``result`` gains ``judge_phase_s``: where the judge's time went (its
    ``phase_s``, and its process's ``harness_s``). Raises KernelRuntimeError when the timed process handed over no
    outputs (or none the judge could read)."""
    check_report(ctx, result, req, "timing")
    try:
        judged = judge_request(ctx, req, result, mode="check_timed", held=held)
    finally:
        if result.get("npz") and Path(result["npz"]).is_file():
            Path(result["npz"]).unlink(missing_ok=True)
    result["judge_phase_s"] = {**{k: round(v, 3) for k, v in (judged.get("phase_s") or {}).items()
                                  if isinstance(v, (int, float))},
                               **{f"harness_{k}": v for k, v in (judged.get("harness_s") or {}).items()
                                  if k in ("wait_profiler", "mode")}}
    if judged.get("unreadable") or judged.get("missing") or judged.get("verdict") is None:
        what = judged.get("unreadable") or ", ".join(judged.get("missing") or []) or "outputs"
        raise KernelRuntimeError(f"the timed call's process returned no {what}", gate="timing", path=ctx.display,
                                 fix="the kernel must not touch the harness (its modules, files or pipes)")
    changed = (judged.get("guards") or {}).get("input_mutated")
    if changed:  # the judge drew the check call's inputs itself: the timed process's copy is not them
        return verdict_from({"status": "INPUT_MUTATED", "message": "the timed check call's inputs are not the ones "
                             "drawn for it: " + ", ".join(map(str, changed)), "details": [], "figures": {}})
    return verdict_from(judged["verdict"])


#: Seconds of slack when a party's reported samples are held against the wall time of its rounds (the rounds' own
#: request round trips are inside that wall time, so honest samples always fit with room to spare).
CLOCK_SLACK_S = 0.005


def outside_clock(result: dict[str, Any]) -> list[str]:
    """What the pytest process's own account of an interleaved measurement (``result["outside_clock"]``, from
    :class:`Rounds`) says of the figures the timed process reported: every sample it asked for there, no more and
    no fewer; the event samples (ms) summing to no more than the sampling rounds' wall time; the kernel-only spans
    (µs) of its profiled calls summing to no more than the final round's. Returns the contradictions (none for a
    result without that account: a fresh process, timed at once)."""
    clock = result.get("outside_clock")
    if not isinstance(clock, dict):
        return []
    out = []
    events = result.get("event_ms") if isinstance(result.get("event_ms"), list) else []
    if len(events) != clock["samples_asked"]:
        out.append(f"it reported {len(events)} samples where {clock['samples_asked']} were asked for")
    total = sum(x for x in events if isinstance(x, (int, float))) / 1e3
    if total > clock["rounds_wall_s"] + CLOCK_SLACK_S:
        out.append(f"its samples sum to {total:.4f} s, more than the {clock['rounds_wall_s']:.4f} s its rounds took")
    spans = ((result.get("cupti") or {}).get("spans_us") or []) if isinstance(result.get("cupti"), dict) else []
    span_s = sum(x for x in spans if isinstance(x, (int, float))) / 1e6
    if span_s > clock["final_wall_s"] + CLOCK_SLACK_S:
        out.append(f"its profiled calls' spans sum to {span_s:.4f} s, more than the {clock['final_wall_s']:.4f} s of "
                   "its final round")
    return out


def measure(ctx: Context, req: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None,
                                                         dict[str, Any] | None, Any]:
    """One measurement: (the candidate's result, the reference's, the PR baseline's, the timed-output verdict).
    The candidate's result gains ``gate_phase_s``: the wall seconds of the measurement and of the output check, as
    the pytest process saw them (lock waits included), the output check's parts in the judge's process (``judge``),
    and of its NVML readings between the rounds
    (``memory_read``, where it took any)."""
    ref_result: dict[str, Any] | None = None
    base_result: dict[str, Any] | None = None
    t0 = time.perf_counter()
    checked: dict[str, Any] = {}

    def check(result: dict[str, Any], base: dict[str, Any] | None, held: bool) -> None:
        t1 = checked["t1"] = time.perf_counter()
        contradictions = outside_clock(result) + [f"the PR gate's baseline: {c}" for c in
                                                  (outside_clock(base) if base is not None else [])]
        if contradictions:
            raise TimingError("the timed process's figures contradict what the pytest process asked and measured: "
                              + "; ".join(contradictions), gate="timing", path=ctx.display, status="TAMPERED",
                              fix="the kernel's process must not change how it is timed (torch's events, the "
                                  "profiler, the harness); its timing is void")
        checked["verdict"] = _timed_output_check(ctx, req, result, held)
        checked["check_s"] = time.perf_counter() - t1

    if ctx.settings.fresh_process:
        result = ctx.pool.run(req, gate="timing", timeout_s=max(ctx.settings.gate_timeout_s, 120.0),
                              path=ctx.display, workdir=ctx.work, lock=ctx.gpu_lock())
        check(result, None, held=False)
    else:  # the timed output judged inside the measurement's hold
        result, ref_result, base_result = interleaved(ctx, req, lambda r, b: check(r, b, held=True))
    verdict = checked["verdict"]
    result["gate_phase_s"] = {"measure": round(checked["t1"] - t0, 3), "output_check": round(checked["check_s"], 3)}
    judge = result.pop("judge_phase_s", None)
    if judge:  # the output check's parts in the judge's process
        result["gate_phase_s"]["judge"] = judge
    read_s = (result.get("memory_outside") or {}).get("read_s")
    if isinstance(read_s, float):  # the pytest process's NVML readings between the rounds, inside the hold
        result["gate_phase_s"]["memory_read"] = round(read_s, 3)
    return result, ref_result, base_result, verdict


#: Share of samples whose launch call took longer on the host than the stream hold, from which the host's own time

def timing_basis(ctx: Context, result: dict[str, Any], ref_result: dict[str, Any],
                 base_result: dict[str, Any] | None = None) -> dict[str, Any]:
    """Which samples a timing reports and every decision reads, and why. ``--kopt-timing cupti`` (the default):
    the kernel-only spans from CUPTI (:func:`pytest_kopt.child.cupti.cupti_samples`) of the kernel, its reference
    and a PR gate's baseline alike, so no ratio mixes two clocks; CUDA events for all of them when the profiler
    gave any party none (``note`` says why). ``events``/``graph``: those samples. Returns ``{"basis", "kernel",
    "reference", "baseline" (ms lists; baseline None without one), "note"}`` (and ``host_work_ms``, below). A
    candidate whose profiled calls launched nothing gets an empty ``kernel`` list under ``cupti``: it is caught,
    never timed by events instead. A candidate whose calls do host work inside them (events beyond the kernels'
    span, accounted for by the host's time inside its profiled calls while the GPU waited:
    :func:`~pytest_kopt.gates.suspects.host_work`)
    is timed by CUDA events, every party alike, and ``host_work_ms`` says how much (ms per call)."""
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
    spans = {who: [x * MS_PER_US for x in p["cupti"]["spans_us"]] for who, p in parties}
    events_ms = stats.median(result["event_ms"]) if result["event_ms"] else 0.0
    kernel_ms = stats.median(spans["kernel"])
    work = host_work(events_ms, kernel_ms, host_inside_ms(cupti))
    if work is not None:
        # the kernels' span leaves the host work out; what a call costs its user is the events' time, and a call
        # that only imitates host work while profiled hides nothing there (suspects.host_work)
        return {**events, "note": f"timed by CUDA events: the call does host work inside it ({stats.fmt_ms(work)} "
                                  f"per call: CUDA events {stats.fmt_ms(events_ms)}, the kernels' own records "
                                  f"{stats.fmt_ms(kernel_ms)}; the host worked "
                                  f"{stats.fmt_ms(host_inside_ms(cupti) or 0.0)} per profiled call inside it "
                                  "while the GPU waited)",
                "host_work_ms": work}
    return {"basis": "cupti", "kernel": spans["kernel"], "reference": spans["reference"],
            "baseline": spans.get("baseline"), "note": None}


@dataclass(frozen=True, slots=True)
class Measured:
    """A measurement as the timing gate judges it: the kernel's, the reference's and a PR gate's baseline's timed
    results (``baseline`` None without one), the judge's verdict on a timed call's output, the samples every
    decision reads (:func:`timing_basis`), the timing policy of the request measured (``hold_us`` raised after an
    unstable first attempt), and that first attempt (None when there was none)."""

    run: TimedRun
    ref: TimedRun
    baseline: TimedRun | None
    verdict: Any
    basis: Basis
    policy: dict[str, Any]
    first_attempt: FirstAttempt | None

    @property
    def did_nothing(self) -> bool:
        """Whether the timed calls did no measurable work: no GPU work in the profiled calls (kernel-only basis),
        or a median event time not above 0."""
        return (self.basis.name == "cupti" and not self.basis.kernel) or statistics.median(self.run.event_ms) <= 0


def _measure_once(ctx: Context, req: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None,
                                                               Any, dict[str, Any]]:
    """:func:`measure`, the reference timed alone where no rounds alternated, and :func:`timing_basis`."""
    result, ref_result, base_result, verdict = measure(ctx, req)
    if ref_result is None:
        ref_result = reference_timing(ctx, req, result)
    return result, ref_result, base_result, verdict, timing_basis(ctx, result, ref_result, base_result)


def stability(k: stats.Distribution, *, graph: bool, host_work: bool) -> tuple[str, str]:
    """(stability class, what it was judged on) of samples ``k``: SKILL.md's robust CV classes (``robust_cv``),
    except for graph samples (each the difference of two replays, whose spread is the flush's) and for a call with
    host work inside it, whose spread is the host's own work varying from call to call (a ``cudaMalloc``'s time:
    0.26 robust CV for an honest scratch buffer on an H100, 2026-12-05) and which a longer hold cannot remove (a
    ``cudaFree`` synchronises, so the hold is inside the call): both judged on the median's precision
    (``median_rse``, :func:`pytest_kopt.stats.stability_class_rse`)."""
    if graph or host_work:
        return stats.stability_class_rse(k.median_rse, TIMING["min_samples"]), "median_rse"
    return k.stability, "robust_cv"


def measure_shape(ctx: Context, req: dict[str, Any]) -> Measured:
    """Measure ``ctx``'s kernel with the timing request ``req``. When the kernel's samples are unstable (not graph
    samples, whose spread is the flush's), first find out why (:func:`~pytest_kopt.gates.suspects.unstable_causes`);
    where a cause can be taken out of the measurement (a longer stream hold, a wait for other processes), measure
    once more with it taken out, unless this shape's measurement already took its share of the rounds' cap
    (:func:`rounds_cap_s`: a kernel of several benchmark shapes is not measured twice per shape past it). Raises the
    harness's errors."""
    t0 = time.monotonic()
    result, ref_result, base_result, verdict, basis = _measure_once(ctx, req)
    first_attempt: FirstAttempt | None = None
    k0 = stats.describe(basis["kernel"]) if verdict.ok and basis["kernel"] and \
        statistics.median(basis["kernel"]) > 0 else None
    if k0 is not None and result.get("method") != "graph" \
            and stability(k0, graph=False, host_work=basis.get("host_work_ms") is not None)[0] == "unstable":
        causes = unstable_causes(result)
        spent, cap = time.monotonic() - t0, rounds_cap_s(len(ctx.benchmarks))
        if causes["remedy"] and len(ctx.benchmarks) > 1 and spent >= cap:
            causes = {**causes, "remedy": "", "causes": [*causes["causes"], f"not measured again: this shape's "
                                                         f"measurement took {spent:.1f} s of its {cap:.1f} s"]}
        first_attempt = FirstAttempt(robust_cv=k0.robust_cv, median_ms=k0.median_ms, samples=k0.n,
                                     causes=causes["causes"], remeasured=causes["remedy"], basis=basis["basis"])
        if causes["remedy"]:
            if causes["wait_s"]:
                time.sleep(causes["wait_s"])
            req = {**req, "timing": {**req["timing"], "hold_us": causes["hold_us"]}}
            result, ref_result, base_result, verdict, basis = _measure_once(ctx, req)
    return Measured(run=TimedRun.of(result), ref=TimedRun.of(ref_result),
                    baseline=TimedRun.of(base_result) if base_result is not None else None, verdict=verdict,
                    basis=Basis.of(basis), policy=dict(req["timing"]), first_attempt=first_attempt)
