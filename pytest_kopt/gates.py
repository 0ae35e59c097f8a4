"""The ordered table of gates and their logic over plain data (no pytest here).

Each gate is ``fn(ctx, param) -> Outcome`` and raises a :class:`~pytest_kopt.errors.KoptError` when it decides
against the kernel, or :class:`~pytest_kopt.errors.Blocked` when a prerequisite is missing (a skip). Gates talk
through artifacts on disk (build cache, ``<outdir>/<stem>/``), so they work across xdist workers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import io
import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import build, contract, hardware, profile, sass, stats
from . import loop as loop_mod
from . import roofline as roofline_mod
from . import gpus as gpus_mod
from .ncu_csv import metric_value
import warnings

from filelock import FileLock

from .errors import (Blocked, CompileError, ContractError, HardwareError, IncorrectError, KernelRuntimeError, KoptError,
                     NotApplicable, ProfilerError, TimingError)
from .inputs import DEFAULT_REGIMES, REGIMES, derive_seeds, draw_plan
from .verdict import judge, tolerance_warnings


class KoptToleranceWarning(UserWarning):
    """The reference's tolerance would pass a lower-precision (bf16/fp16) computation of an fp32/fp64 task."""
from .runner import prestart, run_harness
from .settings import DEFAULT_ARCH, Settings


class KoptDimsWarning(UserWarning):
    """A --kopt-dims entry that no function or solve() parameter names (likely a typo); never a failure."""


#: Timing policy: warmup 100 ms of wall time; then samples until the median's relative standard error is under
#: 0.5% (nvbench's default noise target) with at least 10 samples and 0.2 s, or 2 s / 2000 samples; up to 8
#: rotating input sets within a quarter of the free device memory.
TIMING = {"warmup_ms": 100.0, "min_samples": 10, "min_time_s": 0.2, "budget_s": 2.0, "max_samples": 2000,
          "target_rse": 0.005, "max_sets": 8, "mem_fraction": 0.25}


#: Calls per CUDA graph in ``--kopt-timing graph`` (each after its own L2 flush).
GRAPH_CALLS = 20
#: Seconds of samples one party takes per round of an interleaved measurement (candidate vs reference).
ROUND_S = 0.05


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
        """``cuda`` for ``.cu`` (CUDA or CUTLASS); for ``.py``: ``triton`` when it has a ``@triton.jit`` kernel,
        else ``python`` (a pure-Python/torch candidate with the same setup/run_kernel contract)."""
        if self.kernel.suffix != ".py":
            return "cuda"
        return "triton" if contract.read_python(self.kernel).uses_triton_jit else "python"

    @property
    def outdir(self) -> Path:
        """``<outdir>/<label>/`` (label: the kernel's stem, made unique): bench.json, ncu_top.json, the
        .ncu-rep, sass/, correctness/."""
        return self.settings.artifact_dir(self.kernel)

    def _ref_constant(self, name: str) -> Any:
        try:
            return contract.read_python(self.ref).constants.get(name)
        except ContractError:
            return None  # the preflight item reports the broken file; collection must not crash on it

    @property
    def regimes(self) -> tuple[str, ...]:
        """Value regimes for drawn inputs: the reference's ``regimes`` list, else the defaults."""
        value = self._ref_constant("regimes")
        if isinstance(value, (list, tuple)) and value and all(r in REGIMES for r in value):
            return tuple(value)
        return DEFAULT_REGIMES

    @property
    def extra_dims(self) -> list[dict[str, Any]]:
        """Boundary shapes: the reference's ``extra_dims`` literal (a list of dicts of dims, repeats dropped)."""
        value = self._ref_constant("extra_dims")
        if not isinstance(value, (list, tuple)):
            return []
        out: list[dict[str, Any]] = []
        for d in value:
            if isinstance(d, dict) and d not in out:
                out.append(dict(d))
        return out

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
        """Scratch folder for this kernel's harness requests and outputs (one per kernel, so a kernel's files are not
        in a folder another kernel's process is working in)."""
        return self.cache_dir / "work" / hashlib.sha256(str(self.kernel).encode()).hexdigest()[:16]


def _tool(ctx: Context, name: str) -> str | None:
    return (ctx.env.get("tools", {}).get(name) or {}).get("path")


def _write_json(path: Path, data: Any) -> str:
    """Atomic write (see :func:`pytest_kopt.loop.write_json`); returns the path as a string."""
    loop_mod.write_json(path, data)
    return str(path)


# --------------------------------------------------------------------------------------------- hardware


def gate_hardware(ctx: Context, param: Any = None) -> Outcome:
    """Report the detected environment and write ``<outdir>/env.json``.

    Fails (HardwareError, exit 3) only when a tool the kernel cannot do without is missing: nvcc for a ``.cu``.
    No GPU is not a failure here: the GPU gates skip with the reason."""
    env = ctx.env
    # the session's document, the same from every xdist worker (each one's own GPU is in this item's figures)
    path = _write_json(ctx.settings.outdir / "env.json", gpus_mod.session_view(env))
    if ctx.kind == "cuda" and not _tool(ctx, "nvcc"):
        raise HardwareError("nvcc not found, so the .cu kernel cannot be built", gate="hardware",
                            fix="install the CUDA toolkit or set CUDA_HOME")
    if ctx.kind == "triton" and not env.get("packages", {}).get("triton"):
        raise HardwareError("triton is not installed, so the Triton kernel cannot be built", gate="hardware",
                            fix="pip install triton")
    g = env.get("gpu") or {}
    figures = {"gpu": g.get("name", "none"), "sm_arch": ctx.arch, "gpu_count": len(env.get("gpus", [])),
               "generation_allowed": env.get("generation_allowed")}
    line = hardware.header_line(env)
    if env.get("pinned"):
        figures.update(gpu_uuid=g.get("uuid"), gpu_index=g.get("index"))
        line += f"; this worker's GPU: {g.get('index')} ({g.get('uuid')})"
    return Outcome(figures, line, (path,))


# --------------------------------------------------------------------------------------------- preflight


def preflight(ctx: Context) -> list[contract.Param]:
    """The static contract check, shared by every later gate. Returns ``solve``'s parameters ([] for Triton).
    Raises ContractError (exit 4)."""
    c = contract.check_reference(ctx.ref)
    regimes = c.constants.get("regimes")
    if "regimes" in c.constants and (not isinstance(regimes, (list, tuple)) or not regimes
                                     or any(r not in REGIMES for r in regimes)):
        raise ContractError(f"regimes = {regimes!r} is not a list of {', '.join(REGIMES)}", gate="preflight",
                            path=str(ctx.ref), fix='e.g. regimes = ["normal", "uniform", "small_int", "wide"]')
    extra = c.constants.get("extra_dims")
    if "extra_dims" in c.constants and (not isinstance(extra, (list, tuple)) or not all(
            isinstance(d, dict) and all(isinstance(v, (int, float)) for v in d.values()) for d in extra)):
        raise ContractError(f"extra_dims = {extra!r} is not a list of dicts of numbers", gate="preflight",
                            path=str(ctx.ref), fix='e.g. extra_dims = [{"M": 1, "N": 1}, {"M": 127, "N": 33}]')
    if ctx.kind in ("triton", "python"):
        contract.check_triton(ctx.kernel, ctx.settings.dims, require_jit=ctx.kind == "triton")
        return []
    source = ctx.kernel.read_text(errors="replace")
    try:
        params = contract.parse_solve_signature(source, ctx.display)
    except ContractError as exc:
        # solve() may live in a local header the .cu includes
        params = None
        for header in build.local_headers(ctx.kernel):
            try:
                params = contract.parse_solve_signature(header.read_text(errors="replace"), str(header))
                break
            except ContractError:
                continue
        if params is None:
            raise exc from None
    contract.check_dims(params, ctx.settings.dims, ctx.display)
    for p in params:
        if p.is_pointer:
            continue
        if p.dtype in ("float16", "bfloat16"):
            raise ContractError(f"solve() scalar `{p.ctype} {p.name}` cannot be passed from the host by value "
                                "through the C ABI", gate="preflight", path=ctx.display, line=p.line,
                                fix=f"take `float {p.name}` and convert inside solve()")
        v = ctx.settings.dims[p.name]
        bits = {"int8": 8, "int16": 16, "int32": 32, "int64": 64, "uint8": 8, "uint32": 32, "uint64": 64}.get(p.dtype)
        if bits and isinstance(v, int):
            lo, hi = (0, 2**bits - 1) if p.dtype.startswith("u") else (-(2**(bits - 1)), 2**(bits - 1) - 1)
            if not lo <= v <= hi or v < 0:
                raise ContractError(f"--kopt-dims {p.name}={v} does not fit solve()'s `{p.ctype} {p.name}` as a "
                                    "non-negative size", gate="preflight", path=ctx.display, line=p.line,
                                    fix=f"give {p.name} a value in [0, {hi}]")
    ref_params, ref_kwargs, line = c.functions["reference"]
    known = {p.name for p in params} | set(ctx.settings.dims)
    unknown = [n for n in ref_params if n not in known]
    if unknown and not ref_kwargs:
        raise ContractError(f"reference() takes {', '.join(unknown)}, which solve() and --kopt-dims do not provide "
                            f"(solve's buffers: {', '.join(p.name for p in params if p.is_pointer)})",
                            gate="preflight", path=str(ctx.ref), line=line,
                            fix="name reference()'s parameters after solve()'s, or accept **kwargs")
    return params


def gate_preflight(ctx: Context, param: Any = None) -> Outcome:
    """Check the kernel and reference contracts without running anything. Dims that nothing names (see
    :func:`pytest_kopt.contract.unused_dims`) give a KoptDimsWarning and a note in the summary."""
    params = preflight(ctx)
    pys = [contract.read_python(ctx.ref)] + ([contract.read_python(ctx.kernel)] if ctx.kernel.suffix == ".py" else [])
    unused = contract.unused_dims(ctx.settings.dims, params, *pys)
    note = ""
    if unused:
        note = f"; --kopt-dims {', '.join(unused)} not named by solve(), setup() or ref.py (a typo?)"
        warnings.warn(KoptDimsWarning(f"{ctx.display}: {note[2:]}"), stacklevel=1)
    if ctx.kind in ("triton", "python"):
        what = "@triton.jit kernel" if ctx.kind == "triton" else "no @triton.jit: pure-Python candidate"
        return Outcome({"kind": ctx.kind}, f"{ctx.kind}: setup/run_kernel found ({what}); ref.reference found{note}")
    kind = "cutlass" if contract.is_cutlass(ctx.kernel.read_text(errors="replace")) else "cuda"
    sig = ", ".join(f"{'const ' if p.is_const else ''}{p.ctype}{'*' if p.is_pointer else ''} {p.name}" for p in params)
    return Outcome({"kind": kind, "inputs": sum(p.role == "input" for p in params),
                    "outputs": sum(p.role == "output" for p in params)}, f"solve({sig}){note}")


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
    failed = ctx.outdir / "compile_error.json"
    mark = _sha(local_sources(ctx.kernel), ctx.kernel.read_bytes(), ctx.arch, ctx.env.get("tools"),
                ctx.env.get("packages"), ctx.settings.dims if ctx.kind == "triton" else None)
    if failed.is_file():
        rec = json.loads(failed.read_text())
        if rec.get("mark") == mark:  # the same sources failed already in this or an earlier session: not again
            raise CompileError(rec["message"], gate="compile", path=ctx.display, line=rec.get("line"),
                               details=rec.get("details"), fix=rec.get("fix"), status=rec.get("status"))
    try:
        return _build(ctx, root)
    except CompileError as exc:
        _write_json(failed, {"mark": mark, "message": exc.message, "line": exc.line, "details": exc.details,
                             "fix": exc.fix, "status": exc.status})
        raise


def _build(ctx: Context, root: Path) -> build.BuildResult:
    if ctx.kind == "python":
        return build.BuildResult(str(ctx.kernel), _sha(ctx.kernel.read_bytes()), True, 0.0, [], "")
    if ctx.kind == "cuda":
        source = ctx.kernel.read_text(errors="replace")
        nvcc = _tool(ctx, "nvcc")
        return build.build_cuda(ctx.kernel, ctx.arch, root, nvcc, (ctx.env["tools"].get("nvcc") or {}).get("version"),
                                contract.is_cutlass(source), timeout_s=max(600.0, ctx.settings.gate_timeout_s),
                                display=ctx.display)
    device = "cuda" if ctx.gpu else "cpu"

    def run_child(req: dict[str, Any]) -> dict[str, Any]:
        req = {**req, "plan": draw_plan(ctx.settings.seeds[0], 0, ctx.regimes)}
        # the run of run_kernel gets --kopt-timeout; the compile of its kernels 120 s more
        return run_harness(req, gate="compile", timeout_s=ctx.settings.gate_timeout_s + 120.0, path=ctx.display,
                           workdir=ctx.work)

    return build.build_triton(ctx.kernel, ctx.ref, ctx.settings.dims, ctx.settings.seeds[0], ctx.arch, root,
                              device, ctx.env.get("packages", {}).get("triton"), run_child, display=ctx.display)


def gate_compile(ctx: Context, param: Any = None) -> Outcome:
    """Compile the kernel for the target arch (content-addressed cache)."""
    if ctx.kind == "python":
        _blocked_by_preflight(ctx)
        raise NotApplicable("pure-Python candidate (no @triton.jit kernel): nothing to compile")
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
    if ctx.kind in ("triton", "python") and gate == "correctness":
        return "cpu"
    raise Blocked("hardware", f"no GPU: {ctx.env.get('gpu_error') or 'no CUDA device'}")


def _blocked_build(ctx: Context) -> build.BuildResult:
    try:
        return ensure_built(ctx)
    except (CompileError, HardwareError) as exc:
        raise Blocked("compile", exc.message) from None


def _request(ctx: Context, mode: str, device: str, seed: int, res: build.BuildResult,
             dims: dict[str, Any] | None = None, index: int = 0) -> dict[str, Any]:
    dims = ctx.settings.dims if dims is None else dims
    params = [{"name": p.name, "dtype": p.dtype, "role": p.role} for p in preflight(ctx)]
    env: dict[str, str] = {}
    if ctx.kind in ("triton", "python"):
        env["TRITON_CACHE_DIR"] = str(Path(res.artifact)) if ctx.kind == "triton" else str(ctx.cache_dir / "triton")
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"
    return {"mode": mode, "kind": ctx.kind, "kernel": str(ctx.kernel), "library": res.artifact, "params": params,
            "ref": str(ctx.ref), "dims": dims, "seed": seed, "seed_b": derive_seeds(seed, 1)[0], "device": device,
            "plan": draw_plan(seed, index, ctx.regimes), "atol": ctx.settings.atol, "rtol": ctx.settings.rtol,
            "arch": ctx.arch, "env": env,
            "timing": {**TIMING, "method": ctx.settings.timing_method, "graph_calls": GRAPH_CALLS,
                       "mem_fraction": ctx.settings.rotating_memory,
                       # a .cu solve() launches on the legacy default stream: a capture on torch's capture stream
                       # would run it eagerly instead of recording it, so its graph mode queues the pairs
                       "capture": ctx.kind != "cuda"}}


def _server(ctx: Context, role: str) -> str | None:
    """Identity of the warm harness process for a request (:class:`pytest_kopt.runner.HarnessServer`): one per
    candidate kernel (``candidate``) and one per reference file (``reference``), so a candidate never runs in the
    reference's process or another candidate's; None with ``--kopt-fresh-process``."""
    if ctx.settings.fresh_process:
        return None
    return f"candidate:{ctx.kernel}" if role == "candidate" else f"reference:{ctx.ref}"


def local_sources(path: Path) -> bytes:
    """The bytes of every ``.py`` file beside ``path`` (a reference or kernel may import its neighbours), so a
    cache key changes when a helper module does."""
    h = hashlib.sha256()
    for f in sorted(path.parent.glob("*.py")):
        try:
            h.update(f.name.encode() + f.read_bytes())
        except OSError:
            continue
    return h.digest()


#: Per-session key of the MACs on cached results (reference outputs and timings, correctness records). A child
#: process (a candidate) can write files where those live but cannot sign them, so an entry this session did not
#: write is recomputed, never trusted. Never passed to a harness child; the xdist controller hands it to its
#: workers (``workerinput``), so a worker reuses another's reference outputs and the controller (which profiles
#: the loop's champion) accepts the workers' correctness records instead of re-running every seed.
_CACHE_KEY = os.urandom(32)


def session_key() -> str:
    """This session's MAC key as hex, for the xdist controller to hand to its workers (never to a child)."""
    return _CACHE_KEY.hex()


def use_session_key(key_hex: str) -> None:
    """Adopt the controller's MAC key (xdist worker). Raises ValueError unless it is 64 hex digits."""
    global _CACHE_KEY
    key = bytes.fromhex(key_hex)
    if len(key) != 32:
        raise ValueError(f"a session key is 32 bytes, got {len(key)}")
    _CACHE_KEY = key


def _mac(*parts: Any) -> str:
    """HMAC-SHA256 under :data:`_CACHE_KEY` of ``parts`` (bytes, or anything JSON can encode)."""
    h = hmac.new(_CACHE_KEY, digestmod="sha256")
    for part in parts:
        h.update(part if isinstance(part, bytes) else json.dumps(part, sort_keys=True, default=str).encode())
        h.update(b"\x00")
    return h.hexdigest()


def read_verified(path: Path, sha: str | None, gate: str, display: str) -> bytes:
    """The bytes of a trusted process's file, read once, whose SHA-256 must be ``sha`` (sent on that process's
    private control pipe, or MAC'd in a cache entry). Everything is then judged from these bytes, never from the
    file again: another process of the same user could rewrite it at any time, even through a shared mapping that
    leaves its mtime and ctime alone. Raises KernelRuntimeError (TAMPERED) when the hash differs or none came."""
    data = path.read_bytes()
    if sha is None or not hmac.compare_digest(hashlib.sha256(data).hexdigest(), sha):
        raise KernelRuntimeError(f"the reference's outputs ({path.name}) changed after its process wrote them",
                                 gate=gate, path=display, status="TAMPERED",
                                 fix="a kernel (or a process it left running) wrote into the kopt work or cache "
                                     "folder; run the kernels in separate sessions to see which one")
    return data


def _sha(*parts: Any) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else json.dumps(part, sort_keys=True, default=str).encode())
    return h.hexdigest()[:24]


def reference_outputs(ctx: Context, req: dict[str, Any], cand: dict[str, Any]) -> dict[str, Any]:
    """Run (or reuse) the reference in its own child process on the candidate's spec; returns ``{"npz",
    "tolerances"}``. Cached under ``<cache>/refs/<key>`` where the key covers the reference file, spec, scalars,
    plan, seeds, dims, device, tolerance overrides and any integer inputs taken from ``setup``. The tolerance-sanity
    warnings (:func:`pytest_kopt.verdict.tolerance_warnings`) are computed once here and kept in the entry."""
    import numpy as np

    key = _sha(local_sources(ctx.ref), cand["spec"], cand.get("scalars"), req["plan"], req["seed"], req["seed_b"],
               req["dims"], req["device"], req["atol"], req["rtol"], cand.get("setup_sha"))
    folder = ctx.cache_dir / "refs"
    folder.mkdir(parents=True, exist_ok=True)
    meta = folder / f"{key}.json"
    with FileLock(str(folder / f"{key}.lock")):
        if meta.is_file() and (folder / f"{key}.npz").is_file():
            try:
                entry = json.loads(meta.read_text())
                ok = hmac.compare_digest(str(entry.get("mac")), _mac(entry["sha256"], entry["tolerances"],
                                                                     entry["tolerance_warnings"]))
                data = read_verified(folder / f"{key}.npz", entry["sha256"], "correctness", ctx.display) \
                    if ok else b""
            except (OSError, ValueError, KeyError, KoptError):
                ok = False
            if ok:  # written by this session, the content unchanged since
                return {**entry, "npz": str(folder / f"{key}.npz"), "npz_bytes": data, "cache_hit": True}
        rreq = {**req, "mode": "reference", "spec": cand["spec"], "scalars": cand.get("scalars", {}),
                "setup_npz": cand.get("npz"), "env": {}}
        for attempt in (1, 2):  # a file changed under it is computed once more, then reported
            result = run_harness(rreq, gate="correctness", timeout_s=max(ctx.settings.gate_timeout_s, 120.0),
                                 path=str(ctx.ref), workdir=ctx.work, lock=device_lock(ctx, req["device"]),
                                 server=_server(ctx, "reference"))
            os.replace(result["npz"], folder / f"{key}.npz")
            try:  # checked against the hash its process sent; judged from these bytes only
                data = read_verified(folder / f"{key}.npz", result.get("npz_sha"), "correctness", ctx.display)
                break
            except KernelRuntimeError:
                if attempt == 2:
                    raise
        tols = {n: (t["atol"], t["rtol"]) for n, t in result["tolerances"].items()}
        with np.load(io.BytesIO(data)) as z:
            warns = tolerance_warnings(list(tols), LazyArrays(z), tols)
        sha = hashlib.sha256(data).hexdigest()
        _write_json(meta, {"tolerances": result["tolerances"], "tolerance_warnings": warns, "sha256": sha,
                           "mac": _mac(sha, result["tolerances"], warns)})
        return {"tolerances": result["tolerances"], "tolerance_warnings": warns, "npz": str(folder / f"{key}.npz"),
                "npz_bytes": data, "cache_hit": False}


class LazyArrays(Mapping):
    """A read-only mapping over the members of open ``np.load`` npz files, each read on first access and kept;
    later files win on a repeated name."""

    def __init__(self, *npz: Any) -> None:
        self._src = {name: z for z in npz for name in z.files}
        self._cache: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._cache:
            self._cache[name] = self._src[name][name]
        return self._cache[name]

    def __iter__(self) -> Any:
        return iter(self._src)

    def __len__(self) -> int:
        return len(self._src)


def _fingerprint(ctx: Context, res: build.BuildResult, case: dict[str, Any], device: str) -> str:
    return _sha(res.key, local_sources(ctx.ref), local_sources(ctx.kernel), ctx.settings.dims, case, device,
                ctx.settings.atol,
                ctx.settings.rtol, ctx.regimes)


def correctness_cases(ctx: Context) -> list[dict[str, Any]]:
    """One case per validation seed (``index``, ``seed``, ``dims`` None = the session's), then one per entry of
    the reference's ``extra_dims`` (boundary shapes) with the first seed."""
    cases: list[dict[str, Any]] = [{"index": i, "seed": s, "dims": None} for i, s in enumerate(ctx.settings.seeds)]
    for j, extra in enumerate(ctx.extra_dims):
        cases.append({"index": len(cases), "seed": ctx.settings.seeds[0], "dims": {**ctx.settings.dims, **extra}})
    return cases


_GUARD_STATUS = {"not_a_tensor": ("NOT_A_TENSOR", "an output or input is no longer a plain torch.Tensor"),
                 "buffer_replaced": ("OUTPUT_REPLACED", "the call replaced a buffer's storage instead of writing "
                                                        "into it (aliasing another tensor?)"),
                 "input_mutated": ("INPUT_MUTATED", "the call modified its inputs")}


def gate_correctness(ctx: Context, case: dict[str, Any]) -> Outcome:
    """One case: harness-owned inputs drawn from the seed's plan, outputs NaN-poisoned before every call, three
    candidate calls (twice on set A, once on set B in the same buffers), the reference in its own process, and the
    guards of :func:`pytest_kopt.verdict.judge`. Writes ``correctness/<case>.json``. Raises IncorrectError (with
    the guard's status), KernelRuntimeError (crash, CUDA error, TIMEOUT) or ContractError."""
    device = _device_for(ctx, "correctness")
    res = _blocked_build(ctx)
    record_path = ctx.outdir / "correctness" / f"{case_label(case)}.json"
    record: dict[str, Any] = {"case": case, "device": device, "fingerprint": _fingerprint(ctx, res, case, device),
                              "passed": False}
    try:
        outcome = _check_case(ctx, res, case, device, record)
        record["passed"] = True
        return outcome
    except KoptError as exc:
        record["status"], record["message"] = exc.status, exc.message
        raise
    finally:
        record["mac"] = _mac(record["fingerprint"], record["passed"])
        _write_json(record_path, record)


def case_label(case: dict[str, Any]) -> str:
    """``seed=7`` for a seed case, ``M=1,N=1,K=1`` for a boundary-shape case (its dims that differ)."""
    if case.get("dims"):
        return ",".join(f"{k}={v}" for k, v in case["dims"].items())
    return f"seed={case['seed']}"


def _check_case(ctx: Context, res: build.BuildResult, case: dict[str, Any], device: str,
                record: dict[str, Any]) -> Outcome:
    import numpy as np

    seed = int(case["seed"])
    replay = f"replay: --kopt-seed {ctx.settings.session_seed}" if ctx.settings.session_seed is not None \
        else f"replay: --kopt-seeds {seed}"
    req = _request(ctx, "candidate", device, seed, res, dims=case.get("dims"), index=int(case["index"]))
    prestart(_server(ctx, "reference"), {}, ctx.work)  # its torch import overlaps the candidate's first request
    clock = time.perf_counter()
    cand = run_harness(req, gate="correctness", timeout_s=ctx.settings.gate_timeout_s, path=ctx.display,
                       workdir=ctx.work, lock=device_lock(ctx, device), server=_server(ctx, "candidate"))
    record["plan"] = req["plan"]
    for key, (status, what) in _GUARD_STATUS.items():
        if cand["guards"].get(key):
            raise IncorrectError(f"seed={seed}: {what}: {', '.join(cand['guards'][key])}", gate="correctness",
                                 path=ctx.display, status=status, fix="write results into the output buffers "
                                 "in place and leave the inputs untouched", details=replay)
    # where a seed's wall time goes (s): the candidate's process (inputs, 4 calls, npz), the reference's (cached
    # across candidates), and the judge here; kept in the record to find the next cut (loop-speed issue)
    phase_s = {"candidate": time.perf_counter() - clock, "candidate_save": cand.get("save_s")}
    try:
        clock = time.perf_counter()
        ref = reference_outputs(ctx, req, cand)
        phase_s["reference"] = time.perf_counter() - clock
        clock = time.perf_counter()
        tols = {n: (t["atol"], t["rtol"]) for n, t in ref["tolerances"].items()}
        # which outputs are judged is the reference process's answer, never the candidate's (its process could
        # report no outputs at all); every call's array of each must be there
        outputs = list(ref["tolerances"])
        with np.load(cand["npz"]) as c, np.load(io.BytesIO(ref["npz_bytes"])) as r:
            missing = [f"{p}__{o}" for o in outputs for p in ("cand1", "cand2", "candB", "candC")
                       if f"{p}__{o}" not in c.files]
            if missing or not outputs:
                raise KernelRuntimeError(f"seed={seed}: the candidate's process returned no "
                                         f"{', '.join(missing) or 'outputs'}", gate="correctness",
                                         path=ctx.display, details=f"it reported outputs {cand.get('outputs')}, "
                                         f"the reference {outputs}; {replay}",
                                         fix="the kernel must not touch the harness (its modules, files or pipes)")
            # members are read when the judge asks for them: the low-precision references (their warnings come
            # with the cached reference) and set B's fresh-buffer outputs (needed only on a failure) stay on disk
            v = judge(outputs, LazyArrays(c, r), tols, check_tolerance=False)
        phase_s["judge"] = time.perf_counter() - clock
    finally:
        if os.path.exists(cand["npz"]):
            os.unlink(cand["npz"])
    if v.ok:
        v = dataclasses.replace(v, warnings=(*v.warnings, *ref["tolerance_warnings"]))
    for w in v.warnings:
        warnings.warn(KoptToleranceWarning(f"{ctx.display}: {w}"), stacklevel=1)
    first = next(iter(ref["tolerances"].values()))
    atol, rtol = first["atol"], first["rtol"]
    record.update(v.figures, status=v.status, atol=atol, rtol=rtol, warnings=list(v.warnings),
                  reference_cache_hit=ref["cache_hit"],
                  phase_s={k: round(x, 3) for k, x in phase_s.items() if x is not None})
    figures = {"seed": seed, "regime": req["plan"]["regime"], "device": device, "atol": atol, "rtol": rtol,
               **v.figures}
    if v.warnings:
        figures["tolerance_warning"] = v.warnings[0]
    if not v.ok:
        raise IncorrectError(f"seed={seed} ({req['plan']['regime']} inputs): {v.message}", gate="correctness",
                             path=ctx.display, status=v.status,
                             details="\n".join(v.details) + f"\n(tolerances from {first['atol_source']}/"
                             f"{first['rtol_source']}; {replay})",
                             fix="fix the kernel; the indices above show where it is wrong")
    how = "interpreter (TRITON_INTERPRET=1)" if device == "cpu" and ctx.kind == "triton" else device
    return Outcome(figures, f"{case_label(case)} ({req['plan']['regime']}) on {how}: max abs err "
                            f"{v.figures['max_abs_err']:.3g}, max rel err {v.figures['max_rel_err']:.3g} "
                            f"(atol={atol:g}, rtol={rtol:g}){'; tolerance warning' if v.warnings else ''}")


def _require_correct(ctx: Context, res: build.BuildResult, device: str) -> None:
    """Blocked unless every correctness case passed for this exact build (runs missing cases now)."""
    for case in correctness_cases(ctx):
        path = ctx.outdir / "correctness" / f"{case_label(case)}.json"
        rec = json.loads(path.read_text()) if path.is_file() else None
        fp = _fingerprint(ctx, res, case, device)
        if rec is None or rec.get("fingerprint") != fp or rec.get("mac") != _mac(fp, rec.get("passed")):
            try:
                gate_correctness(ctx, case)
            except KoptError as exc:
                raise Blocked("correctness", f"{case_label(case)}: {exc.message}") from None
        elif not rec.get("passed"):
            raise Blocked("correctness", f"{case_label(case)}: {rec.get('message', 'failed')}")


_SAN_ERRORS_RE = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_SAN_RACE_RE = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")


def sanitizer_summary(text: str) -> dict[str, int] | None:
    """Error and warning counts from compute-sanitizer's log: ``ERROR SUMMARY: N errors`` (memcheck, initcheck,
    synccheck) or ``RACECHECK SUMMARY: H hazards displayed (E errors, W warnings)`` (racecheck; warnings are
    hazards it cannot prove harmful, reported but not failed). Counts are summed over every process the tool
    followed; None when no summary line is present (the tool did not finish)."""
    errors = [int(n) for n in _SAN_ERRORS_RE.findall(text)]
    races = [(int(e), int(w)) for _, e, w in _SAN_RACE_RE.findall(text)]
    if not errors and not races:
        return None
    return {"errors": sum(errors) + sum(e for e, _ in races), "warnings": sum(w for _, w in races)}


def gate_sanitizer(ctx: Context, tool: str) -> Outcome:
    """One candidate call (first seed's inputs) under ``compute-sanitizer --tool <tool>``, its report written to a
    log file (kept even when the tool makes the call fail, as memcheck does on a bad access); writes
    ``sanitizer_<tool>.json``. Any reported error fails with status SANITIZER_<TOOL> (racecheck sets SKILL.md's
    ``race_safe``); a tool that printed no summary fails as HARDWARE_UNAVAILABLE with its output."""
    device = _device_for(ctx, "sanitizer")
    sanitizer = hardware.find_tool("compute-sanitizer")
    if not sanitizer:
        raise Blocked("hardware", "compute-sanitizer not found: install the CUDA toolkit's compute-sanitizer and put "
                                  "its bin/ on PATH, or drop --kopt-sanitizer")
    res = _blocked_build(ctx)
    req = _request(ctx, "candidate", device, ctx.settings.seeds[0], res)
    req["calls"] = 1
    # torch's caching allocator hands out slices of large cudaMalloc segments, inside which an out-of-bounds access
    # is invisible to memcheck; without it every tensor is its own allocation
    req["env"] = {**req["env"], "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    ctx.work.mkdir(parents=True, exist_ok=True)
    log = ctx.work / f"sanitizer_{tool}.log"
    log.unlink(missing_ok=True)
    prefix = [sanitizer, "--tool", tool, "--print-limit", "20", "--target-processes", "all", "--log-file", str(log)]
    call_error: KoptError | None = None
    with gpu_lock(ctx):
        try:
            result = run_harness(req, gate="sanitizer", timeout_s=max(600.0, ctx.settings.gate_timeout_s * 10),
                                 path=ctx.display, workdir=ctx.work, prefix=prefix)
            if result.get("npz") and os.path.exists(result["npz"]):
                os.unlink(result["npz"])
        except KernelRuntimeError as exc:  # the tool's own report still says what went wrong
            if exc.status == "TIMEOUT":
                raise
            call_error = exc
    text = log.read_text(errors="replace") if log.is_file() else ""
    summary = sanitizer_summary(text)
    _write_json(ctx.outdir / f"sanitizer_{tool}.json", {"tool": tool, **(summary or {}), "log_tail": text[-4000:],
                                                         "call_error": call_error.message if call_error else None})
    if summary is None:
        raise HardwareError(f"compute-sanitizer {tool} printed no summary", gate="sanitizer", path=ctx.display,
                            details=(text or (call_error.details if call_error else ""))[-2000:],
                            fix="run the command in the log by hand; check the tool's version against the driver")
    if summary["errors"]:
        first = "\n".join(ln for ln in text.splitlines() if ln.startswith("=========") and ln.strip("= "))[:3000]
        raise KernelRuntimeError(f"compute-sanitizer {tool} found {summary['errors']} error(s)", gate="sanitizer",
                                 path=ctx.display, status=f"SANITIZER_{tool.upper()}", details=first,
                                 fix="fix the reported accesses/races; the first ones are listed above")
    if call_error is not None:
        raise call_error
    warn = f", {summary['warnings']} warning(s)" if summary["warnings"] else ""
    return Outcome({"tool": tool, "errors": 0, "warnings": summary["warnings"]}, f"{tool}: 0 errors{warn}")


def gpu_lock(ctx: Context) -> FileLock:
    """The per-GPU lock (keyed by GPU UUID, in the system temp dir so separate sessions share it): timing, ncu,
    the sanitizer and GPU correctness never run two at once on one GPU. Taken around one child process at a time,
    never nested."""
    uuid = (ctx.env.get("gpu") or {}).get("uuid", "nogpu")
    return FileLock(os.path.join(tempfile.gettempdir(), f"pytest-kopt-{uuid}.lock"))


def device_lock(ctx: Context, device: str) -> Any:
    """:func:`gpu_lock` for work on the GPU, a no-op context for CPU work (the Triton interpreter)."""
    import contextlib

    return gpu_lock(ctx) if device == "cuda" else contextlib.nullcontext()


def device_peaks(ctx: Context) -> dict[str, Any] | None:
    """Measured ceilings of this GPU (copy bandwidth, bf16/fp32 matmul FLOP/s), measured once and cached per GPU
    UUID under ``<cache>/peaks/``. None without a GPU."""
    gpu = ctx.env.get("gpu")
    if not gpu:
        return None
    path = ctx.cache_dir / "peaks" / f"{gpu['uuid']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        # kept across sessions, unsigned (measuring costs seconds): a planted file could only move the roofline
        # floor of the SUSPECT check, which a rerun on a clean cache restores
        if path.is_file():
            try:
                return json.loads(path.read_text())
            except (OSError, ValueError):
                pass
        with gpu_lock(ctx):
            result = run_harness({"mode": "peaks"}, gate="timing", timeout_s=300.0, path=ctx.display,
                                 workdir=ctx.work)
        peaks = {k: result[k] for k in ("dram_bytes_per_s", "bf16_flops", "fp32_flops", "gpu", "method")}
        _write_json(path, peaks)
        return peaks


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f} µs" if x < 0.1 else f"{x:.4f} ms"


def gate_timing(ctx: Context, param: Any = None) -> Outcome:
    """Time the kernel and (in its own process) the reference: rotating input sets with fresh values, L2 flushed
    before every call, adaptive stopping on the median's standard error, NVML clocks. Writes ``bench.json`` with
    SKILL.md's fields. Fails with UNSTABLE_TIMING (robust CV > 0.10), SUSPECT (under the roofline floor from the
    measured peaks, or host clock far beyond the event time: work on another stream), or the guard status of the
    timed-output check (a timed call's output is checked against the reference in another process)."""
    import numpy as np

    device = _device_for(ctx, "timing")
    res = _blocked_build(ctx)
    _require_correct(ctx, res, device)
    peaks = device_peaks(ctx)
    req = _request(ctx, "timing", device, ctx.settings.seeds[0], res)
    ref_result: dict[str, Any] | None = None
    base_result: dict[str, Any] | None = None
    if ctx.settings.fresh_process:
        result = run_harness(req, gate="timing", timeout_s=max(ctx.settings.gate_timeout_s, 120.0),
                             path=ctx.display, workdir=ctx.work, lock=gpu_lock(ctx))
    else:
        result, ref_result, base_result = _interleaved(ctx, req)
    # the timed output check: the reference, in its own process, on the inputs of the last timed call
    try:
        creq = {**req, "mode": "check_outputs", "spec": result["spec"], "scalars": result.get("scalars", {}),
                "inputs_npz": result["npz"], "env": {}}
        check = run_harness(creq, gate="timing", timeout_s=max(ctx.settings.gate_timeout_s, 120.0),
                            path=str(ctx.ref), workdir=ctx.work, lock=gpu_lock(ctx), server=_server(ctx, "reference"))
        data = read_verified(Path(check["npz"]), check.get("npz_sha"), "timing", ctx.display)
        with np.load(result["npz"]) as c, np.load(io.BytesIO(data)) as r:
            arrays = {**{k: c[k] for k in c.files if k.startswith("cand1__")}, **{k: r[k] for k in r.files}}
        outputs = [k.removeprefix("ref__") for k in arrays if k.startswith("ref__")]
        missing = [o for o in outputs if f"cand1__{o}" not in arrays]
        if missing or not outputs:
            raise KernelRuntimeError(f"the timed call's process returned no {', '.join(missing) or 'outputs'}",
                                     gate="timing", path=ctx.display,
                                     fix="the kernel must not touch the harness (its modules, files or pipes)")
        verdict = judge(outputs, arrays, {n: (t["atol"], t["rtol"]) for n, t in check["tolerances"].items()})
    finally:
        for f in (result.get("npz"), locals().get("check", {}).get("npz")):
            if f and os.path.exists(f):
                os.unlink(f)
    if not verdict.ok or statistics.median(result["event_ms"]) <= 0:
        # judged before any statistics: a timed call that did no work (a graph captured empty) has a median of the
        # flush noise around 0, which no distribution describes; the bench.json left says why timing is not valid
        _write_json(ctx.outdir / "bench.json", {
            **_bench_head(ctx, result), "timing_valid": False, "median_ms": None, "samples_ms": result["event_ms"],
            "timed_output_check": verdict.status,
            "timing_method": {**req["timing"], "method": result.get("graph_method") or result.get("method")}})
        if not verdict.ok:
            raise IncorrectError(f"a timed call's output is wrong: {verdict.message}", gate="timing",
                                 path=ctx.display, status=verdict.status, details="\n".join(verdict.details),
                                 fix="the kernel behaves differently while timed (cached results, stale pointers)")
        raise TimingError(f"the timed calls' median is {statistics.median(result['event_ms']) * 1e3:.3f} µs, not "
                          "above zero: the timed work did nothing measurable", gate="timing", path=ctx.display,
                          status="SUSPECT", fix="the kernel must launch its work on the current stream inside "
                                                "solve()/run_kernel(), also while a CUDA graph is captured")
    pinned = (ctx.env.get("gpu") or {}).get("uuid") if ctx.env.get("pinned") else None
    if not gpus_mod.same_device(result.get("gpu_uuid"), pinned):
        raise HardwareError(f"the timed process ran on {result.get('gpu_uuid')}, not on {pinned}, the GPU this "
                            "worker is pinned to", gate="timing", path=ctx.display,
                            fix="leave CUDA_VISIBLE_DEVICES to pytest-kopt (--kopt-gpus) in the kernel's process")
    if ref_result is None:
        ref_result = _reference_timing(ctx, req, result)
    k = stats.describe(result["event_ms"])
    r = stats.describe(ref_result["event_ms"])
    host_med = statistics.median(result["host_ms"])
    # expected host time of one un-held call: its launch + the kernel + a synchronise round trip (calibrated)
    gap = host_med - k.median_ms - result["host_launch_ms"] - result["host_overhead_ms"]
    wm = result.get("workload") or {}
    floor = stats.roofline_floor_ms(wm.get("flops"), wm.get("bytes_min"),
                                    max((peaks or {}).get("bf16_flops") or 0, (peaks or {}).get("fp32_flops") or 0)
                                    or None, (peaks or {}).get("dram_bytes_per_s"))
    throttled = result.get("throttled")
    speedup, sp_lo, sp_hi = stats.bootstrap_ratio_ci(ref_result["event_ms"], result["event_ms"])
    # graph samples are differences of two replays: their spread is the flush's, so judge the median's precision
    graph = result.get("method") == "graph"
    stability = stats.stability_class_rse(k.median_rse, TIMING["min_samples"]) if graph else k.stability
    basis = "median_rse" if graph else "robust_cv"
    figures: dict[str, Any] = {"median_ms": k.median_ms, "mean_ms": k.mean_ms, "min_ms": k.min_ms,
                               "p10_ms": k.p10_ms, "p90_ms": k.p90_ms, "ci95_low_ms": k.ci95_low_ms,
                               "ci95_high_ms": k.ci95_high_ms, "robust_cv": round(k.robust_cv, 5),
                               "median_rse": round(k.median_rse, 5), "stability": stability, "stability_basis": basis,
                               "samples": k.n,
                               "stop_reason": result["stop_reason"], "rotating_sets": result["rotating_sets"],
                               "timing_method": result.get("graph_method") or result.get("method", "events"),
                               "host_gap_ms": gap, "ref_median_ms": r.median_ms, "speedup_vs_ref": speedup,
                               "speedup_ci95_low": sp_lo, "speedup_ci95_high": sp_hi,
                               "gpu_uuid": result.get("gpu_uuid")}  # as the timed process reported it
    if throttled is not None:
        figures["throttled_samples"] = sum(throttled)
    if wm.get("flops") is not None:
        figures["gflops"] = wm["flops"] / (k.median_ms * 1e-3) / 1e9
    if wm.get("bytes_min") is not None:
        figures["gbytes_per_s"] = wm["bytes_min"] / (k.median_ms * 1e-3) / 1e9
    if floor is not None:
        figures["roofline_floor_ms"] = floor
    suspect = []
    if floor is not None and k.median_ms < floor:
        suspect.append(f"median {_ms(k.median_ms)} is under the roofline floor {_ms(floor)} (bytes_min / measured "
                       f"bandwidth, flops / measured peak, each with {stats.FLOOR_HEADROOM:g}x headroom)")
    # work outside the timed stream: the host saw the device busy far longer than the events did
    if gap > max(0.02, 0.25 * k.median_ms):
        suspect.append(f"the host clock (synchronised) saw {_ms(host_med)} per call but CUDA events {_ms(k.median_ms)}"
                       " (work on another stream or a background thread?)")
    timing_valid = stability != "unstable" and not suspect
    dist = {f: getattr(k, f) for f in k.__dataclass_fields__}
    bench = {**_bench_head(ctx, result), "race_safe": _race_safe(ctx), "timing_valid": timing_valid, "average_ms": k.mean_ms, "median_ms": k.median_ms,
             "robust_cv": k.robust_cv, "stability": stability, "stability_basis": basis, "distribution": dist,
             "samples_ms": result["event_ms"], "host_ms": result["host_ms"], "throttled": throttled,
             "nvml": result.get("nvml"), "stop_reason": result["stop_reason"],
             "reference": {**{f: getattr(r, f) for f in r.__dataclass_fields__}, "samples_ms": ref_result["event_ms"]},
             "speedup_vs_ref": speedup, "speedup_ci95": [sp_lo, sp_hi], "workload": wm or None,
             "gflops": figures.get("gflops"), "gbytes_per_s": figures.get("gbytes_per_s"),
             "roofline_floor_ms": floor, "peaks": peaks, "suspect": suspect, "timed_output_check": verdict.status,
             "timing_method": {**req["timing"], "clock": "cuda_events", "l2_flush_bytes": result.get("flush_bytes"),
                               "rotating_sets": result["rotating_sets"], "fresh_values_every_call": True,
                               "graph_method": result.get("graph_method"), "graph_note": result.get("graph_note"),
                               "graph_hold": result.get("graph_hold"),
                               "interleaved_with_reference": not ctx.settings.fresh_process},
             "seeds": list(ctx.settings.seeds), "timing_seed": ctx.settings.seeds[0]}
    if base_result is not None:  # the PR gate's baseline, timed in the same rounds as this kernel
        bench["pr_baseline"] = {"kernel": str(ctx.settings.baseline), "samples_ms": base_result["event_ms"],
                                "stop_reason": base_result["stop_reason"]}
    path = _write_json(ctx.outdir / "bench.json", bench)
    if suspect:
        raise TimingError("; ".join(suspect), gate="timing", path=ctx.display, status="SUSPECT",
                          fix="synchronise all work inside solve()/run_kernel(); check workload_model's bytes_min")
    if stability == "unstable":
        what = (f"the median's relative standard error {k.median_rse:.1%} > 4.0% (graph samples, robust CV "
                f"{k.robust_cv:.3f})" if graph else f"robust CV {k.robust_cv:.3f} > 0.10")
        raise TimingError(f"timing is unstable: {what} over {k.n} samples (median {_ms(k.median_ms)})",
                          gate="timing", path=ctx.display,
                          fix="make sure nothing else runs on the GPU; a kernel of a few µs needs more samples")
    extra = f", {figures['gflops']:.1f} GFLOP/s" if "gflops" in figures else ""
    if throttled:
        extra += f", {sum(throttled)} throttled samples"
    return Outcome(figures, f"median {_ms(k.median_ms)} [{_ms(k.ci95_low_ms)}, {_ms(k.ci95_high_ms)}] (robust CV "
                            f"{k.robust_cv:.3f}, {stability}, n={k.n}, {result['stop_reason']}), reference "
                            f"{_ms(r.median_ms)}, speedup {speedup:.2f}x [{sp_lo:.2f}, {sp_hi:.2f}]{extra}", (path,))


def _bench_head(ctx: Context, result: dict[str, Any]) -> dict[str, Any]:
    """The fields every ``bench.json`` starts with: the kernel, its dims, arch, the GPU that timed it (name and UUID
    as the timed process reported them, the session's index of it) and SKILL.md's pass flags of the earlier
    gates."""
    return {"kernel": str(ctx.kernel), "dims": ctx.settings.dims, "requested_dims": ctx.settings.dims,
            "realized_dims": ctx.settings.dims, "arch": ctx.arch, "gpu": result.get("gpu"),
            "gpu_uuid": result.get("gpu_uuid"), "gpu_index": (ctx.env.get("gpu") or {}).get("index"),
            "compile_pass": True, "contract_pass": True, "correctness_pass": True}


def _interleaved(ctx: Context, req: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """Candidate and reference (and, for the PR gate, the baseline kernel) timed in alternating rounds, each in its
    own warm process, each round about ``ROUND_S`` seconds of samples per party, so a drift of clocks or
    temperature during the measurement hits all of them and the ratios' CIs stay honest. A party stops sampling
    once its stopping rule is met; rounds stop when all have, or after 4x the timing budget + 30 s. Returns
    (candidate result, reference result, baseline result or None) as the one-shot timing modes do. The reference
    is prepared on the candidate's spec, which the candidate's first round returns (its process checks it against
    ``ref.shapes()``)."""
    parties: list[tuple[dict[str, Any], str | None, str]] = [(req, _server(ctx, "candidate"), ctx.display)]
    rounds = _Rounds(ctx, parties)
    # one hold of the GPU lock for every round: taken per round, another worker's correctness seed (seconds at
    # 4096^3) could slip in between 50 ms rounds, and the rounds would spend their time cap waiting for the lock
    with device_lock(ctx, req["device"]):
        rounds.last.append(rounds.run(0, 3))
        first = rounds.last[0]
        rreq = {**req, "mode": "time_reference", "spec": first["spec"], "scalars": first.get("scalars", {}),
                "env": {}}
        parties.append((rreq, _server(ctx, "reference"), str(ctx.ref)))
        rounds.last.append(rounds.run(1, 3))
        base = ctx.settings.baseline
        if ctx.settings.pr_gate and base is not None and Path(base).resolve() != ctx.kernel:
            bctx = dataclasses.replace(ctx, kernel=Path(base).resolve(), display=str(base))
            try:
                breq: dict[str, Any] | None = _request(bctx, "timing", req["device"], ctx.settings.seeds[0],
                                                       ensure_built(bctx))
            except KoptError:
                breq = None  # the baseline's own items report it; the PR gate falls back to its timing gate
            if breq is not None:
                parties.append((breq, _server(bctx, "candidate"), bctx.display))
                rounds.last.append(rounds.run(2, 3))
        finals = rounds.finish()
        if len(finals) > 2 and finals[2].get("npz") and os.path.exists(finals[2]["npz"]):
            os.unlink(finals[2]["npz"])
        return finals[0], finals[1], finals[2] if len(finals) > 2 else None


class _Rounds:
    """Alternating timing rounds of several parties (request, warm server identity, display path), each party in
    its own process; see :func:`_interleaved`. The caller holds the GPU lock around all of it."""

    def __init__(self, ctx: Context, parties: list[tuple[dict[str, Any], str | None, str]]) -> None:
        import uuid

        self.ctx, self.parties = ctx, parties
        self.key = uuid.uuid4().hex
        self.timeout = max(ctx.settings.gate_timeout_s, 120.0)
        self.last: list[dict[str, Any]] = []

    def run(self, i: int, count: int, final: bool = False) -> dict[str, Any]:
        """One round of ``count`` samples of party ``i`` (``final``: end it and return its whole result)."""
        r, server, path = self.parties[i]
        return run_harness({**r, "round": {"key": f"{self.key}-{i}", "count": count, "final": final}},
                           gate="timing", timeout_s=self.timeout, path=path, workdir=self.ctx.work, server=server)

    def finish(self) -> list[dict[str, Any]]:
        """Rounds of about ``ROUND_S`` per party until every party's stopping rule is met (or 4x the timing budget
        + 30 s), then each party's final result, in party order."""
        t0 = time.monotonic()
        cap = 4 * TIMING["budget_s"] + 30.0
        while any(r["stop_reason"] is None for r in self.last) and time.monotonic() - t0 < cap:
            for i in range(len(self.parties)):
                if self.last[i]["stop_reason"] is None:
                    self.last[i] = self.run(i, int(min(500, max(1, ROUND_S / max(self.last[i]["sample_wall_s"],
                                                                                 1e-6)))))
        return [self.run(i, 0, final=True) for i in range(len(self.parties))]


def retime_interleaved(ctxs: list[Context]) -> list[dict[str, Any]]:
    """Re-time kernels that a decision compares (the loop's finalists and ablations) in alternating rounds on this
    process's GPU, each in its own warm process, so clock or temperature drift, and the differences between two
    GPUs of one model, hit them all alike. ``ctxs``: built, correct kernels of one session. Returns, per kernel,
    ``{"median_ms", "samples_ms", "stop_reason", "gpu_uuid"}`` (ms). Raises the harness's errors
    (:class:`~pytest_kopt.errors.KoptError`: a kernel that no longer builds, crashes or times out). Outputs are not
    judged again: each kernel passed its correctness seeds and timed-output check earlier in the session."""
    parties: list[tuple[dict[str, Any], str | None, str]] = []
    for c in ctxs:
        r = _request(c, "timing", "cuda", c.settings.seeds[0], ensure_built(c))
        parties.append((r, _server(c, "candidate"), c.display))
        prestart(_server(c, "candidate"), dict(r["env"]), c.work)  # the processes' starts overlap
    rounds = _Rounds(ctxs[0], parties)
    with gpu_lock(ctxs[0]):
        rounds.last = [rounds.run(i, 3) for i in range(len(parties))]
        finals = rounds.finish()
    out = []
    for f in finals:
        if f.get("npz") and os.path.exists(f["npz"]):
            os.unlink(f["npz"])
        out.append({"median_ms": statistics.median(f["event_ms"]), "samples_ms": f["event_ms"],
                    "stop_reason": f["stop_reason"], "gpu_uuid": f.get("gpu_uuid")})
    return out


def _reference_timing(ctx: Context, req: dict[str, Any], cand: dict[str, Any]) -> dict[str, Any]:
    """The reference timed in its own process on the candidate's spec; cached per (reference, spec, dims, GPU)
    under ``<cache>/refs/`` so a session's candidates share one measurement of it (``--kopt-fresh-process``; entries
    carry this process's MAC)."""
    key = _sha("time", local_sources(ctx.ref), cand["spec"], cand.get("scalars"), req["plan"], req["seed"],
               req["dims"], (ctx.env.get("gpu") or {}).get("uuid"), TIMING)
    path = ctx.cache_dir / "refs" / f"{key}.timing.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if path.is_file():
            try:
                entry = json.loads(path.read_text())
                if entry.get("mac") == _mac(entry["event_ms"], entry["stop_reason"]):
                    return entry
            except (OSError, ValueError, KeyError):
                pass
        rreq = {**req, "mode": "time_reference", "spec": cand["spec"], "scalars": cand.get("scalars", {}), "env": {}}
        result = run_harness(rreq, gate="timing", timeout_s=max(ctx.settings.gate_timeout_s, 120.0),
                             path=str(ctx.ref), workdir=ctx.work, lock=gpu_lock(ctx),
                             server=_server(ctx, "reference"))
        _write_json(path, {"event_ms": result["event_ms"], "stop_reason": result["stop_reason"],
                           "mac": _mac(result["event_ms"], result["stop_reason"])})
        return result


def _race_safe(ctx: Context) -> bool | None:
    """SKILL.md's ``race_safe``: from this session's racecheck record, None when racecheck did not run."""
    path = ctx.outdir / "sanitizer_racecheck.json"
    if "racecheck" not in ctx.settings.sanitizer or not path.is_file():
        return None
    errors = json.loads(path.read_text()).get("errors")
    return None if errors is None else errors == 0


def gate_ncu(ctx: Context, param: Any = None) -> Outcome:
    """Profile one call of the kernel (NVTX range only) with ncu, adaptive set (SKILL.md 3a: full below 10 ms of
    this session's timed median, light above; a full replay that times out or fails is retried once with the light
    set); keep ``kernel.ncu-rep``, write ``ncu_top.json`` (set, reason, attempts, per-axis top metrics, every
    registry metric). Skips when counters cannot be read (ERR_NVGPUCTRPERM); ProfilerError (exit 3) otherwise."""
    device = _device_for(ctx, "ncu")
    ncu = _tool(ctx, "ncu")
    if not ncu:
        raise Blocked("hardware", "ncu (Nsight Compute) not found; install it or put it on PATH")
    res = _blocked_build(ctx)
    _require_correct(ctx, res, device)
    ctx.outdir.mkdir(parents=True, exist_ok=True)
    report = ctx.outdir / "kernel.ncu-rep"
    bench = ctx.outdir / "bench.json"
    timed = json.loads(bench.read_text()).get("median_ms") if bench.is_file() else None
    chosen, reason = profile.choose_set(timed)
    registry = roofline_mod.load_registry()
    attempts: list[dict[str, Any]] = []
    launches = None
    for set_name in ([chosen, "light"] if chosen == "full" else [chosen]):
        req = _request(ctx, "profile", device, ctx.settings.seeds[0], res)
        if report.exists():
            report.unlink()
        try:
            with gpu_lock(ctx):
                result = run_harness(req, gate="ncu", timeout_s=ctx.settings.ncu_timeout_s, path=ctx.display,
                                     workdir=ctx.work, prefix=profile.ncu_prefix(
                                         ncu, report.with_suffix(""), registry["metric_sets"][set_name]))
            profile.check_ncu_output(result.get("stdout", ""))
            if not report.is_file():
                raise ProfilerError("ncu wrote no report (no kernel ran inside the kopt_target range?)", gate="ncu",
                                    path=ctx.display, details=result.get("stdout", "")[-2000:])
            launches = profile.import_report(ncu, report)
            attempts.append({"set": set_name, "ok": True})
            chosen = set_name
            break
        except (KernelRuntimeError, ProfilerError) as exc:
            attempts.append({"set": set_name, "ok": False, "status": exc.status, "error": exc.message})
            if set_name == "light" or chosen != "full":
                raise ProfilerError(f"ncu failed with the {set_name} set: {exc.message}", gate="ncu",
                                    path=ctx.display, details=exc.details,
                                    fix="run the kernel outside ncu first; raise --kopt-ncu-timeout") from None
    assert launches is not None
    top = profile.summarize_launches(launches)
    main_launch = max(launches, key=lambda ln: metric_value(ln, "gpu__time_duration.sum") or 0.0)
    table = roofline_mod.metric_table(main_launch, registry)
    top.update({"report": str(report), "set": chosen, "set_reason": reason, "attempts": attempts,
                "ncu_num": NCU_NUM, "top": roofline_mod.top_metrics(table, registry, NCU_NUM), "metrics": table,
                "kernel": main_launch.kernel_name})
    path = _write_json(ctx.outdir / "ncu_top.json", top)
    main = max(top["launches"], key=lambda r: r["metrics"]["duration_ns"] or 0.0)  # type: ignore[index, union-attr]
    m = main["metrics"]
    figures = {"ncu_duration_ms": top["duration_ms"], "kernels": len(top["launches"]),  # type: ignore[arg-type]
               "target_kernel": main["kernel"], "ncu_set": chosen}
    for key in ("sm_throughput_pct", "dram_throughput_pct", "achieved_occupancy_pct", "registers_per_thread"):
        if m.get(key) is not None:
            figures[key] = m[key]

    def pct(v: Any) -> str:
        return "n/a" if v is None else f"{v:.1f}%"

    return Outcome(figures, f"{main['kernel'][:60]}: {_ms(top['duration_ms'])} ({chosen} set), SM "
                            f"{pct(m.get('sm_throughput_pct'))}, DRAM {pct(m.get('dram_throughput_pct'))}, occupancy "
                            f"{pct(m.get('achieved_occupancy_pct'))}", (str(report), path))


#: SKILL.md's default ``ncu_num``: top metrics kept per axis.
NCU_NUM = 5


def gate_roofline(ctx: Context, param: Any = None) -> Outcome:
    """SKILL.md 3b from this session's ``ncu_top.json`` (+ ``bench.json``'s workload model and the measured
    peaks): the three gaps, bound, near_peak, axis budget, achieved FLOP/s and bytes/s, arithmetic intensity;
    writes ``roofline.json`` and ``roofline.png``."""
    top_path = ctx.outdir / "ncu_top.json"
    if not top_path.is_file():
        _device_for(ctx, "roofline")  # without a GPU, say so (as the other GPU gates do), not "no ncu_top.json"
        raise Blocked("ncu", "no ncu_top.json from this session's ncu gate")
    top = json.loads(top_path.read_text())
    if "metrics" not in top:
        raise Blocked("ncu", "ncu_top.json holds no registry metrics (written by an older version)")
    bench_path = ctx.outdir / "bench.json"
    workload = json.loads(bench_path.read_text()).get("workload") if bench_path.is_file() else None
    registry = roofline_mod.load_registry()
    doc = roofline_mod.roofline(top["metrics"], registry, top.get("duration_ms"), workload, device_peaks(ctx))
    doc["kernel"] = top.get("kernel")
    path = _write_json(ctx.outdir / "roofline.json", doc)
    history: list[dict[str, Any]] = []
    if ctx.settings.run_dir is not None and (ctx.settings.run_dir / "state.json").is_file():
        # the loop's earlier iterations (profiles of the best going into each) as points on the chart
        state = json.loads((ctx.settings.run_dir / "state.json").read_text())
        history = [{**r, "label": f"in{r['iter']}"} for r in state.get("roofline_history", [])]
    png = roofline_mod.plot({**doc, "label": ctx.kernel.stem}, history, ctx.outdir / "roofline.png",
                            title=f"{ctx.kernel.name} roofline")
    figures = {k: doc[k] for k in ("delta_compute", "delta_memory", "delta_latency", "bound", "near_peak")
               if doc.get(k) is not None}
    figures.update({f"budget_{a}": n for a, n in doc["axis_budget"].items()})
    for k in ("arithmetic_intensity", "sol_pct_fp32", "sol_pct_best", "roofline_bound"):
        if doc.get(k) is not None:
            figures[k] = doc[k]

    def g(v: Any) -> str:
        return "null" if v is None else f"{v:.2f}"

    b = doc["axis_budget"]
    sol = f", {doc['sol_pct_fp32']:.1f}% of the fp32 roofline" if doc.get("sol_pct_fp32") is not None else ""
    if doc.get("sol_pct_fp32") is not None and doc["sol_pct_fp32"] > 100 and doc.get("sol_pct_best") is not None:
        sol += f" (above it: tensor-core work), {doc['sol_pct_best']:.1f}% of the bf16 tensor roofline"
    return Outcome(figures, f"Δc={g(doc['delta_compute'])} Δm={g(doc['delta_memory'])} Δl={g(doc['delta_latency'])}"
                            f", bound {doc['bound']}, budget {b['compute']}/{b['memory']}/{b['latency']}"
                            f" ({doc['method']}){sol}", tuple(p for p in (path, png) if p))


def gate_sass(ctx: Context, param: Any = None) -> Outcome:
    """``cuobjdump --dump-sass`` of the build, one ``sass/<function>.sass`` per kernel function."""
    if ctx.kind == "python":
        raise NotApplicable("pure-Python candidate: no GPU code to disassemble")
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
    Gate("sanitizer", gate_sanitizer, "correctness", True, artifact="sanitizer_<tool>.json"),
    Gate("timing", gate_timing, "correctness", True, artifact="bench.json"),
    Gate("ncu", gate_ncu, "correctness", True, artifact="kernel.ncu-rep, ncu_top.json"),
    Gate("roofline", gate_roofline, "ncu", True, artifact="roofline.json, roofline.png"),
    Gate("sass", gate_sass, "compile", False, artifact="sass/<function>.sass"),
)
GATE_ORDER = {g.name: i for i, g in enumerate(GATES)}
