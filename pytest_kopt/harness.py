"""Child-process side of the GPU gates: builds inputs, runs the candidate and the reference, times, profiles.

Run as ``python -m pytest_kopt.harness REQUEST.json``. The pytest process never imports torch or touches CUDA:
it writes a request, runs this module in a fresh process (so a crash, a trap or a hang of the kernel takes down
only this child), and reads back ``<out>.json`` (and ``<out>.npz`` with the outputs for the comparison).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

DEFAULT_ATOL = 1e-3
DEFAULT_RTOL = 1e-3
INT_POISON = -0x5A5A5A5A  # sentinel written into integer outputs before a call


class HarnessError(Exception):
    """An error with a category the parent maps to a status: ``contract`` (ref/setup/shapes) or ``runtime``."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


def load_module(path: str, name: str) -> Any:
    """Import a Python file by path under ``name`` (the reference or a Triton kernel file)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise HarnessError("contract", f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's module failed at import
        raise HarnessError("contract", f"{path}: import failed: {type(exc).__name__}: {exc}") from exc
    return module


# ----------------------------------------------------------------------------------------------- inputs


def _torch_dtype(torch: Any, name: str) -> Any:
    return getattr(torch, name)


def _poison(torch: Any, t: Any) -> None:
    if t.dtype.is_floating_point or t.dtype.is_complex:
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(INT_POISON if torch.iinfo(t.dtype).min < 0 else torch.iinfo(t.dtype).max)


def _shape_table(ref: Any, dims: dict[str, Any], params: list[dict[str, Any]], ref_path: str) -> dict[str, tuple]:
    """Buffer shapes: ``ref.shapes(**dims)`` where defined, else upstream's flat fallback (product of the two
    largest integer dims) for every buffer."""
    table: dict[str, tuple] = {}
    given: dict[str, Any] = {}
    if hasattr(ref, "shapes"):
        try:
            given = dict(ref.shapes(**dims))
        except Exception as exc:
            raise HarnessError("contract", f"{ref_path}: shapes(**dims) raised {type(exc).__name__}: {exc}") from exc
    ints = sorted((int(v) for v in dims.values() if isinstance(v, int)), reverse=True)
    flat = ints[0] * ints[1] if len(ints) >= 2 else (ints[0] if ints else 1)
    for p in params:
        if p["role"] == "scalar":
            continue
        entry = given.get(p["name"])
        if entry is None:
            table[p["name"]] = (flat,)
            continue
        shape = entry[0] if isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], (tuple, list)) else entry
        try:
            table[p["name"]] = tuple(int(s) for s in shape)
        except (TypeError, ValueError):
            raise HarnessError("contract", f"{ref_path}: shapes()[{p['name']!r}] = {entry!r} is not (shape, dtype)") from None
    return table


def make_cuda_buffers(torch: Any, params: list[dict[str, Any]], dims: dict[str, Any], ref: Any, ref_path: str,
                      seed: int, device: str) -> dict[str, Any]:
    """Fresh tensors for every pointer of ``solve``: inputs drawn from N(0, 1) (floats) or U{0..15} (integers)
    with ``seed``; outputs NaN-poisoned (integers: a sentinel)."""
    shapes = _shape_table(ref, dims, params, ref_path)
    gen = torch.Generator(device=device).manual_seed(int(seed))
    buffers: dict[str, Any] = {}
    for p in params:
        if p["role"] == "scalar":
            continue
        dtype = _torch_dtype(torch, p["dtype"])
        shape = shapes[p["name"]]
        if p["role"] == "input":
            if dtype.is_floating_point:
                t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
            elif dtype == torch.bool:
                t = torch.randint(0, 2, shape, generator=gen, device=device).to(dtype)
            else:
                t = torch.randint(0, 16, shape, generator=gen, device=device).to(dtype)
        else:
            t = torch.empty(shape, device=device, dtype=dtype)
            _poison(torch, t)
        buffers[p["name"]] = t.contiguous()
    return buffers


class CudaKernel:
    """A ``solve`` loaded from the built shared library with ctypes, plus the shim's error/sync functions."""

    _CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double, "int32": ctypes.c_int32,
               "uint32": ctypes.c_uint32, "int64": ctypes.c_int64, "uint64": ctypes.c_uint64,
               "int16": ctypes.c_int16, "int8": ctypes.c_int8, "uint8": ctypes.c_uint8, "bool": ctypes.c_bool}

    def __init__(self, library: str, params: list[dict[str, Any]], dims: dict[str, Any]) -> None:
        self.lib = ctypes.CDLL(library)
        self.params = params
        self.dims = dims
        self.lib.solve.restype = None
        self.lib.solve.argtypes = [ctypes.c_void_p if p["role"] != "scalar" else self._CTYPES[p["dtype"]]
                                   for p in params]
        self.lib.kopt_sync.restype = ctypes.c_int
        self.lib.kopt_error_string.restype = ctypes.c_char_p
        self.lib.kopt_error_string.argtypes = [ctypes.c_int]

    def __call__(self, buffers: dict[str, Any]) -> None:
        args = [buffers[p["name"]].data_ptr() if p["role"] != "scalar" else self.dims[p["name"]] for p in self.params]
        self.lib.solve(*args)

    def check(self) -> None:
        """Synchronize the device and raise HarnessError('runtime') on any CUDA error of the launches."""
        err = self.lib.kopt_sync()
        if err:
            raise HarnessError("runtime", f"CUDA error {err}: {self.lib.kopt_error_string(err).decode()}")


# ----------------------------------------------------------------------------------------------- modes


class Problem:
    """One candidate + reference, ready to call: ``run()`` calls the candidate on ``buffers``, ``reference()``
    calls ``reference(**kwargs)`` on pristine copies."""

    def __init__(self, req: dict[str, Any], seed: int) -> None:
        import torch

        self.torch = torch
        self.req = req
        self.device = req["device"]
        self.dims = req["dims"]
        self.ref = load_module(req["ref"], "kopt_reference")
        if not callable(getattr(self.ref, "reference", None)):
            raise HarnessError("contract", f"{req['ref']}: reference is not a function")
        self.kernel: Any
        if req["kind"] == "cuda":
            self.kernel = CudaKernel(req["library"], req["params"], self.dims)
            self.buffers = make_cuda_buffers(torch, req["params"], self.dims, self.ref, req["ref"], seed, self.device)
            self.outputs = [p["name"] for p in req["params"] if p["role"] == "output"]
        else:
            self.kernel = load_module(req["kernel"], "kopt_triton_kernel")
            kwargs = dict(self.dims)
            kwargs["seed"] = int(seed)
            import inspect
            sig = inspect.signature(self.kernel.setup)
            if "device" in sig.parameters or any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
                kwargs["device"] = self.device
            try:
                spec = self.kernel.setup(**kwargs)
            except Exception as exc:
                raise HarnessError("contract", f"{req['kernel']}: setup() raised {type(exc).__name__}: {exc}") from exc
            if not isinstance(spec, dict) or "inputs" not in spec or "outputs" not in spec:
                raise HarnessError("contract", f"{req['kernel']}: setup() must return {{'inputs': {{...}}, 'outputs': [names]}}")
            self.buffers = dict(spec["inputs"])
            self.outputs = list(spec["outputs"])
            for name in self.outputs:
                if name not in self.buffers:
                    raise HarnessError("contract", f"{req['kernel']}: output {name!r} is not among setup()'s inputs")
            for name, t in self.buffers.items():
                if isinstance(t, torch.Tensor) and t.device.type != torch.device(self.device).type:
                    raise HarnessError("contract", f"{req['kernel']}: setup() put {name!r} on {t.device}, expected "
                                       f"{self.device}; add a `device` parameter to setup() and create tensors on it")
        for name in self.outputs:
            _poison(torch, self.buffers[name])
        self.pristine = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in self.buffers.items()}

    def run(self, buffers: dict[str, Any] | None = None) -> None:
        """Call the candidate once and wait for it; raises HarnessError('runtime') on a CUDA error."""
        b = self.buffers if buffers is None else buffers
        if self.req["kind"] == "cuda":
            self.kernel(b)
            self.kernel.check()
        else:
            self.kernel.run_kernel(**b)
            if self.device == "cuda":
                self.torch.cuda.synchronize()

    def launch(self) -> None:
        """Call the candidate once without waiting (for timing)."""
        if self.req["kind"] == "cuda":
            self.kernel(self.buffers)
        else:
            self.kernel.run_kernel(**self.buffers)

    def ref_buffers(self) -> dict[str, Any]:
        """Fresh copies of the pristine inputs, with NaN-poisoned outputs, for one reference call."""
        b = {k: (v.clone() if isinstance(v, self.torch.Tensor) else v) for k, v in self.pristine.items()}
        return b

    def reference(self, b: dict[str, Any]) -> None:
        """Call ``reference(**dims, **buffers)``; raises HarnessError('contract') if it raises."""
        kwargs = {**self.dims, **b}
        try:
            self.ref.reference(**kwargs)
        except Exception as exc:
            raise HarnessError("contract", f"{self.req['ref']}: reference() raised {type(exc).__name__}: {exc}") from exc
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def tolerances(self) -> tuple[float, float, str]:
        """(atol, rtol, source): the command-line override, else the reference's, else the defaults 1e-3/1e-3."""
        atol, rtol = self.req.get("atol"), self.req.get("rtol")
        src = []
        if atol is None:
            atol = getattr(self.ref, "atol", None)
            src.append("ref.atol" if atol is not None else "default atol")
            atol = DEFAULT_ATOL if atol is None else float(atol)
        else:
            src.append("--kopt-atol")
        if rtol is None:
            rtol = getattr(self.ref, "rtol", None)
            src.append("ref.rtol" if rtol is not None else "default rtol")
            rtol = DEFAULT_RTOL if rtol is None else float(rtol)
        else:
            src.append("--kopt-rtol")
        return float(atol), float(rtol), ", ".join(src)


def _to_numpy(torch: Any, t: Any) -> Any:
    t = t.detach()
    if t.dtype in (torch.bfloat16,):
        t = t.float()  # exact: every bf16 value is a float32 value
    return t.cpu().numpy()


def mode_correctness(req: dict[str, Any]) -> dict[str, Any]:
    """Run candidate and reference for one seed; save both outputs to ``<out>.npz`` for the parent to compare."""
    import numpy as np

    seed = int(req["seed"])
    prob = Problem(req, seed)
    torch = prob.torch
    t0 = time.perf_counter()
    prob.run()
    cand_ms = (time.perf_counter() - t0) * 1e3
    rb = prob.ref_buffers()
    for name in prob.outputs:
        _poison(torch, rb[name])
    prob.reference(rb)
    arrays: dict[str, Any] = {}
    for name in prob.outputs:
        c, r = prob.buffers[name], rb[name]
        if not isinstance(c, torch.Tensor):
            raise HarnessError("contract", f"output {name!r} is not a tensor")
        if r.dtype.is_floating_point and bool(torch.isnan(r).all()) and r.numel() > 0:
            raise HarnessError("contract", f"{req['ref']}: reference() left output {name!r} unwritten (all NaN); "
                               "write outputs in place, e.g. C.copy_(A @ B), not C = A @ B")
        arrays[f"cand__{name}"] = _to_numpy(torch, c)
        arrays[f"ref__{name}"] = _to_numpy(torch, r)
    np.savez(req["out"] + ".npz", **arrays)
    atol, rtol, src = prob.tolerances()
    return {"outputs": prob.outputs, "atol": atol, "rtol": rtol, "tol_source": src, "first_call_ms": cand_ms,
            "dtypes": {n: str(prob.buffers[n].dtype).replace("torch.", "") for n in prob.outputs},
            "shapes": {n: list(prob.buffers[n].shape) for n in prob.outputs}}


def _time_calls(torch: Any, fn: Any, flush: Any, warmup_ms: float, min_reps: int, max_reps: int,
                budget_s: float) -> list[float]:
    """Time ``fn`` with CUDA events, L2 flushed (``flush.zero_()``) before every call outside the timed window.

    Warmup: calls until ``warmup_ms`` of wall time and at least 3 calls. Then repeats until ``min_reps`` samples
    and ``budget_s`` seconds spent, or ``max_reps``. Returns the samples in ms."""
    t_end = time.perf_counter() + warmup_ms / 1e3
    n = 0
    while n < 3 or time.perf_counter() < t_end:
        fn()
        torch.cuda.synchronize()
        n += 1
    samples: list[float] = []
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    deadline = time.perf_counter() + budget_s
    while len(samples) < max_reps and (len(samples) < min_reps or time.perf_counter() < deadline):
        flush.zero_()
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(stop))
    return samples


def mode_timing(req: dict[str, Any]) -> dict[str, Any]:
    """Time the candidate and the reference on the same inputs (first seed); return both sample lists in ms."""
    prob = Problem(req, int(req["seed"]))
    torch = prob.torch
    if prob.device != "cuda":
        raise HarnessError("runtime", "timing needs a CUDA device")
    prob.run()  # first call: module load / JIT outside the measurement; checks the launch once
    props = torch.cuda.get_device_properties(0)
    l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
    flush = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")  # FIELD.md: write >= 2x L2 to flush it
    t = req["timing"]
    kernel_ms = _time_calls(torch, prob.launch, flush, t["warmup_ms"], t["min_reps"], t["max_reps"], t["budget_s"])
    prob.run()  # surfaces an error raised by any timed launch
    rb = prob.ref_buffers()
    ref_ms = _time_calls(torch, lambda: prob.reference(rb), flush, t["warmup_ms"], t["min_reps"], t["max_reps"],
                         t["budget_s"])
    workload = None
    if callable(getattr(prob.ref, "workload_model", None)):
        try:
            workload = {k: float(v) for k, v in dict(prob.ref.workload_model(**prob.dims)).items()}
        except Exception as exc:
            raise HarnessError("contract", f"{req['ref']}: workload_model(**dims) raised {type(exc).__name__}: {exc}") from exc
    return {"kernel_ms": kernel_ms, "reference_ms": ref_ms, "workload": workload, "l2_bytes": l2, "flush_bytes": 2 * l2,
            "gpu": torch.cuda.get_device_name(0)}


def mode_profile(req: dict[str, Any]) -> dict[str, Any]:
    """Under ncu: warm up, then one candidate call inside the NVTX range ``kopt_target`` (the only one profiled)."""
    prob = Problem(req, int(req["seed"]))
    torch = prob.torch
    prob.run()
    torch.cuda.nvtx.range_push("kopt_target")
    prob.launch()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    prob.run()
    return {}


_TRITON_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int32": "i32",
                 "int64": "i64", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1",
                 "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5"}


def mode_triton_build(req: dict[str, Any]) -> dict[str, Any]:
    """Compile the Triton kernels that ``run_kernel`` launches, for the request's arch.

    On a GPU: one real call (Triton's JIT writes the cubin into ``TRITON_CACHE_DIR``). Without one: the launch is
    intercepted to read the kernel's arguments, and ``triton.compile`` builds it ahead of time for
    ``GPUTarget("cuda", cc, 32)``, which needs no GPU. Returns the kernel names."""
    import torch
    import triton
    from triton.runtime.jit import JITFunction

    if req["device"] == "cuda":
        prob = Problem(req, int(req["seed"]))
        prob.run()
        return {"mode": "jit"}
    captured: list[tuple[Any, tuple, dict]] = []
    original = JITFunction.run

    def capture(self: Any, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> None:
        captured.append((self, args, kwargs))

    JITFunction.run = capture  # type: ignore[method-assign]
    try:
        prob = Problem(req, int(req["seed"]))
        prob.kernel.run_kernel(**prob.buffers)
    finally:
        JITFunction.run = original  # type: ignore[method-assign]
    if not captured:
        raise HarnessError("contract", f"{req['kernel']}: run_kernel() launched no @triton.jit kernel "
                           "(an @triton.autotune kernel must be pinned to one config first)")
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
                signature[name] = "*" + _TRITON_TYPES[str(v.dtype).replace("torch.", "")]
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
            triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)
        except Exception as exc:
            raise HarnessError("compile", f"{fn.__name__}: {type(exc).__name__}: {exc}") from exc
        names.append(fn.__name__)
    return {"mode": "aot", "kernels": names}


MODES = {"correctness": mode_correctness, "timing": mode_timing, "profile": mode_profile,
         "triton_build": mode_triton_build}


def main(argv: list[str]) -> int:
    """Entry point: read the request, run its mode, write ``<out>.json``; exit 0 on success, 1 on error."""
    req = json.loads(Path(argv[1]).read_text())
    result: dict[str, Any]
    try:
        result = {"ok": True, **MODES[req["mode"]](req)}
        code = 0
    except HarnessError as exc:
        result = {"ok": False, "category": exc.category, "message": str(exc), "traceback": traceback.format_exc()}
        code = 1
    except Exception as exc:  # the candidate's own Python (Triton) raised
        result = {"ok": False, "category": "runtime", "message": f"{type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc()}
        code = 1
    Path(req["out"] + ".json").write_text(json.dumps(result, default=_jsonable))
    sys.stdout.flush()
    return code


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


if __name__ == "__main__":
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sys.exit(main(sys.argv))
