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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from .errors import CompileError, ConfigError, HardwareError

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

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
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


def local_headers(source: Path, include_dirs: tuple[Path, ...] = ()) -> list[Path]:
    """All ``#include "..."`` headers reachable from ``source`` that exist beside it or in ``include_dirs``,
    recursively, sorted. System headers (``<...>``) are covered by the compiler version in the key."""
    seen: set[Path] = set()
    todo = [source]
    while todo:
        f = todo.pop()
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        for inc in _INCLUDE_RE.findall(text):
            for base in (f.parent, *include_dirs):
                cand = (base / inc).resolve()
                if cand.is_file():
                    if cand not in seen:
                        seen.add(cand)
                        todo.append(cand)
                    break
    return sorted(seen)


def cutlass_include_dirs() -> tuple[Path, ...]:
    """CUTLASS/CuTe include folders: ``$CUTLASS_PATH/include`` (+ ``tools/util/include``), else those shipped in
    the ``nvidia-cutlass`` wheel. Raises ConfigError when neither exists."""
    roots = []
    if os.environ.get("CUTLASS_PATH"):
        roots.append(Path(os.environ["CUTLASS_PATH"]))
    import importlib.util
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
            return tuple(dirs)
    raise ConfigError("CUTLASS headers not found", gate="compile",
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
        if lib.is_file() and manifest.is_file():
            m = json.loads(manifest.read_text())
            return BuildResult(str(lib), key, True, 0.0, m["command"], m.get("log", ""))
        shim = folder / "kopt_shim.cu"
        shim.write_text(SHIM)
        tmp = folder / "kernel.so.tmp"
        cmd = nvcc_command(nvcc, source, shim, tmp, arch, include_dirs, cutlass)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=source.parent)
        except subprocess.TimeoutExpired:
            raise CompileError(f"nvcc ran past {timeout_s:.0f} s", gate="compile", path=display,
                               fix="raise --kopt-timeout or simplify the kernel (deep template instantiation?)") from None
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
            raise CompileError(f"nvcc failed (exit {proc.returncode})", gate="compile", path=display,
                               line=first, details=text, fix=fix)
        os.replace(tmp, lib)
        manifest.write_text(json.dumps({"command": cmd, "log": log, "seconds": seconds, "parts": parts,
                                        "headers": [str(h) for h in headers]}, indent=1))
        return BuildResult(str(lib), key, False, seconds, cmd, log)


def _first_error_line(log: str, display: str) -> int | None:
    # only the source's own errors: a header's line number is not a line of ``display``
    m = re.search(rf"^{re.escape(display)}:(\d+): error", log, re.M)
    return int(m.group(1)) if m else None


def build_triton(source: Path, ref: Path, dims: dict[str, Any], seed: int, arch: str, cache_root: Path,
                 device: str, triton_version: str | None, run_child: Any, display: str | None = None) -> BuildResult:
    """Compile the Triton kernels ``run_kernel`` launches into ``<cache_root>/<key>/triton/**.cubin``.

    ``run_child(request) -> dict`` runs the harness (mode ``triton_build``) in a child process with
    ``TRITON_CACHE_DIR`` pointing into the build folder. On a GPU the real JIT path compiles; without one, the
    launch is captured and compiled ahead of time for ``arch``. Raises CompileError on a compiler error.
    """
    display = display or str(source)
    parts = {"schema": BUILD_SCHEMA, "triton": triton_version, "arch": arch, "dims": dims, "device": device,
             "python": sys.version_info[:2]}
    # the kernel file and its neighbours: a @triton.jit helper may live in a module beside it
    key = _key(parts, sorted({source, *source.parent.glob("*.py")}))
    folder = cache_root / key
    folder.mkdir(parents=True, exist_ok=True)
    cache_dir = folder / "triton"
    manifest = folder / "manifest.json"
    with FileLock(str(folder / ".lock")):
        if manifest.is_file():
            m = json.loads(manifest.read_text())
            cubins = tuple(str(p) for p in sorted(cache_dir.rglob("*.cubin")))
            if cubins:
                return BuildResult(str(cache_dir), key, True, 0.0, m["command"], m.get("log", ""), cubins)
        t0 = time.perf_counter()
        req = {"mode": "triton_build", "kind": "triton", "kernel": str(source), "ref": str(ref), "dims": dims,
               "seed": seed, "device": device, "arch": arch, "env": {"TRITON_CACHE_DIR": str(cache_dir)}}
        result = run_child(req)
        seconds = time.perf_counter() - t0
        cubins = tuple(str(p) for p in sorted(cache_dir.rglob("*.cubin")))
        if not cubins:
            raise CompileError("Triton produced no cubin", gate="compile", path=display,
                               details=json.dumps(result)[:2000], fix="make run_kernel() launch the @triton.jit kernel")
        cmd = ["triton", result.get("mode", "?"), arch]
        manifest.write_text(json.dumps({"command": cmd, "log": "", "seconds": seconds, "parts": parts,
                                        "kernels": result.get("kernels")}, indent=1))
        return BuildResult(str(cache_dir), key, False, seconds, cmd, "", cubins)
