"""The ``compile`` gate: ``.cu`` -> shared library with nvcc, Triton ``.py`` -> cubin, in a content-addressed cache.

The cache key covers the source, every local header it includes (recursively), the compiler and its version, the
flags and the arch (SKILL.md's build manifest). A ``filelock`` per key lets parallel xdist workers share builds.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

from ..artifacts import read_dict, write_json, write_text
from ..child.autotune import describe
from ..errors import Blocked, CompileError, ConfigError, ContractError, HardwareError, KoptError, NotApplicable
from .context import Context, Outcome
from .contract import local_headers, uses_cutlass
from .inputs import draw_plan, import_hypothesis
from .preflight import preflight
from .trust import digest, local_sources

if TYPE_CHECKING:
    from concurrent.futures import Future

BUILD_SCHEMA = 1

#: Compiled into every library beside the user's source: it shares the library's (static) CUDA runtime, so the
#: harness can read launch errors and synchronize through the same runtime that launched the kernels.
SHIM = r"""
#include <cuda_runtime.h>
extern "C" int kopt_sync(void) {
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaGetLastError();
  return (int)e;
}
extern "C" const char* kopt_error_string(int e) { return cudaGetErrorString((cudaError_t)e); }
"""

_NVCC_DIAG_RE = re.compile(r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\): (?P<kind>error|warning)", re.M)


@dataclass(frozen=True, slots=True)
class BuildResult:
    """A finished build: ``artifact`` is the .so (CUDA) or the folder of cubins (Triton); ``seconds`` is the
    compile wall time in s (0 on a cache hit); ``command`` the compiler command line; ``log`` its output."""

    artifact: str
    key: str
    cache_hit: bool
    seconds: float
    command: list[str]
    log: str
    cubins: tuple[str, ...] = ()
    #: CUTLASS/CuTe include folders the build used (empty for a kernel without CUTLASS)
    include_dirs: tuple[str, ...] = ()
    #: Triton: one cubin per kernel, of the config every later gate runs (an ``@triton.autotune`` kernel's tuned or
    #: stated config)
    pinned: tuple[str, ...] = ()
    #: Triton: per ``@triton.autotune`` kernel, ``config`` (the pinned config's kwargs), ``configs`` (how many it
    #: has), ``compiled`` (how many were compiled ahead of time without a GPU)
    autotune: dict[str, Any] = field(default_factory=dict)

    @property
    def warnings(self) -> list[str]:
        """The compiler's warning lines (``k.cu:12: warning #177-D: ...``), in order."""
        return [ln.strip() for ln in self.log.splitlines() if re.search(r":\d+: warning\b", ln)]


class KoptCutlassWarning(UserWarning):
    """``CUTLASS_PATH`` is set but holds no CUTLASS headers; the build used the ones it found elsewhere."""


def cutlass_include_dirs() -> tuple[Path, ...]:
    """CUTLASS/CuTe include folders: ``$CUTLASS_PATH/include`` (+ ``tools/util/include``), else those shipped in
    the ``nvidia-cutlass`` wheel. A ``CUTLASS_PATH`` that holds no ``include/cutlass/cutlass.h`` gives a
    KoptCutlassWarning naming it and the folder used instead. Raises ConfigError when no headers are found."""
    import importlib.util

    explicit = os.environ.get("CUTLASS_PATH")
    roots = [Path(explicit)] if explicit else []
    for mod in ("cutlass_library", "cutlass"):
        spec = importlib.util.find_spec(mod)
        if spec and spec.origin:
            pkg = Path(spec.origin).parent
            roots += [pkg / "source", pkg]
    for root in roots:
        if (root / "include" / "cutlass" / "cutlass.h").is_file():
            dirs = [root / "include"]
            if (root / "tools" / "util" / "include").is_dir():
                dirs.append(root / "tools" / "util" / "include")
            if explicit and root != Path(explicit):
                warnings.warn(KoptCutlassWarning(f"CUTLASS_PATH={explicit} holds no include/cutlass/cutlass.h; "
                                                 f"using the CUTLASS headers in {dirs[0]}"), stacklevel=2)
            return tuple(dirs)
    where = f"CUTLASS_PATH={explicit} holds no include/cutlass/cutlass.h and " if explicit else ""
    raise ConfigError(f"CUTLASS headers not found: {where}no nvidia-cutlass package is installed", gate="compile",
                      fix="pip install nvidia-cutlass, or set CUTLASS_PATH to a CUTLASS checkout")


def nvcc_command(nvcc: str, source: Path, shim: Path, out: Path, arch: str, include_dirs: tuple[Path, ...],
                 cutlass: bool) -> list[str]:
    """The nvcc command line: ``-O3 -lineinfo``, position-independent shared library, SASS for ``arch`` only
    (``sm_90a`` -> ``-gencode arch=compute_90a,code=sm_90a``), C++17."""
    num = arch.removeprefix("sm_")
    cmd = [nvcc, "-O3", "-lineinfo", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
           f"-gencode=arch=compute_{num},code=sm_{num}", "-o", str(out), str(source), str(shim)]
    if cutlass:
        cmd[1:1] = ["--expt-relaxed-constexpr", "--expt-extended-lambda"]
    for d in include_dirs:
        cmd += ["-I", str(d)]
    return cmd


def _key(parts: dict[str, Any], files: list[Path]) -> str:
    h = hashlib.sha256(json.dumps(parts, sort_keys=True).encode())
    for f in files:
        h.update(str(f).encode())
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:24]


def format_nvcc_errors(log: str, source: Path, display: str) -> str:
    """Rewrite nvcc's ``file(12): error`` diagnostics as ``file:12: error`` (clickable), keeping the rest."""
    def repl(m: re.Match[str]) -> str:
        f = m.group("file")
        name = display if Path(f).name == source.name else f
        return f"{name}:{m.group('line')}: {m.group('kind')}"
    return _NVCC_DIAG_RE.sub(repl, log)


def build_cuda(source: Path, arch: str, cache_root: Path, nvcc: str | None, nvcc_version: str | None,
               cutlass: bool, timeout_s: float = 600.0, display: str | None = None) -> BuildResult:
    """Build ``source`` (+ the shim) into ``<cache_root>/<key>/kernel.so``, or reuse a matching build.

    Raises HardwareError when nvcc is missing, CompileError (with file:line diagnostics) when it fails or runs
    past ``timeout_s`` seconds.
    """
    display = display or str(source)
    if not nvcc:
        raise HardwareError("nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda*/bin)", gate="compile",
                            fix="install the CUDA toolkit or put nvcc on PATH")
    include_dirs = cutlass_include_dirs() if cutlass else ()
    headers = local_headers(source, include_dirs=())
    parts = {"schema": BUILD_SCHEMA, "nvcc": nvcc_version, "arch": arch, "shim": SHIM, "cutlass": cutlass,
             "include_dirs": [str(d) for d in include_dirs],
             "flags": nvcc_command("nvcc", Path("s.cu"), Path("shim.cu"), Path("o.so"), arch, (), cutlass)}
    key = _key(parts, [source, *headers])
    folder = cache_root / key
    folder.mkdir(parents=True, exist_ok=True)
    lib = folder / "kernel.so"
    manifest = folder / "manifest.json"
    with FileLock(str(folder / ".lock")):
        m = read_dict(manifest)
        if lib.is_file() and m is not None and "command" in m:  # a torn or foreign manifest: built again
            return BuildResult(str(lib), key, True, 0.0, m["command"], m.get("log", ""),
                               include_dirs=tuple(map(str, include_dirs)))
        shim = folder / "kopt_shim.cu"
        if not shim.is_file() or shim.read_text() != SHIM:  # never rewritten under an nvcc that reads it
            write_text(shim, SHIM)
        # this build's own output: an nvcc left running by a process that died (and released the lock) never
        # shares its file with the build that follows
        tmp = folder / f"kernel.so.{os.getpid()}.{threading.get_ident()}.tmp"
        cmd = nvcc_command(nvcc, source, shim, tmp, arch, include_dirs, cutlass)
        try:  # nothing of this build's temporary output outlives it: failed, timed out or interrupted
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=source.parent)
            except subprocess.TimeoutExpired:
                raise CompileError(f"nvcc ran past {timeout_s:.0f} s", gate="compile", path=display,
                                   fix="raise --kopt-timeout or simplify the kernel (deep template "
                                       "instantiation?)") from None
            except OSError as exc:
                raise HardwareError(f"nvcc could not run: {exc}", gate="compile",
                                    fix="install the CUDA toolkit or put nvcc on PATH") from None
            seconds = time.perf_counter() - t0
            log = format_nvcc_errors(proc.stdout + proc.stderr, source, display)
            if proc.returncode != 0 or not tmp.is_file():
                fix = "fix the compiler errors above"
                if "not supported on .target" in log and not arch.endswith("a"):
                    fix = f"this code needs the arch-specific target: pass --kopt-arch {arch}a"
                elif "not supported on .target" in log:
                    fix = f"the instruction is not available on {arch}: choose a code path for this arch"
                first = _first_error_line(log, display)
                text = log.strip()
                if len(text) > 6000:  # keep the first errors (the root cause) and the last lines
                    text = text[:4000] + "\n...\n" + text[-2000:]
                if proc.returncode < 0 or _KILLED.search(log):  # Ctrl-C reaches nvcc's process group too
                    raise CompileError(f"nvcc was interrupted (exit {proc.returncode})", gate="compile", path=display,
                                       details=text, status=INTERRUPTED, fix="run the session again")
                raise CompileError(f"nvcc failed (exit {proc.returncode})", gate="compile", path=display,
                                   line=first, details=text, fix=fix)
            os.replace(tmp, lib)
        finally:
            tmp.unlink(missing_ok=True)
        BUILT_HERE[str(lib)] = seconds
        write_json(manifest, {"command": cmd, "log": log, "seconds": seconds, "parts": parts,
                              "headers": [str(h) for h in headers]})
        return BuildResult(str(lib), key, False, seconds, cmd, log, include_dirs=tuple(map(str, include_dirs)))


#: The libraries this process compiled (path -> nvcc's seconds): a compile item that finds its build done by a build
#: started ahead (:class:`BuildAhead`) reports it as built, not as a cache hit.
BUILT_HERE: dict[str, float] = {}

#: The builds :class:`BuildAhead` started in this process (kernel path -> its future): a compile item waits for its
#: own rather than racing it to the build folder's lock (won by the item, the build read as not started ahead).
STARTED: dict[Path, Future[None]] = {}

#: The status of a build a signal ended (nvcc, or the compiler it ran): not the kernel's error, never remembered.
INTERRUPTED = "INTERRUPTED"
_KILLED = re.compile(r"died due to signal|terminated by signal|^Killed$", re.M)


def _first_error_line(log: str, display: str) -> int | None:
    # only the source's own errors: a header's line number is not a line of ``display``
    m = re.search(rf"^{re.escape(display)}:(\d+): error", log, re.M)
    return int(m.group(1)) if m else None


def triton_key(source: Path, arch: str, dims: dict[str, Any], device: str,
               triton_version: str | None) -> tuple[str, dict[str, Any]]:
    """(build key, the parts it covers) of a Triton kernel file: the file and its ``.py`` neighbours (a
    ``@triton.jit`` helper may live beside it), which of them is built (else a.py and b.py of one folder would share
    a key, and b.py get a.py's cubins), triton's version, the arch, the dims, the device and Python's version."""
    parts = {"schema": BUILD_SCHEMA, "triton": triton_version, "arch": arch, "dims": dims, "device": device,
             "python": sys.version_info[:2], "kernel": source.name}
    return _key(parts, sorted({source, *source.parent.glob("*.py")})), parts


def triton_cache_dir(ctx: Context) -> Path:
    """``TRITON_CACHE_DIR`` of ``ctx``'s kernel: its Triton build's folder for a Triton file (known before it is
    built, so the compile, plan and correctness requests share one warm process), the session's for Python."""
    if ctx.kind != "triton":
        return ctx.cache_dir / "triton"
    key, _ = triton_key(ctx.kernel, ctx.arch, ctx.build_dims, "cuda" if ctx.gpu else "cpu",
                        ctx.env.get("packages", {}).get("triton"))
    return ctx.cache_dir / "builds" / key / "triton"


def build_triton(source: Path, ref: Path, dims: dict[str, Any], seed: int, arch: str, cache_root: Path,
                 device: str, triton_version: str | None, run_child: Any, display: str | None = None) -> BuildResult:
    """Compile the Triton kernels ``run_kernel`` launches into ``<cache_root>/<key>/triton/**.cubin``.

    ``run_child(request) -> dict`` runs the harness (mode ``triton_build``) in a child process with
    ``TRITON_CACHE_DIR`` pointing into the build folder. On a GPU the real JIT path compiles; without one, the
    launch is captured and compiled ahead of time for ``arch``. Raises CompileError on a compiler error.
    """
    display = display or str(source)
    key, parts = triton_key(source, arch, dims, device, triton_version)
    folder = cache_root / key
    folder.mkdir(parents=True, exist_ok=True)
    cache_dir = folder / "triton"
    manifest = folder / "manifest.json"
    with FileLock(str(folder / ".lock")):
        m = read_dict(manifest)
        if m is not None and "command" in m:
            cubins = tuple(str(p) for p in sorted(cache_dir.rglob("*.cubin")))
            pinned = tuple(m.get("pinned") or ())
            if cubins and all(Path(p).is_file() for p in pinned):
                return BuildResult(str(cache_dir), key, True, 0.0, m["command"], m.get("log", ""), cubins,
                                   pinned=pinned, autotune=dict(m.get("autotune") or {}))
        t0 = time.perf_counter()
        req = {"mode": "triton_build", "kind": "triton", "kernel": str(source), "ref": str(ref), "dims": dims,
               "seed": seed, "device": device, "arch": arch, "env": {"TRITON_CACHE_DIR": str(cache_dir)},
               "pinned_dir": str(folder / "pinned")}
        result = run_child(req)
        seconds = time.perf_counter() - t0
        cubins = tuple(str(p) for p in sorted(cache_dir.rglob("*.cubin")))
        if not cubins:
            raise CompileError("Triton produced no cubin", gate="compile", path=display,
                               details=json.dumps(result)[:2000], fix="make run_kernel() launch the @triton.jit kernel")
        cmd = ["triton", result.get("mode", "?"), arch]
        pinned, tuned = tuple(result.get("pinned") or ()), dict(result.get("autotune") or {})
        write_json(manifest, {"command": cmd, "log": "", "seconds": seconds, "parts": parts,
                              "kernels": result.get("kernels"), "pinned": list(pinned), "autotune": tuned})
        return BuildResult(str(cache_dir), key, False, seconds, cmd, "", cubins, pinned=pinned, autotune=tuned)


def build_mark(ctx: Context) -> str:
    """What a build's outcome depends on, for the remembered failure (``compile_error.json``): the kernel and every
    local header it includes, the ``.py`` files beside it, the arch, the tools' and libraries' versions and (for
    Triton, whose launch shape is part of the build) the dims."""
    headers = b"".join(h.read_bytes() for h in local_headers(ctx.kernel)) if ctx.kind == "cuda" else b""
    return digest(local_sources(ctx.kernel), ctx.kernel.read_bytes(), headers, ctx.arch, ctx.env.get("tools"),
                  ctx.env.get("packages"), ctx.build_dims if ctx.kind == "triton" else None)


def ensure_built(ctx: Context) -> BuildResult:
    """Build (or reuse) the kernel for ``ctx.arch``. A compile error is remembered per :func:`build_mark` in
    ``<outdir>/compile_error.json`` (this or a later session does not try the same sources again) and forgotten once
    a build succeeds. Raises CompileError/HardwareError (or, for a Triton file, the harness's error), or Blocked by
    preflight when the static contract fails."""
    try:
        preflight(ctx)
    except ContractError as exc:
        raise Blocked("preflight", exc.message) from None
    failed = ctx.outdir / "compile_error.json"
    mark = build_mark(ctx)
    rec = read_dict(failed)
    if rec is not None and rec.get("mark") == mark:
        raise CompileError(rec.get("message", "failed before"), gate="compile", path=ctx.display,
                           line=rec.get("line"), details=rec.get("details"), fix=rec.get("fix"),
                           status=rec.get("status"))
    try:
        res = _build(ctx, ctx.cache_dir / "builds")
    except CompileError as exc:
        if exc.status != INTERRUPTED:  # an interrupted build says nothing about the sources
            write_json(failed, {"mark": mark, "message": exc.message, "line": exc.line, "details": exc.details,
                                "fix": exc.fix, "status": exc.status})
        raise
    failed.unlink(missing_ok=True)
    return res


def build_quietly(ctx: Context, sass: bool = False, profile: bool = False) -> None:
    """:func:`ensure_built` for a build started ahead of its compile item (:class:`BuildAhead`): a failure is
    remembered in ``compile_error.json`` as usual, and the compile item reports it when it runs. With ``profile``,
    the ncu item's profile is started next (:func:`pytest_kopt.gates.ncu.profile_ahead`, both sets: no seed has
    run), so ncu, Python, torch and the CUDA context come up under the plan, correctness and timing items. With
    ``sass``, the built library's SASS is dumped then (:func:`pytest_kopt.gates.sass.prefetch_sass`) for the sass
    item."""
    try:
        res = ensure_built(ctx)
    except (KoptError, Blocked, OSError):
        return
    if profile:
        from .ncu import profile_ahead

        try:
            profile_ahead(ctx, early=True)
        except (KoptError, Blocked, OSError):
            pass  # the correctness or ncu item starts it
    if sass and ctx.kind == "cuda":
        from .sass import prefetch_sass

        prefetch_sass(ctx.tool("cuobjdump"), res.artifact)


class BuildAhead:
    """The ``.cu`` kernels of a session built side by side, ahead of their compile items: nvcc starts for every
    ``.cu`` kernel whose compile item this process collected, at most one build per CPU, in threads, while the
    hardware, preflight and plan items run; each compile item then waits for its own build. So one process
    compiles as many kernels at once as xdist workers would, without their start-up; under xdist, a build another
    worker has started is waited for, never run twice (the content-addressed cache and its lock). A kernel with a
    sass item has its SASS dumped in the same thread.

    Builds start at a process's first item, or before the GPU probe when the process knows the arch that early
    (the plugin's configure, without xdist: :mod:`pytest_kopt.plugin.early`); a later call starts only what is not
    started yet for its arch."""

    def __init__(self) -> None:
        self.pool: Any = None
        self.sassed: set[Path] = set()
        self.profile_started: set[Path] = set()
        #: (kernel, arch) of every build started, so none is started twice
        self.begun: set[tuple[Path, str]] = set()

    def _pool(self) -> Any:
        if self.pool is None:  # threads start as builds are submitted, up to one per CPU
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="kopt-build")
        return self.pool

    def start(self, ctxs: list[Context], sass: frozenset[Path] = frozenset(),
              profile: frozenset[Path] = frozenset()) -> int:
        """Start the builds of ``ctxs`` (``.cu`` kernels; others are skipped) not started yet for their arch, each
        followed by the start of its ncu item's profile when it is in ``profile`` and its SASS dump when it is in
        ``sass`` (kernel paths: the kernels this process runs the ncu or sass item of, as far as it knows; under
        xdist a worker learns its kernels one at a time, at each one's first item, and a later call adds them).
        Returns how many builds were started."""
        todo = [c for c in ctxs if c.kind == "cuda" and c.tool("nvcc")]
        pool = self._pool()
        started = 0
        for c in todo:
            dump = c.kernel in sass and c.kernel not in self.sassed
            prof = c.kernel in profile and c.kernel not in self.profile_started
            self.sassed.update([c.kernel] if dump else [])
            self.profile_started.update([c.kernel] if prof else [])
            if (c.kernel, c.arch) in self.begun:
                if dump or prof:  # after the build started before: its failure is remembered then, not built again
                    pool.submit(_after, STARTED.get(c.kernel), build_quietly, c, dump, prof)
                continue
            self.begun.add((c.kernel, c.arch))
            STARTED[c.kernel] = pool.submit(build_quietly, c, dump, prof)
            started += 1
        return started

    def wait(self) -> None:
        """Wait for the builds still running (at session end: nvcc must not outlive the session)."""
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def _after(first: Future[None] | None, then: Any, *args: Any) -> None:
    if first is not None:
        first.exception()  # waits; a failure of ``first`` is reported where it is awaited
    then(*args)


def built(ctx: Context) -> BuildResult:
    """:func:`ensure_built` for a gate that needs the build: any failure to build is Blocked by compile (the
    compile item reports it), never this gate's own failure."""
    try:
        return ensure_built(ctx)
    except KoptError as exc:
        raise Blocked("compile", exc.message) from None


def _build(ctx: Context, root: Path) -> BuildResult:
    if ctx.kind == "python":
        return BuildResult(str(ctx.kernel), digest(ctx.kernel.read_bytes()), True, 0.0, [], "")
    if ctx.kind == "cuda":
        nvcc = ctx.tool("nvcc")
        return build_cuda(ctx.kernel, ctx.arch, root, nvcc, (ctx.env["tools"].get("nvcc") or {}).get("version"),
                          uses_cutlass(ctx.kernel), timeout_s=max(600.0, ctx.settings.gate_timeout_s),
                          display=ctx.display)
    device = "cuda" if ctx.gpu else "cpu"

    def run_child(req: dict[str, Any]) -> dict[str, Any]:
        req = {**req, "plan": draw_plan(ctx.settings.seeds[0], 0, ctx.regimes), "env": compile_env(ctx)}
        # the run of run_kernel gets --kopt-timeout; the compile of its kernels 120 s more. In the candidate's
        # correctness process (the same environment as its correctness requests), which goes on to serve them
        return ctx.pool.run(req, gate="compile", timeout_s=ctx.settings.gate_timeout_s + 120.0, path=ctx.display,
                            workdir=ctx.work, server=ctx.server("check"))

    return build_triton(ctx.kernel, ctx.ref, ctx.build_dims, ctx.settings.seeds[0], ctx.arch, root, device,
                        ctx.env.get("packages", {}).get("triton"), run_child, display=ctx.display)


def compile_env(ctx: Context) -> dict[str, str]:
    """The environment of a Triton/Python candidate's build and plan requests: its ``TRITON_CACHE_DIR`` ({} for a
    ``.cu``). On a GPU it is also that of its correctness and timing requests, so its correctness process serves the
    build, plan and correctness requests, and its timing process finds the build's Triton cache;
    on the CPU those add ``TRITON_INTERPRET=1`` (:func:`candidate_env`), which the build must not have."""
    return {} if ctx.kind == "cuda" else {"TRITON_CACHE_DIR": str(triton_cache_dir(ctx))}


def candidate_env(ctx: Context, device: str) -> dict[str, str]:
    """The environment of a candidate's correctness, timing and profile requests on ``device``: :func:`compile_env`,
    plus ``TRITON_INTERPRET=1`` for a Triton/Python candidate on the CPU."""
    env = compile_env(ctx)
    if ctx.kind != "cuda" and device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    return env


def gate_compile(ctx: Context, case: Any = None) -> Outcome:
    """The compile gate: the kernel built for the target arch (content-addressed cache); NotApplicable for a
    pure-Python candidate."""
    if ctx.kind == "python":
        try:
            preflight(ctx)
        except ContractError as exc:
            raise Blocked("preflight", exc.message) from None
        raise NotApplicable("pure-Python candidate (no @triton.jit kernel): nothing to compile")
    started = STARTED.get(ctx.kernel)
    if started is not None:
        if not started.done():
            import_hypothesis()  # while this thread would only wait
        started.result()  # a kernel's build failure is remembered, and ensure_built raises it; a bug raises here
    res = ensure_built(ctx)
    ahead = res.cache_hit and res.artifact in BUILT_HERE  # built by this process, from its first item on
    seconds = BUILT_HERE[res.artifact] if ahead else res.seconds
    figures: dict[str, Any] = {"arch": ctx.arch, "cache_hit": res.cache_hit and not ahead,
                               "compile_s": round(seconds, 3), "build_key": res.key,
                               "compiler_warnings": len(res.warnings)}
    where = res.artifact if not res.cubins else f"{len(res.cubins)} cubin(s) in {res.artifact}"
    line = (f"built in {seconds:.1f} s (started ahead)" if ahead else
            "cache hit" if res.cache_hit else f"built in {res.seconds:.1f} s") + f": {where}"
    if res.include_dirs:
        figures["cutlass_include"] = res.include_dirs[0]
        line += f"; CUTLASS headers from {res.include_dirs[0]}"
    for name, tuned in sorted(res.autotune.items()):
        how = (f"tuned over {tuned['configs']} configs" if ctx.gpu else
               f"{tuned.get('compiled', tuned['configs'])} of {tuned['configs']} configs compiled, the first stated")
        figures[f"autotune_{name}"] = describe(tuned["config"])
        line += f"; @triton.autotune {name}: {how}, pinned {describe(tuned['config'])}"
    if res.warnings:
        figures["first_warning"] = res.warnings[0][:300]
        line += f"; {len(res.warnings)} compiler warning(s), the first: {res.warnings[0][:200]}"
    return Outcome(figures, line, (res.artifact,))
