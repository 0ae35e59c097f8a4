"""Child-process side of the GPU gates: builds inputs, runs the candidate and the reference, times, profiles.

Run as ``python -m pytest_kopt.harness REQUEST.json`` (one request), or ``--serve CTL_FD`` (a warm process that
runs request after request for one kernel or one reference). The pytest process never imports torch or touches
CUDA: it writes a request, runs it in a child process (so a crash, a trap or a hang of the kernel takes down only
that child), and reads back ``<out>.json`` (and ``<out>.npz`` with the outputs for the comparison).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import math
import os
import statistics
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


#: Modules imported in this process, by (name, path, mtime_ns, size): a warm process imports a kernel or reference
#: file once (importing some files twice fails, e.g. a torch.library definition), and again only when it changed.
_MODULES: dict[tuple[str, str, int, int], Any] = {}


def load_module(path: str, name: str) -> Any:
    """Import a Python file by path under ``name`` (the reference or a Triton kernel file), once per version of
    the file in this process, compiled from its source (a ``.pyc`` is never read for it). Raises
    HarnessError('contract') when it cannot be imported."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise HarnessError("contract", f"{path}: cannot be read: {exc}") from exc
    key = (name, str(path), st.st_mtime_ns, st.st_size)
    if key in _MODULES:
        sys.modules[name] = _MODULES[key]
        return _MODULES[key]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise HarnessError("contract", f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = str(Path(path).resolve().parent)
    if folder not in sys.path:  # its neighbours stay importable, after the standard library: never shadowing it
        sys.path.append(folder)
    try:
        # compiled from its source, never from a __pycache__ .pyc, which a candidate's process (same user) could
        # plant beside ref.py with the source's mtime and size in its header
        exec(compile(Path(path).read_bytes(), path, "exec", dont_inherit=True), module.__dict__)
    except Exception as exc:  # the user's module failed at import
        raise HarnessError("contract", f"{path}: import failed: {type(exc).__name__}: {exc}") from exc
    _MODULES[key] = module
    return module


# ----------------------------------------------------------------------------------------------- inputs


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


def _contiguous_stride(shape: list[int]) -> list[int]:
    stride, acc = [], 1
    for n in reversed(shape):
        stride.append(acc)
        acc *= max(1, n)
    return list(reversed(stride))


def fill_drawn(torch: Any, t: Any, plan: dict[str, Any], gen: Any) -> None:
    """Fill ``t`` in place following the plan's regime (see :func:`pytest_kopt.inputs.draw_plan`); integer
    tensors get U{0..15}, booleans U{0, 1}."""
    shape, dev = tuple(t.shape), t.device
    if t.dtype.is_floating_point:
        r = plan["regime"]
        if r == "uniform":
            v = (torch.rand(shape, generator=gen, device=dev) * 2 - 1) * plan["scale"]
        elif r == "small_int":
            v = torch.randint(plan["int_lo"], plan["int_hi"] + 1, shape, generator=gen, device=dev).float()
        elif r == "wide":
            mag = (torch.rand(shape, generator=gen, device=dev) * 2 - 1) * plan["decades"]
            v = torch.randn(shape, generator=gen, device=dev) * torch.pow(10.0, mag)
        else:
            v = torch.randn(shape, generator=gen, device=dev) * plan["scale"]
        t.copy_(v)
    elif t.dtype == torch.bool:
        t.copy_(torch.randint(0, 2, shape, generator=gen, device=dev).bool())
    else:
        t.copy_(torch.randint(0, 16, shape, generator=gen, device=dev))


class Inputs:
    """The buffers of one problem instance, owned by the harness: every tensor is a fresh plain ``torch.Tensor``
    allocated here (so a candidate's ``setup`` cannot hand in subclasses, proxies or aliased views).

    ``spec`` lists the buffers in call order: ``{name, role (input|output), shape, stride, dtype, source}``;
    ``source`` is ``drawn`` (filled from the plan), ``make_inputs`` (the reference's generator) or ``setup``
    (integer/bool tensors from a Triton ``setup``, kept as given and shipped to the reference process).
    ``scalars`` holds non-tensor arguments (dims and ``setup``'s plain values)."""

    def __init__(self, torch: Any, spec: list[dict[str, Any]], scalars: dict[str, Any], device: str) -> None:
        self.torch = torch
        self.spec = spec
        self.scalars = scalars
        self.device = device
        self.tensors: dict[str, Any] = {}
        for s in spec:
            self.tensors[s["name"]] = torch.empty_strided(s["shape"], s["stride"], dtype=getattr(torch, s["dtype"]),
                                                          device=device)

    @property
    def outputs(self) -> list[str]:
        """Names of the output buffers."""
        return [s["name"] for s in self.spec if s["role"] == "output"]

    def fill(self, plan: dict[str, Any], seed: int, ref: Any, dims: dict[str, Any], given: dict[str, Any]) -> None:
        """Fill inputs for ``seed`` (drawn, make_inputs or given setup values); poison the outputs."""
        torch = self.torch
        gen = torch.Generator(device=self.device).manual_seed(int(seed))
        made: dict[str, Any] = {}
        if callable(getattr(ref, "make_inputs", None)):
            made = dict(ref.make_inputs(seed=int(seed), **dims))
        for s in self.spec:
            t = self.tensors[s["name"]]
            if s["role"] == "output":
                _poison(torch, t)
            elif s["name"] in made:
                t.copy_(torch.as_tensor(made[s["name"]]).to(device=self.device, dtype=t.dtype).reshape(t.shape))
            elif s["source"] == "setup":
                t.copy_(given[s["name"]])
            else:
                fill_drawn(torch, t, plan, gen)

    def poison_outputs(self) -> None:
        """NaN (or a sentinel) into every output before a call."""
        for name in self.outputs:
            _poison(self.torch, self.tensors[name])

    def kwargs(self) -> dict[str, Any]:
        """Arguments by name: tensors and scalars."""
        return {**self.scalars, **self.tensors}


def spec_from_params(ref: Any, ref_path: str, params: list[dict[str, Any]], dims: dict[str, Any],
                     made: dict[str, Any]) -> list[dict[str, Any]]:
    """Buffer spec of a CUDA ``solve``: dtype from the signature, shape from ``make_inputs``, ``shapes()`` or the
    flat fallback."""
    shapes = _shape_table(ref, dims, params, ref_path)
    spec = []
    for p in params:
        if p["role"] == "scalar":
            continue
        shape = list(made[p["name"]].shape) if p["name"] in made else list(shapes[p["name"]])
        spec.append({"name": p["name"], "role": p["role"], "shape": shape, "stride": _contiguous_stride(shape),
                     "dtype": p["dtype"], "source": "make_inputs" if p["name"] in made else "drawn"})
    return spec


def spec_from_setup(torch: Any, setup_result: Any, path: str) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Spec, scalars and kept integer tensors from a Triton/Python ``setup()`` result."""
    if not isinstance(setup_result, dict) or "inputs" not in setup_result or "outputs" not in setup_result:
        raise HarnessError("contract", f"{path}: setup() must return {{'inputs': {{...}}, 'outputs': [names]}}")
    inputs = dict(setup_result["inputs"])
    outputs = list(setup_result["outputs"])
    if not outputs:
        raise HarnessError("contract", f"{path}: setup() lists no outputs, so nothing can be checked")
    for name in outputs:
        if not isinstance(inputs.get(name), torch.Tensor):
            raise HarnessError("contract", f"{path}: output {name!r} is not a tensor among setup()'s inputs")
    spec, scalars, kept = [], {}, {}
    for name, v in inputs.items():
        if isinstance(v, torch.Tensor):
            role = "output" if name in outputs else "input"
            source = "drawn" if (role == "output" or v.dtype.is_floating_point) else "setup"
            spec.append({"name": name, "role": role, "shape": list(v.shape), "stride": list(v.stride()),
                         "dtype": str(v.dtype).replace("torch.", ""), "source": source})
            if source == "setup":
                kept[name] = v.detach().cpu().contiguous()
        else:
            scalars[name] = v
    return spec, scalars, kept


def check_spec(ref: Any, spec: list[dict[str, Any]], dims: dict[str, Any], ref_path: str) -> None:
    """In the reference's process: every buffer the reference's ``shapes(**dims)`` names must have that shape and
    dtype in the candidate's spec, so a Triton/Python ``setup()`` cannot shrink the problem it is judged (and
    timed) on. No ``shapes()``: nothing to check against. Raises HarnessError('contract')."""
    if not callable(getattr(ref, "shapes", None)):
        return
    try:
        want = dict(ref.shapes(**dims))
    except Exception as exc:
        raise HarnessError("contract", f"{ref_path}: shapes(**dims) raised {type(exc).__name__}: {exc}") from exc
    for s in spec:
        entry = want.get(s["name"])
        if entry is None:
            continue
        # (shape, dtype) or a bare shape, as _shape_table reads it; no dtype given: only the shape is checked
        pair = isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], (tuple, list))
        shape, dtype = (entry[0], entry[1]) if pair else (entry, None)
        try:
            shape = [int(d) for d in (shape if isinstance(shape, (list, tuple)) else (shape,))]
        except (TypeError, ValueError):
            raise HarnessError("contract", f"{ref_path}: shapes()[{s['name']!r}] = {entry!r} is not a shape or "
                               "(shape, dtype)") from None
        dtype = None if dtype is None else str(dtype).replace("torch.", "")
        if list(s["shape"]) != shape or (dtype is not None and dtype != s["dtype"]):
            raise HarnessError("contract", f"the candidate's buffer {s['name']!r} is {s['dtype']}{list(s['shape'])} "
                               f"but {ref_path}'s shapes() says {dtype or s['dtype']}{shape} for these dims: "
                               "setup() must build the problem the dims describe")


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


class Candidate:
    """The candidate side: loads the kernel, builds the harness-owned :class:`Inputs`, calls the kernel."""

    def __init__(self, req: dict[str, Any]) -> None:
        import torch

        self.torch = torch
        self.req = req
        self.device = req["device"]
        self.dims = req["dims"]
        self.ref = load_module(req["ref"], "kopt_reference")
        self.kept: dict[str, Any] = {}
        seed = int(req["seed"])
        made: dict[str, Any] = {}
        if callable(getattr(self.ref, "make_inputs", None)):
            try:
                made = dict(self.ref.make_inputs(seed=seed, **self.dims))
            except Exception as exc:
                raise HarnessError("contract", f"{req['ref']}: make_inputs() raised {type(exc).__name__}: {exc}") from exc
        if req["kind"] == "cuda":
            self.kernel: Any = CudaKernel(req["library"], req["params"], self.dims)
            spec = spec_from_params(self.ref, req["ref"], req["params"], self.dims, made)
            scalars: dict[str, Any] = {}
        else:
            self.kernel = load_module(req["kernel"], "kopt_candidate")
            import inspect
            kwargs = dict(self.dims)
            kwargs["seed"] = seed
            sig = inspect.signature(self.kernel.setup)
            if "device" in sig.parameters or any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
                kwargs["device"] = self.device
            try:
                result = self.kernel.setup(**kwargs)
            except Exception as exc:
                raise HarnessError("contract", f"{req['kernel']}: setup() raised {type(exc).__name__}: {exc}") from exc
            spec, scalars, self.kept = spec_from_setup(torch, result, req["kernel"])
            for s in spec:
                if s["name"] in made:
                    s["source"] = "make_inputs"
            for name, t in result["inputs"].items():
                if isinstance(t, torch.Tensor) and t.device.type != torch.device(self.device).type:
                    raise HarnessError("contract", f"{req['kernel']}: setup() put {name!r} on {t.device}, expected "
                                       f"{self.device}; add a `device` parameter to setup() and create tensors on it")
        self.inputs = Inputs(torch, spec, scalars, self.device)
        self.inputs.fill(req["plan"], seed, self.ref, self.dims, self.kept)

    def launch(self) -> None:
        """Call the candidate once without waiting."""
        if self.req["kind"] == "cuda":
            self.kernel(self.inputs.tensors)
        else:
            self.kernel.run_kernel(**self.inputs.kwargs())

    def run(self) -> None:
        """Call the candidate once and wait; raises HarnessError('runtime') on a CUDA error."""
        self.launch()
        if self.req["kind"] == "cuda":
            self.kernel.check()
        elif self.device == "cuda":
            self.torch.cuda.synchronize()


def _to_numpy(torch: Any, t: Any) -> Any:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()  # exact: every bf16 value is a float32 value
    return t.cpu().numpy().copy()  # on the CPU .numpy() shares memory with the (reused) buffer


def _guards(torch: Any, inp: Inputs, ptrs: dict[str, int], pristine: dict[str, Any]) -> dict[str, list[str]]:
    """After a call: buffers replaced or no longer plain tensors, and inputs the call modified."""
    found: dict[str, list[str]] = {"not_a_tensor": [], "buffer_replaced": [], "input_mutated": []}
    for s in inp.spec:
        t = inp.tensors[s["name"]]
        if type(t) is not torch.Tensor:
            found["not_a_tensor"].append(f"{s['name']} is {type(t).__module__}.{type(t).__qualname__}")
        elif t.data_ptr() != ptrs[s["name"]] or list(t.shape) != s["shape"]:
            found["buffer_replaced"].append(s["name"])
        elif s["role"] == "input" and not torch.equal(t, pristine[s["name"]]):
            n = int((t != pristine[s["name"]]).sum())
            found["input_mutated"].append(f"{s['name']} ({n} elements changed)")
    return found


def mode_candidate(req: dict[str, Any]) -> dict[str, Any]:
    """Correctness, candidate side. Inputs set A: call 1 and call 2 (fresh poisoned outputs each); set B (new values
    written into the same input buffers, so a result cached by pointer shows): call 3; set B again in new buffers:
    call 4. Saves ``cand1__``, ``cand2__``, ``candB__``, ``candC__`` arrays and the spec for the reference
    process."""
    import numpy as np

    cand = Candidate(req)
    torch, inp = cand.torch, cand.inputs
    ptrs = {n: t.data_ptr() for n, t in inp.tensors.items()}
    pristine = {s["name"]: inp.tensors[s["name"]].clone() for s in inp.spec if s["role"] == "input"}
    arrays: dict[str, Any] = {}
    t0 = time.perf_counter()
    cand.run()
    first_ms = (time.perf_counter() - t0) * 1e3
    guards = _guards(torch, inp, ptrs, pristine)
    if any(guards.values()):
        return {"spec": inp.spec, "guards": guards, "outputs": inp.outputs}
    for name in inp.outputs:
        arrays[f"cand1__{name}"] = _to_numpy(torch, inp.tensors[name])
    if req.get("calls", 3) >= 2:
        inp.poison_outputs()
        cand.run()
        for name in inp.outputs:
            arrays[f"cand2__{name}"] = _to_numpy(torch, inp.tensors[name])
        inp.fill(req["plan"], int(req["seed_b"]), cand.ref, cand.dims, cand.kept)
        cand.run()
        for name in inp.outputs:
            arrays[f"candB__{name}"] = _to_numpy(torch, inp.tensors[name])
        # set B's values again, in freshly allocated buffers: tells "cached by address" from "ignores its inputs"
        cand.inputs = Inputs(torch, inp.spec, inp.scalars, cand.device)
        cand.inputs.fill(req["plan"], int(req["seed_b"]), cand.ref, cand.dims, cand.kept)
        cand.run()
        for name in inp.outputs:
            arrays[f"candC__{name}"] = _to_numpy(torch, cand.inputs.tensors[name])
        cand.inputs = inp
    import hashlib
    setup_sha = hashlib.sha256()
    for name, t in sorted(cand.kept.items()):
        arrays[f"setup__{name}"] = t.numpy()
        setup_sha.update(name.encode() + t.numpy().tobytes())
    t_save = time.perf_counter()
    np.savez(req["out"] + ".npz", **arrays)
    save_s = time.perf_counter() - t_save
    return {"save_s": save_s, "spec": inp.spec, "setup_sha": setup_sha.hexdigest(), "scalars": {k: v for k, v in inp.scalars.items() if isinstance(v, (int, float, str))},
            "guards": guards, "outputs": inp.outputs, "first_call_ms": first_ms, "npz": req["out"] + ".npz"}


def mode_reference(req: dict[str, Any]) -> dict[str, Any]:
    """Correctness, reference side, in its own process (the candidate can neither see nor patch it): the same
    inputs as the candidate (same spec, plan, seeds), ``reference(**kwargs)`` on set A and set B, and on set A with
    float inputs rounded to bf16 and fp16 (for the tolerance sanity check). Saves ``ref__``, ``refB__``,
    ``low_bf16__``, ``low_fp16__`` arrays."""
    import numpy as np
    import torch

    ref = load_module(req["ref"], "kopt_reference")
    if not callable(getattr(ref, "reference", None)):
        raise HarnessError("contract", f"{req['ref']}: reference is not a function")
    device, dims = req["device"], req["dims"]
    check_spec(ref, req["spec"], dims, req["ref"])
    given = {}
    if req.get("setup_npz"):
        with np.load(req["setup_npz"]) as data:
            given = {k.removeprefix("setup__"): torch.from_numpy(data[k]).to(device)
                     for k in data.files if k.startswith("setup__")}
    inp = Inputs(torch, req["spec"], {**dims, **req.get("scalars", {})}, device)
    arrays: dict[str, Any] = {}

    def call(tag: str) -> None:
        try:
            ref.reference(**inp.kwargs())
        except Exception as exc:
            raise HarnessError("contract", f"{req['ref']}: reference() raised {type(exc).__name__}: {exc}") from exc
        if device == "cuda":
            torch.cuda.synchronize()
        for name in inp.outputs:
            t = inp.tensors[name]
            if t.numel() == 0:
                raise HarnessError("contract", f"output {name!r} has no elements, so nothing can be compared; "
                                   "check --kopt-dims (a zero dim?)")
            poison = torch.empty_like(t)
            _poison(torch, poison)
            unwritten = bool(torch.isnan(t).all()) if t.dtype.is_floating_point else bool(torch.equal(t, poison))
            if unwritten:
                raise HarnessError("contract", f"{req['ref']}: reference() left output {name!r} unwritten (still "
                                   "the poison value); write outputs in place, e.g. C.copy_(A @ B), not C = A @ B")
            arrays[f"{tag}__{name}"] = _to_numpy(torch, t)

    inp.fill(req["plan"], int(req["seed"]), ref, dims, given)
    before = {s["name"]: inp.tensors[s["name"]].clone() for s in inp.spec if s["role"] == "input"}
    call("ref")
    # an "input" the reference writes is an output the candidate's setup() did not list (so it was never compared)
    written = [n for n, t in before.items() if not torch.equal(t, inp.tensors[n])]
    if written:
        raise HarnessError("contract", f"reference() wrote {', '.join(map(repr, written))}, which the candidate "
                           "lists as input(s): every buffer the reference writes must be among setup()'s outputs")
    low = [s for s in inp.spec if s["role"] == "input" and s["dtype"] in ("float32", "float64")]
    if low and req.get("low_precision", True):
        pristine = {s["name"]: inp.tensors[s["name"]].clone() for s in low}
        for dtype in ("bfloat16", "float16"):
            changed = False
            for s in low:
                t = inp.tensors[s["name"]]
                t.copy_(pristine[s["name"]].to(getattr(torch, dtype)).to(t.dtype))
                changed = changed or not torch.equal(t, pristine[s["name"]])
            if not changed:
                continue  # e.g. small integers: exact in this precision, so the check says nothing
            inp.poison_outputs()
            call(f"low_{'bf16' if dtype == 'bfloat16' else 'fp16'}")
    inp.fill(req["plan"], int(req["seed_b"]), ref, dims, given)
    call("refB")
    npz_sha = _save_npz(req["out"] + ".npz", arrays)
    tol = {}
    for name in inp.outputs:
        tol[name] = tolerances(ref, name, req.get("atol"), req.get("rtol"))
    return {"npz": req["out"] + ".npz", "npz_sha": npz_sha, "tolerances": tol}


def tolerances(ref: Any, name: str, atol_cli: float | None, rtol_cli: float | None) -> dict[str, Any]:
    """(atol, rtol) of output ``name``: the command line, else the reference's (a number, or a dict keyed by output
    name), else 1e-3 / 1e-3 (upstream's defaults); with where each came from."""
    out: dict[str, Any] = {}
    for key, cli, default in (("atol", atol_cli, DEFAULT_ATOL), ("rtol", rtol_cli, DEFAULT_RTOL)):
        if cli is not None:
            out[key], out[f"{key}_source"] = float(cli), f"--kopt-{key}"
            continue
        v = getattr(ref, key, None)
        if isinstance(v, dict):
            v = v.get(name)
        if v is None:
            out[key], out[f"{key}_source"] = default, "default"
        else:
            out[key], out[f"{key}_source"] = float(v), f"ref.{key}"
    return out


def _device_uuid(torch: Any) -> str | None:
    """The UUID of the GPU this process runs on, ``GPU-xxxxxxxx-...`` as nvidia-smi prints it; None when this torch
    does not report it."""
    uuid = getattr(torch.cuda.get_device_properties(0), "uuid", None)
    return None if uuid is None else "GPU-" + str(uuid).removeprefix("GPU-")


class Clocks:
    """NVML (nvidia-ml-py) readings of the GPU: SM clock (MHz), temperature (C) and throttle reasons; inert when
    NVML is missing. ``throttled`` follows nvbench: a power/thermal slowdown reason, or an SM clock under 75% of
    the maximum."""

    # nvmlClocksThrottleReason* bits that mean the clock was pulled down (SW power cap, HW slowdown, SW/HW thermal,
    # HW power brake); idle, application clocks and sync boost are not slowdowns.
    SLOWDOWN = 0x4 | 0x8 | 0x20 | 0x40 | 0x80

    def __init__(self) -> None:
        self.nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            # NVML ignores CUDA_VISIBLE_DEVICES: find the GPU this process uses by the UUID or index it names
            first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
            if first.upper().startswith("GPU-"):
                self.handle = pynvml.nvmlDeviceGetHandleByUUID(first)
            else:
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(int(first) if first.isdigit() else 0)
            self.max_sm = pynvml.nvmlDeviceGetMaxClockInfo(self.handle, pynvml.NVML_CLOCK_SM)
            self.nvml = pynvml
        except Exception:  # no NVML: readings are reported as unavailable
            self.nvml = None

    def read(self) -> dict[str, Any] | None:
        """One reading, or None without NVML."""
        if self.nvml is None:
            return None
        n = self.nvml
        try:
            sm = n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM)
            temp = n.nvmlDeviceGetTemperature(self.handle, n.NVML_TEMPERATURE_GPU)
            reasons = n.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle)
        except Exception:
            return None
        return {"sm_mhz": sm, "temp_c": temp, "reasons": int(reasons),
                "throttled": bool(reasons & self.SLOWDOWN) or sm < 0.75 * self.max_sm}


_LIBCUDA: list[Any] = []


def _reset_persisting_l2() -> None:
    """cuCtxResetPersistingL2Cache: lines a kernel pinned with an access-policy window survive a normal flush.
    It waits for the device, so it must run before the flush is queued, never between flush and timed launch."""
    try:
        if not _LIBCUDA:
            _LIBCUDA.append(ctypes.CDLL("libcuda.so.1"))
        _LIBCUDA[0].cuCtxResetPersistingL2Cache()
    except (OSError, AttributeError):
        pass


class StreamGate:
    """Holds the current stream on a host-written flag (driver ``cuStreamWaitValue32``, nvbench's blocking-kernel
    idea without a spin): :meth:`close` enqueues a wait for flag >= 1, the host queues the timed work, :meth:`open`
    writes the flag. Used by the queued graph mode, where the host may need longer to queue N pairs than any fixed
    spin. ``create`` returns None where stream memory operations are unavailable (the caller then spins)."""

    def __init__(self, torch: Any, fn: Any, flag: Any) -> None:
        self.torch, self.fn, self.flag = torch, fn, flag

    @staticmethod
    def create(torch: Any) -> "StreamGate | None":
        try:
            lib = _LIBCUDA[0] if _LIBCUDA else ctypes.CDLL("libcuda.so.1")
            fn = getattr(lib, "cuStreamWaitValue32_v2", None) or lib.cuStreamWaitValue32
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            fn.restype = ctypes.c_int
            flag = torch.zeros(1, dtype=torch.int32, pin_memory=True)  # mapped into the device's address space
        except (OSError, AttributeError, RuntimeError):
            return None
        return StreamGate(torch, fn, flag)

    def close(self) -> bool:
        """Enqueue the wait on the current stream (flag reset to 0 first); False when the driver refused it."""
        try:
            self.flag[0] = 0
            stream = self.torch.cuda.current_stream().cuda_stream
            return self.fn(ctypes.c_void_p(stream), self.flag.data_ptr(), 1, 0) == 0  # CU_STREAM_WAIT_VALUE_GEQ
        except (ctypes.ArgumentError, RuntimeError, OSError):
            return False

    def open(self) -> None:
        self.flag[0] = 1


class Timer:
    """The timing loop shared by kernel and reference timing, resumable so two parties can be timed in alternating
    rounds (:meth:`take`). Created once per party: allocates the L2 flush buffer, warms up, calibrates the stream
    hold.

    Events method (``t["method"] == "events"``), per sample, outside the timed window: refresh the next rotating
    set's values (once every set has been used), read NVML, reset persisting L2 lines, flush L2 (read 2x its size),
    then hold the stream with a GPU spin longer than the host's launch time (90th percentile of the warmup launches,
    x2 + 20 µs) so launch latency stays out of the window. Timed: CUDA events around one ``launch(set)``.

    Graph method (``"graph"``, for kernels of a few µs, where one event pair's resolution and the launch gap
    dominate): ``t["graph_calls"]`` (N) pairs of (L2 flush, launch on the next set) captured in one CUDA graph and
    the N flushes alone in another; one sample = (replay time of the pairs - replay time of the flushes) / N, the two
    replays timed back to back. A launch CUDA cannot capture (a ``.cu`` ``solve()`` launches on the legacy default
    stream) falls back to the same N pairs queued behind a hold on a host-written flag (:class:`StreamGate`; a GPU
    spin where the driver refuses it; ``graph_method`` and ``graph_hold`` say which ran). Values of
    the rotating sets are refreshed between samples, outside the window. All times in ms."""

    def __init__(self, torch: Any, sets: list[Any], launch: Any, refresh: Any, t: dict[str, Any]) -> None:
        self.torch, self.sets, self.launch, self.refresh, self.t = torch, sets, launch, refresh, t
        self.method = t.get("method", "events")
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
        # flush by *reading* 2x L2: a write-based flush leaves dirty lines whose write-back then runs in the kernel
        self.flush_buf = torch.ones(2 * self.l2 // 4, dtype=torch.float32, device="cuda")
        self.flush_out = torch.empty((), dtype=torch.float32, device="cuda")
        self.clocks = Clocks()
        t_end = time.perf_counter() + t["warmup_ms"] / 1e3
        i = 0
        launch_s: list[float] = []
        while i < 3 or time.perf_counter() < t_end:
            h = time.perf_counter()
            launch(sets[i % len(sets)])
            launch_s.append(time.perf_counter() - h)
            torch.cuda.synchronize()
            i += 1
        self.warmup_calls = i
        tail = launch_s[1:] or launch_s
        self.host_launch_us = 1e6 * sorted(tail)[int(0.9 * (len(tail) - 1))]
        self.host_launch_ms = statistics.median(tail) * 1e3
        self.clock_khz = int(getattr(props, "clock_rate", 0) or 1_980_000)
        self.hold_us = 2 * self.host_launch_us + 20
        # host-clock overhead of an (almost) empty launch + sync, to judge the host-vs-event gap against
        tiny = torch.empty(1, device="cuda")
        over = []
        for _ in range(20):
            h0 = time.perf_counter()
            tiny.zero_()
            torch.cuda.synchronize()
            over.append((time.perf_counter() - h0) * 1e3)
        self.host_overhead_ms = statistics.median(over)
        self.start, self.stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.event_ms: list[float] = []
        self.throttled: list[bool] = []
        self.readings: list[dict[str, Any]] = []
        self.elapsed_s = 0.0
        self.k = 0
        self.graph_method: str | None = None
        self.graph_note: str | None = None
        self._gate: StreamGate | None = None
        self.graph_hold: str | None = None
        #: what a non-final round reports besides the samples (the candidate's input spec, for the reference)
        self.info: dict[str, Any] = {}
        if self.method == "graph":
            self._prepare_graphs(t.get("capture", True))

    def _flush(self) -> None:
        self.torch.sum(self.flush_buf, dim=0, out=self.flush_out)

    def _hold(self, us: float) -> None:
        self.torch.cuda._sleep(int(us * self.clock_khz / 1e3))

    def _pairs(self, with_kernel: bool) -> None:
        for j in range(int(self.t.get("graph_calls", 20))):
            self._flush()
            if with_kernel:
                self.launch(self.sets[j % len(self.sets)])

    def _prepare_graphs(self, capture: bool) -> None:
        torch = self.torch
        n = int(self.t.get("graph_calls", 20))
        try:
            if not capture:
                raise RuntimeError("a .cu solve() launches on the legacy default stream, which a capture does not "
                                   "record")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # torch's rule: warm up on a side stream before capture
                self._pairs(True)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            self.g_pairs, self.g_flush = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.g_pairs):
                self._pairs(True)
            with torch.cuda.graph(self.g_flush):
                self._pairs(False)
            torch.cuda.synchronize()
            self.graph_method = "cuda_graph"
        except Exception as exc:  # e.g. cudaErrorStreamCaptureImplicit: a launch on the legacy default stream
            torch.cuda.synchronize()
            self.graph_method = "queued"
            self.graph_note = f"no CUDA graph ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); " \
                              f"the {n} pairs are queued behind a stream hold instead"
            h = time.perf_counter()
            self._pairs(True)
            self.queue_us = (time.perf_counter() - h) * 1e6
            torch.cuda.synchronize()
            self._gate = StreamGate.create(torch)

    def _timed_block(self, with_kernel: bool) -> float:
        torch = self.torch
        torch.cuda.synchronize()
        if self.graph_method == "cuda_graph":
            graph = self.g_pairs if with_kernel else self.g_flush
            self._hold(self.hold_us)
            self.start.record()
            graph.replay()
        else:
            gate = self._gate
            if gate is not None and gate.close():
                self.graph_hold = "stream_wait_value"
                try:  # held until every pair is queued, however slow the host is
                    self.start.record()
                    self._pairs(with_kernel)
                    self.stop.record()
                finally:
                    gate.open()
                torch.cuda.synchronize()
                return self.start.elapsed_time(self.stop)
            self.graph_hold = "spin"
            self._hold(4 * self.queue_us + 100)
            self.start.record()
            self._pairs(with_kernel)
        self.stop.record()
        torch.cuda.synchronize()
        return self.start.elapsed_time(self.stop)

    def _sample(self) -> float:
        torch = self.torch
        if self.method == "graph":
            n = int(self.t.get("graph_calls", 20))
            if self.k % 2:  # alternate which block goes first, so a drift between them cancels
                flush_only = self._timed_block(False)
                pairs = self._timed_block(True)
            else:
                pairs = self._timed_block(True)
                flush_only = self._timed_block(False)
            return (pairs - flush_only) / n
        s = self.sets[self.k % len(self.sets)]
        _reset_persisting_l2()
        torch.cuda.synchronize()
        # the flush stays queued ahead of the timed launch, so the GPU is busy while the host launches (a host
        # round trip between them would put launch latency, tens of µs for a Python launcher, inside the window)
        self._flush()
        self._hold(self.hold_us)
        self.start.record()
        self.launch(s)
        self.stop.record()
        torch.cuda.synchronize()
        return self.start.elapsed_time(self.stop)

    def take(self, count: int | None = None) -> str | None:
        """Take ``count`` samples, or (None) sample until :func:`pytest_kopt.stats.should_stop`; returns the stop
        reason (None after a fixed count that did not meet it)."""
        from pytest_kopt.stats import should_stop

        t = self.t
        taken = 0
        if count == 0:
            return should_stop(self.event_ms, self.elapsed_s, target_rse=t["target_rse"], min_samples=t["min_samples"],
                               min_time_s=t["min_time_s"], budget_s=t["budget_s"], max_samples=t["max_samples"])
        while True:
            t0 = time.perf_counter()
            if self.method == "graph" and self.k > 0:  # the graphs read fixed addresses: new values in place
                for j, s in enumerate(self.sets):
                    self.refresh(s, self.k * len(self.sets) + j)
            elif self.method != "graph" and self.k >= len(self.sets):
                self.refresh(self.sets[self.k % len(self.sets)], self.k)
            before = self.clocks.read()
            self.event_ms.append(self._sample())
            after = self.clocks.read()
            if before and after:
                self.throttled.append(before["throttled"] or after["throttled"])
                if self.k % 16 == 0:
                    self.readings.append(after)
            self.k += 1
            taken += 1
            self.elapsed_s += time.perf_counter() - t0
            reason = should_stop(self.event_ms, self.elapsed_s, target_rse=t["target_rse"],
                                 min_samples=t["min_samples"], min_time_s=t["min_time_s"], budget_s=t["budget_s"],
                                 max_samples=t["max_samples"])
            if reason is not None and count is None:
                return reason
            if count is not None and taken >= count:
                return reason

    def result(self, reason: str | None) -> dict[str, Any]:
        """The side-stream probe, then every figure: per-sample lists (ms) and the stop reason.

        Probe: without the stream hold, launch and synchronise the whole device 30 times; work the events did not
        see (another stream, a background thread) lengthens these host-clock times beyond launch + event + sync."""
        torch = self.torch
        host_ms: list[float] = []
        for j in range(30):
            s = self.sets[j % len(self.sets)]
            torch.cuda.synchronize()
            h0 = time.perf_counter()
            self.launch(s)
            torch.cuda.synchronize()
            host_ms.append((time.perf_counter() - h0) * 1e3)
        out = {"event_ms": self.event_ms, "host_ms": host_ms, "host_overhead_ms": self.host_overhead_ms,
               "host_launch_ms": self.host_launch_ms, "throttled": self.throttled or None,
               "nvml": self.readings or None, "stop_reason": reason, "rotating_sets": len(self.sets),
               "l2_bytes": self.l2, "flush_bytes": 2 * self.l2, "warmup_calls": self.warmup_calls,
               "host_launch_us": self.host_launch_us, "hold_us": self.hold_us, "method": self.method}
        if self.method == "graph":
            out.update(graph_method=self.graph_method, graph_calls=int(self.t.get("graph_calls", 20)),
                       graph_note=self.graph_note, graph_hold=self.graph_hold)
        return out


def measure(torch: Any, sets: list[Any], launch: Any, refresh: Any, t: dict[str, Any]) -> dict[str, Any]:
    """Time ``launch`` over the rotating ``sets`` until the stopping rule says so (see :class:`Timer`); returns
    per-sample lists (ms), the stop reason and the method's figures."""
    timer = Timer(torch, sets, launch, refresh, t)
    return timer.result(timer.take())


def _rotating_sets(torch: Any, first: Inputs, plan: dict[str, Any], seed: int, ref: Any, dims: dict[str, Any],
                   kept: dict[str, Any], t: dict[str, Any]) -> list[Inputs]:
    """``first`` plus up to ``max_sets - 1`` more input sets (different values, different addresses), as many as
    fit in ``mem_fraction`` of the free device memory."""
    set_bytes = sum(x.numel() * x.element_size() for x in first.tensors.values()) or 1
    free = torch.cuda.mem_get_info()[0]
    count = max(1, min(int(t["max_sets"]), int(free * t["mem_fraction"] // set_bytes)))
    sets = [first]
    for j in range(1, count):
        extra = Inputs(torch, first.spec, first.scalars, first.device)
        extra.fill(plan, seed + 7919 * j, ref, dims, kept)
        sets.append(extra)
    return sets


#: Timers of parties timed in alternating rounds, kept in a warm harness process between requests (round key ->
#: (Timer, finish function)).
_ROUNDS: dict[str, tuple[Timer, Any]] = {}


def _timed(req: dict[str, Any], prepare: Any) -> dict[str, Any]:
    """Run a timing request: all at once, or (``req["round"]`` = {key, count, final}) one round of an interleaved
    measurement, its Timer kept between rounds in this process. ``prepare()`` returns (Timer, finish), where
    ``finish(result)`` adds the mode's own figures to the Timer's result. A non-final round returns the samples
    taken so far and the stop reason."""
    rnd = req.get("round")
    if rnd is None:
        timer, finish = prepare()
        return finish(timer.result(timer.take()))
    if rnd["key"] not in _ROUNDS:
        _ROUNDS.clear()  # one interleaved measurement at a time: drop what an aborted one left
        _ROUNDS[rnd["key"]] = prepare()
    timer, finish = _ROUNDS[rnd["key"]]
    reason = timer.take(int(rnd["count"]))
    if not rnd.get("final"):
        return {"event_ms": list(timer.event_ms), "stop_reason": reason, "round": True,
                "sample_wall_s": timer.elapsed_s / max(1, len(timer.event_ms)), **timer.info}
    del _ROUNDS[rnd["key"]]
    return finish(timer.result(reason or "rounds"))


def mode_timing(req: dict[str, Any]) -> dict[str, Any]:
    """Time the candidate (see :class:`Timer`) over rotating input sets. Saves the last timed call's inputs and
    outputs to ``<out>.npz`` so the parent can check them against the reference in another process."""
    import numpy as np

    def prepare() -> tuple[Timer, Any]:
        cand = Candidate(req)
        torch = cand.torch
        if cand.device != "cuda":
            raise HarnessError("runtime", "timing needs a CUDA device")
        cand.run()  # module load / JIT outside the measurement; checks the launch once
        t = req["timing"]
        sets = _rotating_sets(torch, cand.inputs, req["plan"], int(req["seed"]), cand.ref, cand.dims, cand.kept, t)

        def launch(s: Inputs) -> None:
            cand.inputs = s
            cand.launch()

        def refresh(s: Inputs, k: int) -> None:
            s.fill(req["plan"], int(req["seed"]) + 104729 * (k + 1), cand.ref, cand.dims, cand.kept)

        holder: dict[str, Timer] = {}

        def finish(result: dict[str, Any]) -> dict[str, Any]:
            last = sets[(len(result["event_ms"]) - 1) % len(sets)]
            cand.inputs = last
            if getattr(holder.get("timer"), "graph_method", None) == "cuda_graph":
                # what was timed is the graph: poison the outputs, replay it and check *its* results (a kernel that
                # skips its work while a capture is under way leaves them NaN)
                last.poison_outputs()
                holder["timer"].g_pairs.replay()
                torch.cuda.synchronize()
            else:
                cand.run()  # surfaces an error raised by any timed launch (sticky CUDA errors)
            arrays = {f"in__{s['name']}": _to_numpy(torch, last.tensors[s["name"]])
                      for s in last.spec if s["role"] == "input"}
            # the check call above rewrote the outputs from the same inputs; a stale timed output shows up too
            arrays.update({f"cand1__{n}": _to_numpy(torch, last.tensors[n]) for n in last.outputs})
            np.savez(req["out"] + ".npz", **arrays)
            workload = None
            if callable(getattr(cand.ref, "workload_model", None)):
                try:
                    workload = {k: float(v) for k, v in dict(cand.ref.workload_model(**cand.dims)).items()}
                except Exception as exc:
                    raise HarnessError("contract", f"{req['ref']}: workload_model(**dims) raised "
                                       f"{type(exc).__name__}: {exc}") from exc
            return {**result, "workload": workload, "spec": cand.inputs.spec, "npz": req["out"] + ".npz",
                    "scalars": {k: v for k, v in cand.inputs.scalars.items() if isinstance(v, (int, float, str))},
                    "gpu": torch.cuda.get_device_name(0), "gpu_uuid": _device_uuid(torch)}

        timer = Timer(torch, sets, launch, refresh, t)
        holder["timer"] = timer
        timer.info = {"spec": cand.inputs.spec,
                      "scalars": {k: v for k, v in cand.inputs.scalars.items() if isinstance(v, (int, float, str))}}
        return timer, finish

    return _timed(req, prepare)


def mode_time_reference(req: dict[str, Any]) -> dict[str, Any]:
    """Time ``reference(**kwargs)`` in its own process the same way the candidate is timed (so a candidate cannot
    slow it down to inflate its speedup)."""
    import torch

    def prepare() -> tuple[Timer, Any]:
        ref = load_module(req["ref"], "kopt_reference")
        dims = req["dims"]
        check_spec(ref, req["spec"], dims, req["ref"])
        first = Inputs(torch, req["spec"], {**dims, **req.get("scalars", {})}, "cuda")
        first.fill(req["plan"], int(req["seed"]), ref, dims, {})
        t = req["timing"]
        sets = _rotating_sets(torch, first, req["plan"], int(req["seed"]), ref, dims, {}, t)

        def launch(s: Inputs) -> None:
            ref.reference(**s.kwargs())

        def refresh(s: Inputs, k: int) -> None:
            s.fill(req["plan"], int(req["seed"]) + 104729 * (k + 1), ref, dims, {})

        return Timer(torch, sets, launch, refresh, t), lambda result: result

    return _timed(req, prepare)


def mode_check_outputs(req: dict[str, Any]) -> dict[str, Any]:
    """Reference side of the timing gate's output check: the reference on the inputs saved from a timed call."""
    import numpy as np
    import torch

    ref = load_module(req["ref"], "kopt_reference")
    dims = req["dims"]
    check_spec(ref, req["spec"], dims, req["ref"])
    inp = Inputs(torch, req["spec"], {**dims, **req.get("scalars", {})}, req["device"])
    with np.load(req["inputs_npz"]) as data:
        for s in inp.spec:
            if s["role"] == "input":
                inp.tensors[s["name"]].copy_(torch.from_numpy(data[f"in__{s['name']}"]).to(inp.tensors[s["name"]].dtype))
    inp.poison_outputs()
    ref.reference(**inp.kwargs())
    torch.cuda.synchronize()
    npz_sha = _save_npz(req["out"] + ".npz", {f"ref__{n}": _to_numpy(torch, inp.tensors[n]) for n in inp.outputs})
    return {"npz": req["out"] + ".npz", "npz_sha": npz_sha, "tolerances": {n: tolerances(ref, n, req.get("atol"), req.get("rtol"))
                                                       for n in inp.outputs}}


def mode_peaks(req: dict[str, Any]) -> dict[str, Any]:
    """Measured ceilings of this GPU: device-to-device copy bandwidth (bytes read + written per s, 1 GiB copy) and
    dense matmul rates (bf16 8192^3 and fp32 without TF32, 4096^3), each the median of 10 event-timed runs."""
    import statistics

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False

    def med(fn: Any, reps: int = 10) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        out = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b) / 1e3)
        return statistics.median(out)

    n = 2**28  # 1 GiB of fp32
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    copy_s = med(lambda: dst.copy_(src))
    src = dst = None  # free the 2 GiB before the matmuls
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    bf16_s = med(lambda: x @ x)
    y = torch.randn(4096, 4096, device="cuda")
    fp32_s = med(lambda: y @ y)
    return {"dram_bytes_per_s": 2 * 4 * n / copy_s, "bf16_flops": 2 * 8192**3 / bf16_s,
            "fp32_flops": 2 * 4096**3 / fp32_s, "gpu": torch.cuda.get_device_name(0),
            "method": "torch copy 1 GiB (read+write), bf16 8192^3 and fp32 (no TF32) 4096^3 matmul, median of 10"}


def mode_profile(req: dict[str, Any]) -> dict[str, Any]:
    """Under ncu: warm up, then one candidate call inside the NVTX range ``kopt_target`` (the only one profiled)."""
    cand = Candidate(req)
    torch = cand.torch
    cand.run()
    torch.cuda.nvtx.range_push("kopt_target")
    cand.launch()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    cand.run()
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
        Candidate(req).run()
        return {"mode": "jit"}
    captured: list[tuple[Any, tuple, dict]] = []
    original = JITFunction.run

    def capture(self: Any, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> None:
        captured.append((self, args, kwargs))

    JITFunction.run = capture  # type: ignore[method-assign]
    try:
        Candidate(req).launch()
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


def _save_npz(path: str, arrays: dict[str, Any]) -> str:
    """Save ``arrays`` as an uncompressed ``.npz`` built in memory and return its SHA-256: the hash of the bytes
    this process produced, not of a file another process (a candidate's escaped daemon, another xdist worker's
    kernel) could rewrite between the write and a re-read. The reference's modes put it in their result, whose
    own hash goes back on the private control pipe."""
    import io

    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getbuffer()
    with open(path, "wb") as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()


MODES = {"candidate": mode_candidate, "reference": mode_reference, "timing": mode_timing,
         "time_reference": mode_time_reference, "check_outputs": mode_check_outputs, "peaks": mode_peaks, "profile": mode_profile,
         "triton_build": mode_triton_build}


def handle(req_path: str) -> tuple[int, str]:
    """Run one request file's mode and write ``<out>.json``. Returns (0 on success or 1 on error, SHA-256 of the
    JSON bytes written): the attestation the process sends on its private control pipe (the hash of any ``.npz``
    it saved is inside that JSON)."""
    req = json.loads(Path(req_path).read_text())
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
    data = json.dumps(result, default=_jsonable).encode()
    Path(req["out"] + ".json").write_bytes(data)
    sys.stdout.flush()
    sys.stderr.flush()
    return code, hashlib.sha256(data).hexdigest()


def serve(ctl_fd: int) -> int:
    """Warm-process loop (:class:`pytest_kopt.runner.HarnessServer`): import torch, say ``ready`` on the control
    pipe, then run each request path read from stdin and answer ``done <code>``. Ends at EOF, or after a failed
    request (the parent starts a fresh process: a CUDA error can leave this context unusable)."""
    import gc

    import numpy  # noqa: F401,I001  (imported once here, not per request)
    import torch

    ctl = os.fdopen(ctl_fd, "w", buffering=1)
    ctl.write("ready\n")
    stdin = sys.stdin  # kept: a kernel that rebinds or closes sys.stdin does not cut the request channel
    for line in stdin:
        if not line.strip():
            continue
        seq, _, path = line.strip().partition(" ")
        code, json_sha = handle(path)
        done = f"done {seq} {code} {json_sha}\n"
        if code:  # the context may be broken (a sticky CUDA error): report, touch nothing, end
            ctl.write(done)
            return code
        gc.collect()
        try:
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()  # the next request (timing's rotating sets) sizes itself from free memory
        except Exception:  # an error the request's own checks missed: its result stands, this process ends
            ctl.write(f"done {seq} 1 {json_sha}\n")  # code 1: the parent drops this process
            return 1
        ctl.write(done)
    return 0


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the process that started it ends (prctl PR_SET_PDEATHSIG), so a pytest
    killed by SIGTERM does not leave a kernel spinning on the GPU; and become the subreaper of its descendants.
    Elsewhere a no-op."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG = 1, SIGKILL = 9
        # PR_SET_CHILD_SUBREAPER = 36: orphans of the kernel's own children (a setsid() double fork) stay below
        # this process, where the parent finds, pauses and kills them, instead of escaping to init
        libc.prctl(36, 1)
        if os.getppid() == 1:  # the parent was already gone before the call
            os._exit(1)
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> int:
    """Entry point: ``REQUEST.json`` runs one request; ``--serve CTL_FD`` runs :func:`serve`."""
    if sys.platform.startswith("linux"):
        _die_with_parent()
    if len(argv) > 2 and argv[1] == "--serve":
        return serve(int(argv[2]))
    code, json_sha = handle(argv[1])
    if len(argv) > 3 and argv[2] == "--ctl":  # a fresh process: the same attestation, on its own private pipe
        with os.fdopen(int(argv[3]), "w") as ctl:
            ctl.write(f"done 0 {code} {json_sha}\n")
    # what the kernel started dies with this process (as its subreaper it holds even setsid() daemons, which at
    # its exit would go to init)
    from pytest_kopt.runner import kill_tree

    kill_tree(os.getpid(), include_root=False)
    return code


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


if __name__ == "__main__":
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sys.exit(main(sys.argv))
