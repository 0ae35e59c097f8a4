"""nvcc for ``.cu`` kernels (CUDA and CUTLASS): the command line, the shim compiled beside the source, CUTLASS's
include folders, nvcc's diagnostics as ``file:line`` and the content-addressed build of a shared library.

The cache key covers the source, every local header it includes (recursively), nvcc and its version, the flags, the
arch and (CUTLASS) the headers' version: ``cutlass/version.h``'s hash and the wheel's version (SKILL.md's build
manifest). A ``filelock`` per key lets parallel xdist
workers share builds.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import warnings
from pathlib import Path

from filelock import FileLock

from ..artifacts import read_dict, write_json, write_text
from ..errors import CompileError, ConfigError, HardwareError
from ..gates.build import BUILD_SCHEMA, INTERRUPTED, BuildResult, cache_key
from ..gates.contract import local_headers

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


def format_nvcc_errors(log: str, source: Path, display: str) -> str:
    """Rewrite nvcc's ``file(12): error`` diagnostics as ``file:12: error`` (clickable), keeping the rest."""
    def repl(m: re.Match[str]) -> str:
        f = m.group("file")
        name = display if Path(f).name == source.name else f
        return f"{name}:{m.group('line')}: {m.group('kind')}"
    return _NVCC_DIAG_RE.sub(repl, log)


def cutlass_headers(include_dirs: tuple[Path, ...]) -> dict[str, str | None]:
    """What identifies the CUTLASS headers a build includes (SKILL.md: the build manifest covers the include
    inputs): the SHA-256 of ``cutlass/version.h`` (its ``CUTLASS_MAJOR/MINOR/PATCH``; ``cutlass/cutlass.h`` where
    there is none) in the first include folder, and the ``nvidia-cutlass`` wheel's version when one is installed.
    Two CUTLASS releases at one path (a checkout moved to another tag, a wheel upgraded in place) get different
    keys; the folders' paths alone did not tell them apart."""
    import hashlib
    from importlib import metadata

    digest = None
    for name in ("version.h", "cutlass.h"):
        f = include_dirs[0] / "cutlass" / name if include_dirs else None
        if f is not None and f.is_file():
            digest = f"{name}:{hashlib.sha256(f.read_bytes()).hexdigest()}"
            break
    try:
        wheel: str | None = metadata.version("nvidia-cutlass")
    except metadata.PackageNotFoundError:
        wheel = None
    return {"header": digest, "wheel": wheel}


def build_parts(nvcc_version: str | None, arch: str, cutlass: bool, include_dirs: tuple[Path, ...]) -> dict:
    """What a build's cache key covers besides the sources (:func:`pytest_kopt.gates.build.cache_key`): the build
    schema, nvcc's version, the arch, the shim, the flags, and for CUTLASS the include folders and their headers'
    identity (:func:`cutlass_headers`). A plain CUDA build's parts are unchanged, so its cached builds stay valid."""
    parts = {"schema": BUILD_SCHEMA, "nvcc": nvcc_version, "arch": arch, "shim": SHIM, "cutlass": cutlass,
             "include_dirs": [str(d) for d in include_dirs],
             "flags": nvcc_command("nvcc", Path("s.cu"), Path("shim.cu"), Path("o.so"), arch, (), cutlass)}
    if cutlass:
        parts["cutlass_headers"] = cutlass_headers(include_dirs)
    return parts


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
    parts = build_parts(nvcc_version, arch, cutlass, include_dirs)
    key = cache_key(parts, [source, *headers])
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
                # nvcc's whole output beside the build, for a log the item's details cut
                log_path = folder / "nvcc_error.log"
                write_text(log_path, f"$ {' '.join(map(str, cmd))}\n{proc.stdout}{proc.stderr}")
                fix = f"fix the errors nvcc reported (this item's details; all its output: {log_path})"
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
        write_json(manifest, {"command": cmd, "log": log, "seconds": seconds, "parts": parts,
                              "headers": [str(h) for h in headers]})
        return BuildResult(str(lib), key, False, seconds, cmd, log, include_dirs=tuple(map(str, include_dirs)))


_KILLED = re.compile(r"died due to signal|terminated by signal|^Killed$", re.M)


def _first_error_line(log: str, display: str) -> int | None:
    # only the source's own errors: a header's line number is not a line of ``display``
    m = re.search(rf"^{re.escape(display)}:(\d+): error", log, re.M)
    return int(m.group(1)) if m else None


