"""Candidates judged per GPU-minute: one loop iteration closed with 32 branches of one problem on one GPU, and where
the close's time goes. Two problems, both with this file's own variants: ``gemm`` (register- and shared-memory-tiled
SGEMM, M=N=K=1024, CUDA) and ``softmax`` (a Triton row softmax at ROWS rows a program and WARPS warps,
M=4096, N=1024).

Sets a run up on the problem's example baseline (``--kopt-init``; examples/gemm, examples/softmax_triton), writes
the branches and methods.json, closes the iteration (``--kopt-run -n N``) and prints: the close's wall time,
candidates per GPU-minute (branches / close minutes), each gate's item time (sum over the branches' items, and the
largest item), the branches' verdicts and the champion, and the host's CPU seconds by process kind
(``benchmarks/cpu_sampler.py``).
With ``--compare N2`` a second run is set up and closed the same way with ``-n N2`` (and ``--compare-flags``
added to its close), and the two runs' verdicts and champions are compared (they must agree).

    python3 benchmarks/throughput.py [--n 8] [--compare 2] [--compare-flags=--kopt-no-fork-server]
                                     [--problem gemm|softmax] [--branches 32] [--dims M=1024,N=1024,K=1024]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cpu_sampler import CpuSampler, host_line

ROOT = Path(__file__).resolve().parent.parent
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider"]


def variants(count: int) -> list[tuple[str, str]]:
    """``count`` (label, source) SGEMM variants: register-tiled (BM, BN, TM, TN, VEC over the gemm_tiled example's
    body, 32 to 512 threads a block) first, then shared-memory-tiled (TILE 8, 16, 32)."""
    body = (ROOT / "examples" / "gemm_tiled" / "reg_tiled.cuh").read_text()
    smem = (ROOT / "benchmarks" / "loop_kernels" / "smem_tiled.cu").read_text()
    out = []
    for bm, bn, tm, tn, vec in itertools.product((64, 128, 32), (64, 128, 32), (4, 8, 2), (4, 8), (1, 0)):
        threads = (bm // tm) * (bn // tn)
        if 32 <= threads <= 512:  # 128-bit stores of C need TN % 4 == 0: TN is 4 or 8
            head = f"#define BM {bm}\n#define BN {bn}\n#define TM {tm}\n#define TN {tn}\n#define VEC {vec}\n"
            out.append((f"reg{bm}x{bn}_{tm}x{tn}_v{vec}", head + body))
    for tile in (8, 16, 32):
        out.append((f"smem{tile}", f"#define TILE {tile}\n" + smem))
    if len(out) < count:
        raise SystemExit(f"only {len(out)} variants; ask for fewer branches")
    return out[:count]


def softmax_variants(count: int) -> list[tuple[str, str]]:
    """``count`` (label, source) Triton row-softmax variants (``loop_kernels/softmax_rows.py``): ROWS rows a program
    (1 to 16) by WARPS warps (1 to 16) where a thread holds at most 128 of the tile's elements at N=1024
    (32 x ROWS / WARPS <= 128) and ROWS x WARPS <= 128, each with exp and with exp2; the example's own shape (1 row,
    4 warps, exp) last."""
    body = (ROOT / "benchmarks" / "loop_kernels" / "softmax_rows.py").read_text()
    out = []
    for exp2, rows, warps in itertools.product((False, True), (2, 4, 1, 8, 16), (4, 8, 2, 16, 1)):
        if rows <= 4 * warps and rows * warps <= 128 and (rows, warps, exp2) != (1, 4, False):
            src = (body.replace("\nROWS = 1\n", f"\nROWS = {rows}\n").replace("\nWARPS = 4\n", f"\nWARPS = {warps}\n")
                   .replace("\nEXP2 = False\n", f"\nEXP2 = {exp2}\n"))
            out.append((f"rows{rows}_w{warps}{'_exp2' if exp2 else ''}", src))
    out.append(("rows1_w4", body))
    if len(out) < count:
        raise SystemExit(f"only {len(out)} variants; ask for fewer branches")
    return out[:count]


#: per problem: the example directory, its baseline and reference, the branches' file name, the default dims and
#: the variants
PROBLEMS = {
    "gemm": ("gemm", "gemm.cu", "ref.py", "kernel.cu", "M=1024,N=1024,K=1024", variants),
    "softmax": ("softmax_triton", "softmax.py", "ref.py", "kernel.py", "M=4096,N=1024", softmax_variants),
}


def pytest(args: list[str], cwd: Path, log: Path, timeline: Path | None = None) -> tuple[int, float]:
    """Runs pytest in ``cwd``; with ``timeline``, benchmarks/timeline_plugin.py writes each item's start and stop
    there (its first line: the time this function started pytest)."""
    env = dict(os.environ)
    extra: list[str] = []
    if timeline is not None:
        env["KOPT_TIMELINE"] = str(timeline)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), env.get("PYTHONPATH")]))
        extra = ["-p", "timeline_plugin"]
        timeline.write_text(json.dumps({"event": "launch", "t": time.time()}) + "\n")
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run([*PYTEST, *extra, *args], cwd=cwd, stdout=f, stderr=subprocess.STDOUT, timeout=900,
                            env=env).returncode
    if timeline is not None:
        with open(timeline, "a") as f:
            f.write(json.dumps({"event": "exit", "t": time.time()}) + "\n")
    return rc, time.perf_counter() - t0


def timeline_table(path: Path) -> list[str]:
    """Where the close's wall time went, from the timeline: the launch to the first item, each gate's first start,
    last stop and items running at once (the most), the time the GPU-exclusive gates (timing, ncu) were running
    (their union), and the last item's stop to the process's exit (the loop's close: finalists re-timed side by
    side, the champion's profile, the run directory written)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    ev = {r["event"]: r["t"] for r in rows if "event" in r}
    items = [r for r in rows if "nodeid" in r and r["when"] == "call"]
    if not items or "launch" not in ev:
        return ["  (no timeline)"]
    t0 = ev["launch"]
    first, last = min(r["start"] for r in items), max(r["stop"] for r in items)
    out = [f"  launch to first item {first - t0:6.1f} s (collection, workers, work started ahead)"]
    by_gate: dict[str, list[dict]] = {}
    for r in items:
        by_gate.setdefault(r["nodeid"].split("::")[-1].split("[")[0], []).append(r)
    out.append(f"  {'gate':<14} {'first s':>8} {'last s':>8} {'busy s':>8} {'most at once':>12}")
    for gate, rs in sorted(by_gate.items(), key=lambda kv: min(r["start"] for r in kv[1])):
        spans = sorted((r["start"], r["stop"]) for r in rs)
        busy, end = 0.0, None
        for a, b in spans:  # the union of the gate's items' spans
            if end is None or a > end:
                busy += b - a
                end = b
            elif b > end:
                busy += b - end
                end = b
        points = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
        most = cur = 0
        for _, d in points:
            cur += d
            most = max(most, cur)
        out.append(f"  {gate:<14} {min(a for a, _ in spans) - t0:8.1f} {max(b for _, b in spans) - t0:8.1f} "
                   f"{busy:8.1f} {most:12d}")
    if "exit" in ev:
        out.append(f"  last item to exit {ev['exit'] - last:6.1f} s (the loop's close after the items)")
        after: dict[str, list[float]] = {}
        for r in rows:
            if "request" in r and r["sent"] >= last - 1e-3:
                after.setdefault(f"{r['gate']}/{r['request']}", []).append(r["returned"] - r["sent"])
            elif r.get("lock") and r["held"] >= last - 1e-3:
                after.setdefault(f"{r['lock']} hold", []).append(r["released"] - r["held"])
        if "sessionfinish" in ev:
            after["last item to timeline sessionfinish"] = [ev["sessionfinish"] - last]
        for kind, v in sorted(after.items(), key=lambda kv: -sum(kv[1])):
            out.append(f"    after the items: {kind:<34} {len(v):>3} x, {sum(v):6.2f} s")
    return (out + lock_table([r for r in rows if "lock" in r], first, last)
            + exclusive_start([r for r in rows if r.get("lock") == "exclusive"], [r for r in rows if "request" in r],
                              t0)
            + hold_contents([r for r in rows if r.get("lock") == "exclusive"], [r for r in rows if "request" in r])
            + contexts_in_holds([r for r in rows if r.get("lock") == "exclusive"],
                                [r["context"] for r in rows if isinstance(r.get("context"), list)], t0))


def contexts_in_holds(holds: list[dict], contexts: list[list[float]], t0: float) -> list[str]:
    """The CUDA contexts harness processes made while idle (``context``: from, to, Unix seconds) and how much of
    them fell inside exclusive holds, where they share the GPU and the driver with a timing."""
    if not contexts:
        return ["  contexts made while idle: none recorded"]
    spans = sorted((h["held"], h["released"]) for h in holds)
    inside = [sum(max(0.0, min(b, c1) - max(a, c0)) for a, b in spans) for c0, c1 in contexts]
    took = sorted(c1 - c0 for c0, c1 in contexts)
    return [f"  contexts made while idle: {len(contexts)}, {took[len(took) // 2]:.2f} s median ({took[-1]:.2f} s "
            f"most), ended {min(c1 for _, c1 in contexts) - t0:.1f} to {max(c1 for _, c1 in contexts) - t0:.1f} s; "
            f"{sum(1 for x in inside if x > 0)} overlapped an exclusive hold, {sum(inside):.1f} s in all"]


def exclusive_start(holds: list[dict], requests: list[dict], t0: float) -> list[str]:
    """When the GPU's exclusive work began and how tightly it ran: the first exclusive hold's start (s after the
    launch ``t0``), the seconds between the first hold's start and the last one's end with no exclusive hold, and the
    timing processes' ``ready`` requests (a process's start and its CUPTI client's first session, before its first
    hold: 9-13 s each through torch's profiler in a close of 32 branches, H100, 2026-12-06)."""
    if not holds:
        return []
    spans = sorted((h["held"], h["released"]) for h in holds)
    lo, hi = spans[0][0], max(b for _, b in spans)
    out = [f"  first exclusive hold at {lo - t0:.1f} s; from it to the last one's end ({hi - t0:.1f} s) no exclusive "
           f"hold ran for {(hi - lo) - _union(spans):.1f} s"]
    ready = sorted(r["returned"] - r["sent"] for r in requests if r["request"] == "ready")
    if ready:
        out.append(f"  ready requests (a timing process's start and its CUPTI client's start): {len(ready)}, median "
                   f"{ready[len(ready) // 2]:.2f} s, most {ready[-1]:.2f} s")
    return out


def hold_contents(holds: list[dict], requests: list[dict]) -> list[str]:
    """What the exclusive holds of the per-GPU lock were spent on: per kind of harness request sent inside one
    (by the process that held it; a timing round's ``count`` is ``first`` for its first round of 3 samples,
    ``rounds`` for the others, ``final``), its count and the seconds summed over the holds, and the holds' time
    outside any request (the pytest process's own work: NVML readings, result files, the check of the timed
    output between its requests), apart from the holds with no request in them (an ncu profile's: in a close of 32
    branches at 1024^3 the champion's, 5.2 s, was most of the 9.3 s once read as time between requests, H100,
    2026-12-06), told apart by the function that took each (``caller``): its count, sum and longest."""
    if not holds or not requests:
        return []
    per: dict[str, list[float]] = {}
    outside = 0.0
    empty: list[float] = []
    callers: dict[str, list[float]] = {}
    for h in holds:
        inside = [r for r in requests if r["pid"] == h["pid"] and r["sent"] >= h["held"] - 1e-3
                  and r["returned"] <= h["released"] + 1e-3]
        if not inside:
            empty.append(h["released"] - h["held"])
            callers.setdefault(h.get("caller") or "caller not recorded", []).append(h["released"] - h["held"])
            continue
        seen = set()
        for r in inside:
            kind = r["request"] + ("" if r["round"] is None else
                                   ".final" if r["round"] == "final" else
                                   ".first" if (r["request"], "first") not in seen and r["round"] == 3 else ".rounds")
            seen.add((r["request"], "first"))
            per.setdefault(kind, []).append(r["returned"] - r["sent"])
        outside += (h["released"] - h["held"]) - _union([(r["sent"], r["returned"]) for r in inside])
    out = [f"  inside {len(holds)} exclusive holds: {'request':<22} {'count':>5} {'sum s':>7} {'median s':>8}"]
    for kind, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        out.append(f"  {'':<31}{kind:<22} {len(v):>5} {sum(v):>7.2f} {sorted(v)[len(v) // 2]:>8.3f}")
    out.append(f"  {'':<31}{'(outside any request)':<22} {'':>5} {outside:>7.2f}")
    if empty:
        out.append(f"  {'':<31}{'(holds with no request)':<22} {len(empty):>5} {sum(empty):>7.2f} "
                   f"{sorted(empty)[len(empty) // 2]:>8.3f}")
        for caller, v in sorted(callers.items(), key=lambda kv: -sum(kv[1])):
            out.append(f"  {'':<33}{caller:<20} {len(v):>5} {sum(v):>7.2f} {max(v):>8.3f} (most)")
    return out


def _union(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``spans``."""
    busy, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            busy, end = busy + b - a, b
        elif b > end:
            busy, end = busy + b - end, b
    return busy


def lock_table(holds: list[dict], first: float, last: float) -> list[str]:
    """The per-GPU lock between the first item's start and the last item's stop: per kind of hold its count, sum
    of holds, median and largest wait; the time an exclusive hold ran (the union), any hold ran, and an exclusive
    hold was asked for and not yet held (the wait for shared holds to end, the lock's hand-over)."""
    if not holds:
        return ["  (no lock holds logged)"]
    out = [f"  {'lock':<10} {'holds':>5} {'held sum s':>10} {'wait median s':>13} {'wait max s':>10}"]
    for kind in ("exclusive", "shared"):
        hs = [h for h in holds if h["lock"] == kind]
        if hs:
            waits = sorted(h["held"] - h["asked"] for h in hs)
            out.append(f"  {kind:<10} {len(hs):>5} {sum(h['released'] - h['held'] for h in hs):>10.1f} "
                       f"{waits[len(waits) // 2]:>13.3f} {waits[-1]:>10.2f}")
    window = [(max(a, first), min(b, last)) for a, b in ((h["held"], h["released"]) for h in holds) if b > first]
    excl = [(h["held"], h["released"]) for h in holds if h["lock"] == "exclusive"]
    asked = [(h["asked"], h["held"]) for h in holds if h["lock"] == "exclusive"]
    out.append(f"  of the items' {last - first:.1f} s: an exclusive hold ran {_union(excl):.1f} s, any hold "
               f"{_union(window):.1f} s; an exclusive hold was waited for {_union(asked):.1f} s "
               f"(the lock idle or shared meanwhile: {_union(asked + excl) - _union(excl):.1f} s)")
    return out


def one_run(work: Path, n: int, branches: int, dims: str, flags: tuple[str, ...] = (), problem: str = "gemm") -> dict:
    """Set up ``problem`` (a key of :data:`PROBLEMS`), write the branches, close (with ``flags`` added to the close's
    command); returns the figures of the close."""
    example, baseline, ref, kernel_name, _, make = PROBLEMS[problem]
    work.mkdir(parents=True, exist_ok=True)
    for name in (baseline, ref):
        shutil.copy(ROOT / "examples" / example / name, work / name)
    rc, init_s = pytest(["--kopt-baseline", baseline, "--kopt-ref", ref, "--kopt-dims", dims, "--kopt-seed", "1",
                         "--kopt-init", "--kopt-iterations", "1", "--kopt-branches", str(branches), "--kopt-json",
                         "init.json"], work, work / "init.log")
    init = json.loads((work / "init.json").read_text())
    run_dir = Path(init["loop"]["run_dir"])
    it = run_dir / "iterv1"
    if not it.is_dir():
        raise SystemExit(f"set-up stopped (exit {rc}): {init['loop']['message']}")
    for k, (_, src) in enumerate(make(branches), start=1):
        (it / "branches" / f"b{k}" / kernel_name).write_text(src)
    budget = json.loads((it / "roofline.json").read_text())["axis_budget"]
    method = "compute.register_tiling" if budget.get("compute") else "memory.shared_memory_tiling"
    (it / "methods.json").write_text(json.dumps({"methods": [{
        "id": method, "rationale": f"throughput.py: {problem} tile and thread-tile variants",
        "override_reason": "a fixed plan, timed whatever the trigger says"}]}))
    with CpuSampler() as cpu:
        rc, close_s = pytest([f"--kopt-run={run_dir}", "-n", str(n), "--kopt-json", "close.json", *flags], work,
                             work / "close.log", timeline=work / "close.timeline.jsonl")
    doc = json.loads((work / "close.json").read_text())
    per_gate: dict[str, list[float]] = {}
    for item in doc["items"]:
        per_gate.setdefault(item["gate"], []).append(item["duration_s"])
    loop = doc.get("loop") or {}
    verdicts = {b["branch"]: (b["status"], b.get("median_ms")) for b in loop.get("branches") or []}
    return {"n": n, "flags": " ".join(flags), "init_s": init_s, "close_s": close_s, "close_rc": rc, "per_gate": per_gate,
            "verdicts": verdicts, "champion": loop.get("champion"), "message": loop.get("message"),
            "timeline": timeline_table(work / "close.timeline.jsonl") + cpu.table(),
            "phases": cupti_backends(it) + plan_phases(run_dir, "baseline/plan.json", "set-up plan phase")
            + plan_phases(it) + ncu_phases(run_dir) + measure_phases(it) + warmup_clocks(it) + seed_phases(it)}


def warmup_clocks(it: Path) -> list[str]:
    """The SM clock (MHz, NVML) when each branch's timing warm-up began and ended (``bench.json`` ``warmup``), beside
    the GPU's maximum: whether the GPU was already at its clocks when a timing's exclusive hold began."""
    before: list[float] = []
    after: list[float] = []
    top: set[int] = set()
    for f in sorted(it.glob("branches/*/**/bench.json")):
        w = json.loads(f.read_text()).get("warmup")
        if isinstance(w, dict) and isinstance(w.get("sm_mhz_before"), (int, float)):
            before.append(float(w["sm_mhz_before"]))
            after.append(float(w.get("sm_mhz_after") or 0.0))
            top.add(int(w.get("max_sm_mhz") or 0))
    if not before:
        return ["  warm-up SM clock: not read (no NVML in the timing processes)"]
    b, a = sorted(before), sorted(after)
    return [f"  warm-up SM clock MHz (max {sorted(top)}): before min {b[0]:.0f} median {b[len(b) // 2]:.0f}; "
            f"after min {a[0]:.0f} median {a[len(a) // 2]:.0f} ({len(b)} branches)"]


def seed_phases(it: Path) -> list[str]:
    """The branches' correctness seeds (``correctness/*.json`` ``phase_s``): per phase its median, largest and sum
    over the seeds (s), and the waits outside the processes (a request's wall time less the process's own: the GPU
    lock, a process still starting)."""
    per: dict[str, list[float]] = {}
    for f in sorted(it.glob("branches/*/correctness/*.json")):
        ph = json.loads(f.read_text()).get("phase_s") or {}
        for k, v in ph.items():
            if isinstance(v, (int, float)) and not k.endswith(("_age", "_end")):
                per.setdefault(k, []).append(float(v))
        for who, req in (("candidate", "candidate"), ("judge", "judge_request")):
            if isinstance(ph.get(req), (int, float)) and isinstance(ph.get(f"{who}_harness_mode"), (int, float)):
                # a process's first request carries its start-up stamps: its mode and wait apart from the rest
                first = "_first" if f"{who}_harness_imported" in ph else "_later"
                per.setdefault(f"{who}_wait_outside{first}", []).append(ph[req] - ph[f"{who}_harness_mode"])
                per.setdefault(f"{who}_harness_mode{first}", []).append(ph[f"{who}_harness_mode"])
    return _spread("seed phase", dict(sorted(per.items())))


def plan_phases(folder: Path, pattern: str = "branches/*/plan.json", label: str = "plan phase") -> list[str]:
    """The plan items of the ``plan.json`` files under ``folder`` matching ``pattern`` (``phase_s``: each
    request's wall time and the harness's account of it, the first request's process imports included), each
    phase's median, largest and sum over them (s)."""
    per: dict[str, list[float]] = {}
    for f in sorted(folder.glob(pattern)):
        for k, v in (json.loads(f.read_text()).get("phase_s") or {}).items():
            if isinstance(v, (int, float)) and not k.endswith(("_age", "_end")):  # a process's age is no phase
                per.setdefault(k, []).append(float(v))
    return _spread(label, dict(sorted(per.items())))


def ncu_phases(run_dir: Path) -> list[str]:
    """Where each ncu profile of the run went (``*ncu_top.json`` ``attempts``: its set, how long before its go it was
    started ahead, and ``phase_s``: the lock's wait, what the process still needed after its go, the context and
    inputs, the warm-up, the profiled range with ncu's replays, the process's end and the report's writing, the
    report read back; s), one line per attempt of each profile, the set-up's and the close's champion's; a file
    that is a copy of one already read (the champion's as ``iterv1/kernel_ncu_top.json``) is named on its line."""
    out = []
    seen: dict[bytes, int] = {}  # a file's content -> the index of its first line
    for f in sorted(run_dir.glob("**/*ncu_top.json")):
        try:
            raw = f.read_bytes()
            attempts = json.loads(raw).get("attempts") or []
        except (OSError, ValueError, AttributeError):
            continue
        if raw in seen:
            out[seen[raw]] += f" (also {f.relative_to(run_dir)})"
            continue
        first = len(out)
        for a in attempts if isinstance(attempts, list) else []:
            if not isinstance(a, dict):
                continue
            phases = " ".join(f"{k} {v:.2f}" for k, v in (a.get("phase_s") or {}).items()
                              if isinstance(v, (int, float)))
            ahead = a.get("started_ahead_s")
            out.append(f"  ncu profile {str(f.relative_to(run_dir)):<44} set {a.get('set')} "
                       f"{'ok' if a.get('ok') else 'failed'}; started ahead "
                       f"{'no' if ahead is None else f'{ahead:.1f} s before its go'} ({a.get('ahead')}); {phases}")
        if len(out) > first:
            seen[raw] = first
    return out


def measure_phases(it: Path) -> list[str]:
    """The branches' timing phases (bench.json ``phase_s``), each phase's median, largest and sum over them (s)."""
    per: dict[str, list[float]] = {}
    for f in sorted(it.glob("branches/*/**/bench.json")):
        for k, v in (json.loads(f.read_text()).get("phase_s") or {}).items():
            for k2, x in (v.items() if isinstance(v, dict) else [("", v)]):
                if isinstance(x, (int, float)):
                    per.setdefault(f"{k}.{k2}" if k2 else k, []).append(float(x))
    return _spread("bench phase", per)


def cupti_backends(it: Path) -> list[str]:
    """Which CUPTI client gave the branches' kernel-only times (``bench.json`` ``kernel_time.backend``), with how
    many branches each and which runtime and driver calls it recorded (``api``), why cupti-python did not where it
    did not (``backend_note``) and why a process recorded every call (``api_note``), and the pass's parts
    (``kernel_time.times_s``, ``profile_s``, calls, batches, records): without cupti-python each timing process starts CUPTI through torch's
    profiler (seconds; 9-13 s before a close's first timing on an H100), so a run without it is not comparable with
    one that had it. ``bench.json`` is the candidate's process's report: what is not a number is left out."""
    seen: dict[str, int] = {}
    notes: set[str] = set()
    parts: dict[str, list[float]] = {}

    def number(v: object) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    for f in sorted(it.glob("branches/*/**/bench.json")):
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        kt = doc.get("kernel_time") if isinstance(doc, dict) else None
        if not isinstance(kt, dict):  # a summary over shapes, or no kernel-only time
            continue
        client = str(kt.get("backend")) + (f", {kt['api']} API records" if kt.get("api") in ("launches", "all") else "")
        seen[client] = seen.get(client, 0) + 1
        for note in ("backend_note", "api_note"):
            if kt.get(note):
                notes.add(str(kt[note])[:300])
        times = kt.get("times_s") if isinstance(kt.get("times_s"), dict) else {}
        for k, v in {**times, "profile_s": kt.get("profile_s"), "calls": kt.get("calls"),
                     "batches": kt.get("batches"), "records": kt.get("records")}.items():
            if number(v):
                parts.setdefault(str(k), []).append(float(v))
    line = "  kernel-only timing through " + (", ".join(f"{k} ({v})" for k, v in sorted(seen.items())) or "nothing")
    return [line] + [f"    NOTE {n}" for n in sorted(notes)] + _spread("kernel_time", parts, ("calls", "batches",
                                                                                             "records"))


def _spread(label: str, per: dict[str, list[float]], counts: tuple[str, ...] = ()) -> list[str]:
    """One line per phase: its median, largest and sum over the records (s; the keys in ``counts`` are counts,
    with no unit), and how many records had it."""
    out = []
    for k, v in per.items():
        u = "" if k in counts else " s"
        out.append(f"  {label} {k:<30} median {sorted(v)[len(v) // 2]:7.3f}{u}  max {max(v):7.3f}{u}  sum "
                   f"{sum(v):7.2f}{u}  ({len(v)})")
    return out


def report(r: dict, branches: int) -> None:
    per_min = branches / (r["close_s"] / 60)
    print(f"-n {r['n']}{' ' + r['flags'] if r['flags'] else ''}: set-up {r['init_s']:.1f} s; close of {branches} branches {r['close_s']:.1f} s (exit "
          f"{r['close_rc']}): {per_min:.1f} candidates per GPU-minute; champion {r['champion']}")
    print(f"  {'gate':<12} {'items':>5} {'sum s':>8} {'max s':>7}")
    for gate, d in r["per_gate"].items():
        print(f"  {gate:<12} {len(d):>5} {sum(d):>8.1f} {max(d):>7.2f}")
    print("\n".join(r["timeline"] + r["phases"]))
    passed = sum(v[0] == "PASSED" for v in r["verdicts"].values())
    print(f"  {passed} of {len(r['verdicts'])} branches passed; {r['message']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--compare", type=int, default=None)
    ap.add_argument("--compare-flags", default="", help="flags added to the second run's close, such as "
                    "--kopt-no-fork-server")
    ap.add_argument("--branches", type=int, default=32)
    ap.add_argument("--problem", choices=sorted(PROBLEMS), default="gemm")
    ap.add_argument("--dims", default=None, help="the problem's dims (default: gemm M=N=K=1024, softmax M=4096,N=1024)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    base = Path(a.out or tempfile.mkdtemp(prefix="kopt-throughput-"))
    dims = a.dims or PROBLEMS[a.problem][4]
    print(host_line())
    print(f"problem {a.problem} at {dims}, {a.branches} branches")
    first = one_run(base / f"n{a.n}", a.n, a.branches, dims, problem=a.problem)
    report(first, a.branches)
    if a.compare:
        second = one_run(base / f"n{a.compare}b", a.compare, a.branches, dims, tuple(a.compare_flags.split()),
                         a.problem)
        report(second, a.branches)
        same = {k: v[0] for k, v in first["verdicts"].items()} == {k: v[0] for k, v in second["verdicts"].items()}
        print(f"verdicts {'agree' if same else 'DIFFER'}; champions {first['champion']} and {second['champion']}")


if __name__ == "__main__":
    main()
