"""Building a Triton kernel file's kernels in a harness process: the JIT on a GPU, ``triton.compile`` ahead of time
for the target arch without one."""

from __future__ import annotations

from typing import Any

from pathlib import Path

from . import HarnessError, autotune
from .kernels import Candidate

#: torch dtype name -> Triton signature type
TRITON_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int32": "i32",
                "int64": "i64", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1",
                "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5"}


#: What to change when ``run_kernel()`` raises while the compile gate calls it to find its kernels.
BUILD_CALL_FIX = ("fix run_kernel() where the traceback in this item's details points: the compile gate calls it "
                  "once, on inputs from setup(), to find and build its @triton.jit kernels")


def mode_triton_build(req: dict[str, Any]) -> dict[str, Any]:
    """Compile the Triton kernels that ``run_kernel`` launches, for the request's arch.

    On a GPU: one real call (Triton's JIT writes the cubin into ``TRITON_CACHE_DIR``). Without one: the launch is
    intercepted to read the kernel's arguments, and ``triton.compile`` builds it ahead of time for
    ``GPUTarget("cuda", cc, 32)``, which needs no GPU. An ``@triton.autotune`` kernel is tuned by Triton on a GPU
    (:mod:`~pytest_kopt.child.autotune`, mode ``tune``), and has every config compiled without one (mode ``each``;
    its first config is the stated one, and correctness runs each in turn). One cubin per kernel, the chosen config's, goes to ``req["pinned_dir"]``
    (for the SASS gate). Returns the mode, the kernel names, ``autotune`` (per autotuned kernel: ``config``,
    ``configs``, ``all``, ``compiled``) and ``pinned`` (the cubin paths)."""
    import torch
    import triton
    from triton.runtime.jit import JITFunction

    first: dict[str, Any] = {}  # kernel name -> its first compiled kernel
    original = JITFunction.run
    if req["device"] == "cuda":
        autotune.install("tune")

        def record(self: Any, *args: Any, **kwargs: Any) -> Any:
            kernel = original(self, *args, **kwargs)
            first.setdefault(self.__name__, kernel)
            return kernel

        JITFunction.run = record  # type: ignore[method-assign]
        try:
            Candidate(req).run()
        except HarnessError:
            raise
        except Exception as exc:  # a Triton compile error, or the candidate's own Python: either fails its build
            raise HarnessError("compile", f"run_kernel() raised {type(exc).__name__}: {exc}",
                               fix=BUILD_CALL_FIX) from exc
        finally:
            JITFunction.run = original  # type: ignore[method-assign]
        tuned = autotune.chosen()
        first.update({n: c["kernel"] for n, c in autotune.CHOSEN.items() if c["kernel"] is not None})
        return {"mode": "jit", "kernels": sorted(first), "autotune": tuned,
                "pinned": _save_cubins(first, req.get("pinned_dir"))}
    captured: list[tuple[Any, tuple, dict]] = []
    autotune.install("each")

    def capture(self: Any, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> None:
        captured.append((self, args, kwargs))

    JITFunction.run = capture  # type: ignore[method-assign]
    try:
        Candidate(req).launch()
    except HarnessError:
        raise
    except Exception as exc:  # the candidate's own Python, before any kernel compiled: its file's error
        raise HarnessError("compile", f"run_kernel() raised {type(exc).__name__}: {exc}", fix=BUILD_CALL_FIX) from exc
    finally:
        JITFunction.run = original  # type: ignore[method-assign]
    if not captured:
        raise HarnessError("contract", f"{req['kernel']}: run_kernel() launched no @triton.jit kernel",
                           fix="launch the @triton.jit kernel from run_kernel() (kernel[grid](...))")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cc = int(req["arch"].removeprefix("sm_").rstrip("af"))
    names = []
    for fn, args, kwargs in captured:
        options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages", "num_ctas", "maxnreg") if k in kwargs}
        values = dict(zip(fn.arg_names, args))
        values.update(kwargs)
        signature: dict[str, str] = {}
        constexprs: dict[str, Any] = {}
        for i, name in enumerate(fn.arg_names):
            p = fn.params[i]
            v = values.get(name, p.default if hasattr(p, "default") else None)
            if p.is_constexpr:
                signature[name] = "constexpr"
                constexprs[name] = v
            elif isinstance(v, torch.Tensor):
                signature[name] = "*" + TRITON_TYPES[str(v.dtype).replace("torch.", "")]
            elif isinstance(v, bool):
                signature[name] = "i1"
            elif isinstance(v, int):
                signature[name] = "i32" if -2**31 <= v < 2**31 else "i64"
            elif isinstance(v, float):
                signature[name] = "fp32"
            elif v is None:
                signature[name] = "constexpr"
                constexprs[name] = None
            else:
                raise HarnessError("contract", f"{req['kernel']}: argument {name}={v!r} of {fn.__name__} has a type "
                                   "the ahead-of-time compile cannot map")
        src = ASTSource(fn, signature, constexprs=constexprs)
        try:
            kernel = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)
        except Exception as exc:
            raise HarnessError("compile", f"{fn.__name__}: {type(exc).__name__}: {exc}") from exc
        names.append(fn.__name__)
        first.setdefault(fn.__name__, kernel)
    tuned = {n: {**c, "compiled": names.count(n)} for n, c in autotune.chosen().items()}
    return {"mode": "aot", "kernels": sorted(set(names)), "autotune": tuned,
            "pinned": _save_cubins(first, req.get("pinned_dir"))}


def _save_cubins(kernels: dict[str, Any], folder: str | None) -> list[str]:
    """Write each compiled kernel's cubin to ``<folder>/<name>.cubin``; returns the paths ([] without a folder)."""
    if not folder:
        return []
    Path(folder).mkdir(parents=True, exist_ok=True)
    paths = []
    for name, kernel in sorted(kernels.items()):
        cubin = getattr(kernel, "asm", {}).get("cubin") if kernel is not None else None
        if cubin:
            path = Path(folder) / f"{name}.cubin"
            path.write_bytes(cubin)
            paths.append(str(path))
    return paths
