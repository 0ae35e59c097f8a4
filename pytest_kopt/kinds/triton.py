"""Triton kernels: a ``.py`` that imports triton and defines a ``@triton.jit`` kernel, launched by ``run_kernel``.

Built by running ``run_kernel`` once in the candidate's harness process with ``TRITON_CACHE_DIR`` in the build
folder (on a GPU Triton's JIT compiles, and tunes an ``@triton.autotune`` kernel once; without one the launch is
captured and compiled ahead of time for the arch); its SASS is that of the cubins. Without a GPU its correctness
runs in Triton's interpreter (``TRITON_INTERPRET=1``), except for dtypes the interpreter miscomputes.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

from ..artifacts import read_dict, write_json
from ..errors import CompileError, HardwareError
from ..gates.build import BUILD_SCHEMA, BuildResult, cache_key
from ..gates.inputs import draw_plan
from .pyfile import PyFileKind

if TYPE_CHECKING:
    from ..gates.context import Context

#: dtypes Triton's interpreter (TRITON_INTERPRET=1) does not compute right: triton 3.8 raises
#: ``'InterpreterBuilder' object has no attribute 'get_bf16'`` on ``2.0 * x`` of a bfloat16 x; an earlier session
#: reported NumPy arithmetic on the bit patterns (2*x of [-0.54, -2.14, -0.82] giving [-0.0, 2.0, 0.0])
INTERPRETER_UNSOUND = frozenset({"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"})


def triton_key(source: Path, arch: str, dims: dict[str, Any], device: str,
               triton_version: str | None, precision: str | None = None) -> tuple[str, dict[str, Any]]:
    """(build key, the parts it covers) of a Triton kernel file: the file and its ``.py`` neighbours (a
    ``@triton.jit`` helper may live beside it), which of them is built (else a.py and b.py of one folder would share
    a key, and b.py get a.py's cubins), triton's version, the arch, the dims, the device, Python's version and
    ``--kopt-precision`` (a KernelBench problem's inputs in fp16 specialize the kernels to other cubins than fp32)."""
    parts = {"schema": BUILD_SCHEMA, "triton": triton_version, "arch": arch, "dims": dims, "device": device,
             "python": sys.version_info[:2], "kernel": source.name}
    if precision is not None:  # absent by default, so the keys of every build without it stay as they were
        parts["precision"] = precision
    return cache_key(parts, sorted({source, *source.parent.glob("*.py")})), parts


def triton_cache_dir(ctx: Context) -> Path:
    """``TRITON_CACHE_DIR`` of ``ctx``'s Triton kernel: its build's folder (known before it is built, so the
    compile, plan and correctness requests share one warm process)."""
    key, _ = triton_key(ctx.kernel, ctx.arch, ctx.build_dims, "cuda" if ctx.gpu else "cpu",
                        ctx.env.get("packages", {}).get("triton"), ctx.settings.precision)
    return ctx.cache_dir / "builds" / key / "triton"


def build_triton(source: Path, ref: Path, dims: dict[str, Any], seed: int, arch: str, cache_root: Path,
                 device: str, triton_version: str | None, run_child: Any, display: str | None = None,
                 precision: str | None = None) -> BuildResult:
    """Compile the Triton kernels ``run_kernel`` launches into ``<cache_root>/<key>/triton/**.cubin``; the build's
    cubins are those this compile made (listed in ``manifest.json``), not what the folder holds later.

    ``run_child(request) -> dict`` runs the harness (mode ``triton_build``) in a child process with
    ``TRITON_CACHE_DIR`` pointing into the build folder. On a GPU the real JIT path compiles; without one, the
    launch is captured and compiled ahead of time for ``arch``. Raises CompileError on a compiler error.
    """
    display = display or str(source)
    key, parts = triton_key(source, arch, dims, device, triton_version, precision)
    folder = cache_root / key
    folder.mkdir(parents=True, exist_ok=True)
    cache_dir = folder / "triton"
    manifest = folder / "manifest.json"
    with FileLock(str(folder / ".lock")):
        m = read_dict(manifest)
        own = _own_files(m, cache_dir, folder) if m is not None and "command" in m else None
        if own is not None:
            cubins, pinned = own
            return BuildResult(str(cache_dir), key, True, 0.0, m["command"], m.get("log", ""), cubins,
                               pinned=pinned, autotune=dict(m.get("autotune") or {}))
        # built anew (no manifest, or one that does not list files of this folder that exist): what an earlier build
        # or its correctness requests left in the folder is not this build's
        shutil.rmtree(cache_dir, ignore_errors=True)
        t0 = time.perf_counter()
        req = {"mode": "triton_build", "kind": "triton", "launcher": "module", "autotune": True, "kernel": str(source), "ref": str(ref), "dims": dims,
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
                              "kernels": result.get("kernels"), "pinned": list(pinned), "autotune": tuned,
                              "cubins": [str(Path(c).relative_to(cache_dir)) for c in cubins]})
        return BuildResult(str(cache_dir), key, False, seconds, cmd, "", cubins, pinned=pinned, autotune=tuned)


def _own_files(m: dict[str, Any], cache_dir: Path, folder: Path) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """A cached build's own cubins and pinned cubins (paths), as its manifest ``m`` lists them; None (build again)
    unless every entry is a ``.cubin`` that exists inside its folder (``cubins`` relative to ``cache_dir``, the
    kernel's TRITON_CACHE_DIR, where its correctness requests JIT-compile other shapes' specializations later;
    ``pinned`` under ``folder``): the manifest lies in a cache the kernel's own processes can write to."""
    listed, pinned = m.get("cubins"), m.get("pinned") or []
    if not (isinstance(listed, list) and listed and isinstance(pinned, list)):
        return None
    cubins, pins = _inside(listed, cache_dir), _inside(pinned, folder)
    return None if cubins is None or pins is None else (cubins, pins)


def _inside(names: list[Any], base: Path) -> tuple[str, ...] | None:
    """``base / name`` for each of ``names``; None unless each is a ``.cubin`` file that exists under ``base``."""
    paths = [base / n for n in names if isinstance(n, str) and n.endswith(".cubin")]
    if len(paths) < len(names) or not all(p.resolve().is_relative_to(base.resolve()) and p.is_file() for p in paths):
        return None
    return tuple(str(p) for p in paths)


class TritonKind(PyFileKind):
    """A ``.py`` whose source imports triton and decorates a kernel with ``@triton.jit``."""

    name = "triton"
    what = "@triton.jit kernel"
    requires_jit = True
    cpu_gates = frozenset({"correctness"})

    def detect(self, path: Path) -> bool:
        """A ``.py`` that uses ``@triton.jit`` (or, for a file that does not parse, imports triton: the preflight
        item then reports the syntax error)."""
        from ..gates.pycontract import imports_triton

        return path.suffix == ".py" and imports_triton(path)

    def check_tools(self, ctx: Context) -> None:
        """HardwareError when triton is not installed."""
        if not ctx.env.get("packages", {}).get("triton"):
            raise HardwareError("triton is not installed, so the Triton kernel cannot be built", gate="hardware",
                                fix="pip install triton")

    def build(self, ctx: Context, root: Path) -> BuildResult:
        """:func:`build_triton` in the candidate's correctness process (the environment of its correctness
        requests), with the first seed's input plan; the run of ``run_kernel`` gets ``--kopt-timeout``, the
        compile of its kernels 120 s more."""
        device = "cuda" if ctx.gpu else "cpu"

        def run_child(req: dict[str, Any]) -> dict[str, Any]:
            req = {**req, "plan": draw_plan(ctx.settings.seeds[0], 0, ctx.regimes), "env": self.compile_env(ctx),
                   "precision": ctx.settings.precision}
            return ctx.pool.run(req, gate="compile", timeout_s=ctx.settings.gate_timeout_s + 120.0, path=ctx.display,
                                workdir=ctx.work, server=ctx.server("check"))

        return build_triton(ctx.kernel, ctx.ref, ctx.build_dims, ctx.settings.seeds[0], ctx.arch, root, device,
                            ctx.env.get("packages", {}).get("triton"), run_child, display=ctx.display,
                            precision=ctx.settings.precision)

    def build_inputs(self, ctx: Context) -> tuple[Any, ...]:
        """The dims, and ``--kopt-precision`` where given: a Triton build's launch shape and input dtypes are part of
        it (without the option the mark is what it was before the precision counted)."""
        return (ctx.build_dims,) if ctx.settings.precision is None else (ctx.build_dims, ctx.settings.precision)

    def compile_env(self, ctx: Context) -> dict[str, str]:
        """``TRITON_CACHE_DIR`` in the kernel's build folder (:func:`triton_cache_dir`)."""
        return {"TRITON_CACHE_DIR": str(triton_cache_dir(ctx))}

    def candidate_env(self, ctx: Context, device: str) -> dict[str, str]:
        """:meth:`compile_env`, plus ``TRITON_INTERPRET=1`` on the CPU (never for the build, which must compile)."""
        env = self.compile_env(ctx)
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        return env

    def request_fields(self, ctx: Context) -> dict[str, Any]:
        """``autotune``: the harness installs its autotune policy (pin the build's config; tune on a GPU; the first
        config on the CPU) before importing the file."""
        return {**super().request_fields(ctx), "autotune": True}

    def sass_artifacts(self, res: BuildResult) -> list[str]:
        """The pinned config's cubins of an ``@triton.autotune`` build (it holds every config's), else every
        cubin."""
        return list(res.pinned) if res.autotune and res.pinned else list(res.cubins) or [res.artifact]

    def cpu_runner(self, device: str) -> str | None:
        """``interpreter (TRITON_INTERPRET=1)`` on the CPU."""
        return "interpreter (TRITON_INTERPRET=1)" if device == "cpu" else None

    def unsound_dtypes(self, device: str) -> frozenset[str]:
        """:data:`INTERPRETER_UNSOUND` on the CPU."""
        return INTERPRETER_UNSOUND if device == "cpu" else frozenset()

    def timeout_hint(self, device: str) -> str | None:
        """On the CPU: the interpreter's pace, and smaller dims."""
        if device != "cpu":
            return None
        return ("Triton's interpreter runs the kernel on the CPU, element by element in NumPy: minutes at sizes a GPU "
                "takes in milliseconds; give smaller --kopt-dims for a run without a GPU (e.g. a few thousand "
                "elements per buffer), or raise --kopt-timeout")
