"""The ordered table of gates and their logic over plain data (no pytest here).

Each gate is ``fn(ctx, param) -> Outcome`` and raises a :class:`~pytest_kopt.errors.KoptError` when it decides
against the kernel, or :class:`~pytest_kopt.errors.Blocked` when a prerequisite is missing (a skip). Gates talk
through artifacts on disk (build cache, ``<outdir>/<stem>/``), so they work across xdist workers.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import build, contract, hardware, profile, sass, stats
from .compare import compare
from .errors import Blocked, CompileError, ContractError, HardwareError, IncorrectError, KoptError, TimingError
from .runner import run_harness
from .settings import DEFAULT_ARCH, Settings

#: Timing policy of the skeleton gate (issue 4 replaces it with adaptive stopping): warmup 100 ms wall time, then
#: at least 10 samples and 1 s, at most 200 samples.
TIMING = {"warmup_ms": 100.0, "min_reps": 10, "max_reps": 200, "budget_s": 1.0}


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a passing gate reports: scalar ``figures`` (they become junit ``user_properties``), a one-line
    ``summary`` for the terminal, and the artifact paths it wrote."""

    figures: dict[str, Any] = field(default_factory=dict)
    summary: str = ""
    artifacts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Context:
    """Everything a gate needs: the settings, the ``env.json`` dict, the folders. ``kind`` is ``cuda`` or
    ``triton``; ``display`` is the kernel path as the user wrote it (for messages)."""

    settings: Settings
    env: dict[str, Any]
    kernel: Path
    ref: Path
    display: str
    cache_dir: Path

    @property
    def kind(self) -> str:
        """``triton`` for a ``.py`` kernel, ``cuda`` for ``.cu`` (CUDA or CUTLASS)."""
        return "triton" if self.kernel.suffix == ".py" else "cuda"

    @property
    def outdir(self) -> Path:
        """``<outdir>/<kernel stem>/``: bench.json, ncu_top.json, the .ncu-rep, sass/, correctness/."""
        return self.settings.outdir / self.kernel.stem

    @property
    def arch(self) -> str:
        """The build arch: ``--kopt-arch``, else the detected GPU's (``sm_90a`` on an H200), else ``sm_90a``."""
        return self.settings.arch or self.env.get("sm_arch") or DEFAULT_ARCH

    @property
    def gpu(self) -> bool:
        """True when a CUDA context could be created on a GPU."""
        return bool(self.env.get("gpu_available"))

    @property
    def work(self) -> Path:
        """Scratch folder for harness requests and outputs."""
        return self.cache_dir / "work"


def _tool(ctx: Context, name: str) -> str | None:
    return (ctx.env.get("tools", {}).get(name) or {}).get("path")


def _write_json(path: Path, data: Any) -> str:
    """Atomic write (temp file + os.replace), so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, default=str)
    os.replace(tmp, path)
    return str(path)


# --------------------------------------------------------------------------------------------- hardware


def gate_hardware(ctx: Context, param: Any = None) -> Outcome:
    """Report the detected environment and write ``<outdir>/env.json``.

    Fails (HardwareError, exit 3) only when a tool the kernel cannot do without is missing: nvcc for a ``.cu``.
    No GPU is not a failure here: the GPU gates skip with the reason."""
    env = ctx.env
    path = _write_json(ctx.settings.outdir / "env.json", env)
    if ctx.kind == "cuda" and not _tool(ctx, "nvcc"):
        raise HardwareError("nvcc not found, so the .cu kernel cannot be built", gate="hardware",
                            fix="install the CUDA toolkit or set CUDA_HOME")
    g = env.get("gpu") or {}
    figures = {"gpu": g.get("name", "none"), "sm_arch": ctx.arch, "gpu_count": len(env.get("gpus", [])),
               "generation_allowed": env.get("generation_allowed")}
    return Outcome(figures, hardware.header_line(env), (path,))


# --------------------------------------------------------------------------------------------- preflight


def preflight(ctx: Context) -> list[contract.Param]:
    """The static contract check, shared by every later gate. Returns ``solve``'s parameters ([] for Triton).
    Raises ContractError (exit 4)."""
    contract.check_reference(ctx.ref)
    if ctx.kind == "triton":
        contract.check_triton(ctx.kernel, ctx.settings.dims)
        return []
    source = ctx.kernel.read_text(errors="replace")
    params = contract.parse_solve_signature(source, ctx.display)
    contract.check_dims(params, ctx.settings.dims, ctx.display)
    return params


def gate_preflight(ctx: Context, param: Any = None) -> Outcome:
    """Check the kernel and reference contracts without running anything."""
    params = preflight(ctx)
    if ctx.kind == "triton":
        return Outcome({"kind": "triton"}, "triton: setup/run_kernel/@triton.jit found; ref.reference found")
    kind = "cutlass" if contract.is_cutlass(ctx.kernel.read_text(errors="replace")) else "cuda"
    sig = ", ".join(f"{'const ' if p.is_const else ''}{p.ctype}{'*' if p.is_pointer else ''} {p.name}" for p in params)
    return Outcome({"kind": kind, "inputs": sum(p.role == "input" for p in params),
                    "outputs": sum(p.role == "output" for p in params)}, f"solve({sig})")


# --------------------------------------------------------------------------------------------- compile


def _blocked_by_preflight(ctx: Context) -> list[contract.Param]:
    try:
        return preflight(ctx)
    except ContractError as exc:
        raise Blocked("preflight", exc.message) from None


def ensure_built(ctx: Context) -> build.BuildResult:
    """Build (or reuse) the kernel for ``ctx.arch``. Raises CompileError/HardwareError, or Blocked when the
    preflight contract fails."""
    _blocked_by_preflight(ctx)
    root = ctx.cache_dir / "builds"
    if ctx.kind == "cuda":
        source = ctx.kernel.read_text(errors="replace")
        nvcc = _tool(ctx, "nvcc")
        return build.build_cuda(ctx.kernel, ctx.arch, root, nvcc, (ctx.env["tools"].get("nvcc") or {}).get("version"),
                                contract.is_cutlass(source), timeout_s=max(600.0, ctx.settings.gate_timeout_s),
                                display=ctx.display)
    device = "cuda" if ctx.gpu else "cpu"

    def run_child(req: dict[str, Any]) -> dict[str, Any]:
        return run_harness(req, gate="compile", timeout_s=max(300.0, ctx.settings.gate_timeout_s), path=ctx.display,
                           workdir=ctx.work)

    return build.build_triton(ctx.kernel, ctx.ref, ctx.settings.dims, ctx.settings.seeds[0], ctx.arch, root,
                              device, ctx.env.get("packages", {}).get("triton"), run_child, display=ctx.display)


def gate_compile(ctx: Context, param: Any = None) -> Outcome:
    """Compile the kernel for the target arch (content-addressed cache)."""
    res = ensure_built(ctx)
    figures = {"arch": ctx.arch, "cache_hit": res.cache_hit, "compile_s": round(res.seconds, 3), "build_key": res.key}
    where = res.artifact if not res.cubins else f"{len(res.cubins)} cubin(s) in {res.artifact}"
    return Outcome(figures, f"{'cache hit' if res.cache_hit else f'built in {res.seconds:.1f} s'}: {where}",
                   (res.artifact,))


# --------------------------------------------------------------------------------------------- GPU gates


def _device_for(ctx: Context, gate: str) -> str:
    """``cuda`` with a GPU; ``cpu`` for Triton through its interpreter; otherwise Blocked with the reason."""
    if ctx.gpu:
        return "cuda"
    if ctx.kind == "triton" and gate == "correctness":
        return "cpu"
    raise Blocked("hardware", f"no GPU: {ctx.env.get('gpu_error') or 'no CUDA device'}")


def _blocked_build(ctx: Context) -> build.BuildResult:
    try:
        return ensure_built(ctx)
    except (CompileError, HardwareError) as exc:
        raise Blocked("compile", exc.message) from None


def _request(ctx: Context, mode: str, device: str, seed: int, res: build.BuildResult) -> dict[str, Any]:
    params = [{"name": p.name, "dtype": p.dtype, "role": p.role} for p in preflight(ctx)]
    env: dict[str, str] = {}
    if ctx.kind == "triton":
        env["TRITON_CACHE_DIR"] = str(Path(res.artifact))
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"
    return {"mode": mode, "kind": ctx.kind, "kernel": str(ctx.kernel), "library": res.artifact, "params": params,
            "ref": str(ctx.ref), "dims": ctx.settings.dims, "seed": seed, "device": device,
            "atol": ctx.settings.atol, "rtol": ctx.settings.rtol, "arch": ctx.arch, "env": env, "timing": TIMING}


def _fingerprint(ctx: Context, res: build.BuildResult, seed: int, device: str) -> str:
    h = hashlib.sha256()
    for part in (res.key, ctx.ref.read_bytes(), json.dumps(ctx.settings.dims, sort_keys=True), str(seed), device,
                 str(ctx.settings.atol), str(ctx.settings.rtol)):
        h.update(part if isinstance(part, bytes) else part.encode())
    return h.hexdigest()[:24]


def gate_correctness(ctx: Context, seed: int) -> Outcome:
    """One seed: fresh inputs, NaN-poisoned outputs, reference on pristine copies, element-wise
    |out - ref| <= atol + rtol*|ref|. Writes ``correctness/seed_<S>.json``. Raises IncorrectError (exit 2)."""
    device = _device_for(ctx, "correctness")
    res = _blocked_build(ctx)
    record_path = ctx.outdir / "correctness" / f"seed_{seed}.json"
    record: dict[str, Any] = {"seed": seed, "device": device, "fingerprint": _fingerprint(ctx, res, seed, device),
                              "passed": False}
    try:
        outcome = _check_seed(ctx, res, seed, device, record)
        record["passed"] = True
        return outcome
    except KoptError as exc:
        record["status"], record["message"] = exc.status, exc.message
        raise
    finally:
        _write_json(record_path, record)


def _check_seed(ctx: Context, res: build.BuildResult, seed: int, device: str, record: dict[str, Any]) -> Outcome:
    import numpy as np

    req = _request(ctx, "correctness", device, seed, res)
    result = run_harness(req, gate="correctness", timeout_s=ctx.settings.gate_timeout_s, path=ctx.display,
                         workdir=ctx.work)
    npz = result["out"] + ".npz"
    atol, rtol = result["atol"], result["rtol"]
    worst: dict[str, Any] = {"max_abs_err": 0.0, "max_rel_err": 0.0, "mismatched": 0}
    failures = []
    with np.load(npz) as data:
        for name in result["outputs"]:
            try:
                cmp = compare(name, data[f"cand__{name}"], data[f"ref__{name}"], atol, rtol)
            except ValueError as exc:
                raise IncorrectError(str(exc), gate="correctness", path=ctx.display) from None
            worst["max_abs_err"] = max(worst["max_abs_err"], cmp.max_abs_err)
            worst["max_rel_err"] = max(worst["max_rel_err"], cmp.max_rel_err)
            worst["mismatched"] += cmp.mismatched
            if not cmp.ok:
                failures.append(cmp.describe(atol, rtol))
    os.unlink(npz)
    record.update(worst, atol=atol, rtol=rtol, tol_source=result["tol_source"])
    figures = {"seed": seed, "device": device, "atol": atol, "rtol": rtol, **worst}
    if failures:
        raise IncorrectError(f"seed={seed}: output differs from the reference", gate="correctness", path=ctx.display,
                             details="\n".join(failures) + f"\n(tolerances from {result['tol_source']}; replay: "
                             f"--kopt-seeds {seed})", fix="fix the kernel; the indices above show where it is wrong")
    how = "interpreter (TRITON_INTERPRET=1)" if device == "cpu" else device
    return Outcome(figures, f"seed={seed} on {how}: max abs err {worst['max_abs_err']:.3g}, "
                            f"max rel err {worst['max_rel_err']:.3g} (atol={atol:g}, rtol={rtol:g})")


def _require_correct(ctx: Context, res: build.BuildResult, device: str) -> None:
    """Blocked unless every validation seed passed correctness for this exact build (runs missing seeds now)."""
    for seed in ctx.settings.seeds:
        path = ctx.outdir / "correctness" / f"seed_{seed}.json"
        rec = json.loads(path.read_text()) if path.is_file() else None
        if rec is None or rec.get("fingerprint") != _fingerprint(ctx, res, seed, device):
            try:
                gate_correctness(ctx, seed)
            except KoptError as exc:
                raise Blocked("correctness", f"seed={seed}: {exc.message}") from None
        elif not rec.get("passed"):
            raise Blocked("correctness", f"seed={seed}: {rec.get('message', 'failed')}")


def gate_timing(ctx: Context, param: Any = None) -> Outcome:
    """CUDA-event timing of the kernel and of the reference (L2 flushed before each call); median, robust CV,
    stability (SKILL.md). Writes ``bench.json``. Raises TimingError when unstable (robust CV > 0.10)."""
    device = _device_for(ctx, "timing")
    res = _blocked_build(ctx)
    _require_correct(ctx, res, device)
    req = _request(ctx, "timing", device, ctx.settings.seeds[0], res)
    result = run_harness(req, gate="timing", timeout_s=max(ctx.settings.gate_timeout_s, 120.0), path=ctx.display,
                         workdir=ctx.work)
    k = stats.summarize(result["kernel_ms"])
    r = stats.summarize(result["reference_ms"])
    wm = result.get("workload") or {}
    figures: dict[str, Any] = {"median_ms": k.median_ms, "mean_ms": k.mean_ms, "min_ms": k.min_ms,
                               "robust_cv": round(k.robust_cv, 5), "stability": k.stability, "samples": k.n,
                               "ref_median_ms": r.median_ms, "speedup_vs_ref": r.median_ms / k.median_ms}
    if wm.get("flops") is not None:
        figures["gflops"] = wm["flops"] / (k.median_ms * 1e-3) / 1e9
    if wm.get("bytes_min") is not None:
        figures["gbytes_per_s"] = wm["bytes_min"] / (k.median_ms * 1e-3) / 1e9
    timing_valid = k.stability != "unstable"
    bench = {"kernel": str(ctx.kernel), "dims": ctx.settings.dims, "requested_dims": ctx.settings.dims,
             "realized_dims": ctx.settings.dims, "arch": ctx.arch, "gpu": result.get("gpu"),
             "compile_pass": True, "contract_pass": True, "correctness_pass": True, "race_safe": None,
             "timing_valid": timing_valid, "average_ms": k.mean_ms, "median_ms": k.median_ms,
             "robust_cv": k.robust_cv, "stability": k.stability, "samples_ms": result["kernel_ms"],
             "reference": {"median_ms": r.median_ms, "robust_cv": r.robust_cv, "samples_ms": result["reference_ms"]},
             "speedup_vs_ref": figures["speedup_vs_ref"], "workload": wm or None,
             "gflops": figures.get("gflops"), "gbytes_per_s": figures.get("gbytes_per_s"),
             "timing_method": {**TIMING, "clock": "cuda_events", "l2_flush_bytes": result.get("flush_bytes")},
             "seeds": list(ctx.settings.seeds), "timing_seed": ctx.settings.seeds[0]}
    path = _write_json(ctx.outdir / "bench.json", bench)
    if not timing_valid:
        raise TimingError(f"timing is unstable: robust CV {k.robust_cv:.3f} > 0.10 over {k.n} samples "
                          f"(median {k.median_ms:.4f} ms)", gate="timing", path=ctx.display,
                          fix="make sure nothing else runs on the GPU; a kernel of a few µs needs more samples")
    extra = f", {figures['gflops']:.1f} GFLOP/s" if "gflops" in figures else ""
    return Outcome(figures, f"median {k.median_ms:.4f} ms (robust CV {k.robust_cv:.3f}, {k.stability}, n={k.n}), "
                            f"reference {r.median_ms:.4f} ms, speedup {figures['speedup_vs_ref']:.2f}x{extra}", (path,))


def gate_ncu(ctx: Context, param: Any = None) -> Outcome:
    """Profile one call of the kernel (NVTX range only) with ncu; keep ``kernel.ncu-rep``, write ``ncu_top.json``.
    Skips when counters cannot be read (ERR_NVGPUCTRPERM); raises ProfilerError (exit 3) otherwise."""
    device = _device_for(ctx, "ncu")
    ncu = _tool(ctx, "ncu")
    if not ncu:
        raise Blocked("hardware", "ncu (Nsight Compute) not found; install it or put it on PATH")
    res = _blocked_build(ctx)
    _require_correct(ctx, res, device)
    ctx.outdir.mkdir(parents=True, exist_ok=True)
    report = ctx.outdir / "kernel.ncu-rep"
    req = _request(ctx, "profile", device, ctx.settings.seeds[0], res)
    result = run_harness(req, gate="ncu", timeout_s=ctx.settings.ncu_timeout_s, path=ctx.display, workdir=ctx.work,
                         prefix=profile.ncu_prefix(ncu, report.with_suffix("")))
    profile.check_ncu_output(result.get("stdout", ""))
    if not report.is_file():
        from .errors import ProfilerError
        raise ProfilerError("ncu wrote no report (no kernel ran inside the kopt_target range?)", gate="ncu",
                            path=ctx.display, details=result.get("stdout", "")[-2000:])
    top = profile.summarize_launches(profile.import_report(ncu, report))
    top["report"] = str(report)
    path = _write_json(ctx.outdir / "ncu_top.json", top)
    main = max(top["launches"], key=lambda r: r["metrics"]["duration_ns"] or 0.0)  # type: ignore[index, union-attr]
    m = main["metrics"]
    figures = {"ncu_duration_ms": top["duration_ms"], "kernels": len(top["launches"]),  # type: ignore[arg-type]
               "target_kernel": main["kernel"]}
    for key in ("sm_throughput_pct", "dram_throughput_pct", "achieved_occupancy_pct", "registers_per_thread"):
        if m.get(key) is not None:
            figures[key] = m[key]
    return Outcome(figures, f"{main['kernel']}: {top['duration_ms']:.4f} ms, SM {m.get('sm_throughput_pct')}%, "
                            f"DRAM {m.get('dram_throughput_pct')}%, occupancy {m.get('achieved_occupancy_pct')}%",
                   (str(report), path))


def gate_sass(ctx: Context, param: Any = None) -> Outcome:
    """``cuobjdump --dump-sass`` of the build, one ``sass/<function>.sass`` per kernel function."""
    res = _blocked_build(ctx)
    artifacts = list(res.cubins) if res.cubins else [res.artifact]
    functions = sass.dump_sass(_tool(ctx, "cuobjdump"), artifacts)
    paths = sass.save_sass(functions, ctx.outdir / "sass")
    total = sum(f.instructions for f in functions)
    figures = {"functions": len(functions), "instructions": total, "sass_arch": functions[0].arch}
    names = ", ".join(f"{f.name} ({f.instructions} insns)" for f in functions[:4])
    return Outcome(figures, f"{functions[0].arch}: {names}", tuple(paths))


# --------------------------------------------------------------------------------------------- the table


@dataclass(frozen=True, slots=True)
class Gate:
    """One row of the gate table: ``serial`` gates use the GPU and run one at a time (one xdist group);
    ``per_seed`` gates get one item per correctness seed; ``artifact`` names what the gate writes."""

    name: str
    fn: Callable[[Context, Any], Outcome]
    requires: str | None
    serial: bool
    per_seed: bool = False
    artifact: str = ""


GATES: tuple[Gate, ...] = (
    Gate("hardware", gate_hardware, None, False, artifact="env.json"),
    Gate("preflight", gate_preflight, "hardware", False),
    Gate("compile", gate_compile, "preflight", False, artifact="build cache"),
    Gate("correctness", gate_correctness, "compile", True, per_seed=True, artifact="correctness/seed_<S>.json"),
    Gate("timing", gate_timing, "correctness", True, artifact="bench.json"),
    Gate("ncu", gate_ncu, "correctness", True, artifact="kernel.ncu-rep, ncu_top.json"),
    Gate("sass", gate_sass, "compile", False, artifact="sass/<function>.sass"),
)
GATE_ORDER = {g.name: i for i, g in enumerate(GATES)}
