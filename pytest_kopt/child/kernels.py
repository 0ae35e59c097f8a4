"""The candidate side of a harness process, by the request's ``launcher`` (its kernel kind's): ``solve``, a built
library's ``extern "C" solve`` through ctypes; ``module``, a Python file's ``setup``/``run_kernel`` (or a KernelBench
or GPU MODE candidate through :mod:`pytest_kopt.child.formats`); with the harness-owned inputs it is called on. With
``autotune`` in the request, the autotune policy is installed before the file is imported."""

from __future__ import annotations

import ctypes
import inspect
from typing import Any

from . import HarnessError
from .inputs import (Inputs, check_layout, def_line, returned_outputs, spec_from_params, spec_from_setup, taken,
                     signature)
from .formats import load_candidate, load_reference


def check_run_kernel(fn: Any, names: list[str], path: str) -> None:
    """``run_kernel`` must take setup()'s inputs by name (``run_kernel(**inputs)``: its parameter names are the
    contract). Raises HarnessError('contract') naming, at ``path``'s ``def run_kernel`` line, the names setup()
    gives that it has no parameter for and the parameters it needs that setup() does not give."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: its call says itself
        return
    try:
        sig.bind(**dict.fromkeys(names))
        return
    except TypeError:
        pass
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = [p.name for p in sig.parameters.values() if p.kind in kinds]
    takes_any = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    unknown = [] if takes_any else [n for n in names if n not in params]
    missing = [p.name for p in sig.parameters.values() if p.default is p.empty and p.kind != p.VAR_KEYWORD
               and p.kind != p.VAR_POSITIONAL and (p.name not in names or p.kind == p.POSITIONAL_ONLY)]
    shown = ", ".join(p.name if p.kind != p.VAR_KEYWORD else "**" + p.name for p in sig.parameters.values())
    parts = []
    if unknown:
        parts.append(f"setup() gives {', '.join(unknown)}, which it has no parameter for")
    if missing:
        parts.append(f"it needs {', '.join(missing)}, which setup() does not give (or not by name)")
    raise HarnessError("contract", f"run_kernel({shown}) does not take setup()'s inputs ({', '.join(names)}) by name: "
                       + "; ".join(parts or ["the call run_kernel(**inputs) does not bind"]),
                       fix=f"name run_kernel()'s parameters after setup()'s inputs (def run_kernel({', '.join(names)})"
                           "), or take them as **inputs", path=path, line=def_line(path, "run_kernel"))


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


class Candidate:
    """The candidate side: loads the kernel, builds the harness-owned :class:`~pytest_kopt.child.inputs.Inputs`
    for the request's seed, calls the kernel."""

    def __init__(self, req: dict[str, Any]) -> None:
        import torch

        self.torch = torch
        self.req = req
        self.device = req["device"]
        self.dims = req["dims"]
        self.ref = load_reference(req["ref"], req.get("seed"), precision=req.get("precision"))
        self.kept: dict[str, Any] = {}
        seed = int(req["seed"])
        made: dict[str, Any] = {}
        if callable(getattr(self.ref, "make_inputs", None)):
            try:
                made = dict(self.ref.make_inputs(seed=seed, **taken(self.ref.make_inputs, self.dims)))
            except HarnessError:  # a field format's adapter words its own (a size of the wrong kind, no GPU)
                raise
            except Exception as exc:
                raise HarnessError("contract", f"{req['ref']}: make_inputs() raised {type(exc).__name__}: "
                                   f"{exc}") from exc
        inplace = list(req.get("inplace") or [])
        #: names of the outputs the kernel returns ([] for in place only; ["*"]: named by the return value)
        self.returned: list[str] = []
        self.solve = req["launcher"] == "solve"
        if self.solve:
            self.kernel: Any = CudaKernel(req["library"], req["params"], self.dims)
            spec = spec_from_params(self.ref, req["ref"], req["params"], self.dims, made, inplace)
            scalars: dict[str, Any] = {}
        else:
            if req.get("autotune") and req["mode"] != "triton_build":  # the compile gate tunes (or states) it
                from . import autotune

                pins = req.get("autotune_pin") or {}
                autotune.install("pin" if pins else ("first" if self.device == "cpu" else "tune"), pins)
            self.kernel = load_candidate(req["kernel"], self.ref)
            kwargs = taken(self.kernel.setup, dict(self.dims))
            kwargs["seed"] = seed
            sig = signature(self.kernel.setup, "setup", req["kernel"])
            if "device" in sig.parameters or any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
                kwargs["device"] = self.device
            try:
                result = self.kernel.setup(**kwargs)
            except HarnessError:
                raise
            except Exception as exc:
                raise HarnessError("contract", f"{req['kernel']}: setup() raised {type(exc).__name__}: "
                                   f"{exc}") from exc
            spec, scalars, self.kept, self.returned = spec_from_setup(torch, result, req["kernel"], inplace=inplace)
            check_run_kernel(self.kernel.run_kernel, list(result["inputs"]), req["kernel"])
            for s in spec:
                if s["name"] in made:
                    s["source"] = "make_inputs"
            for name, t in result["inputs"].items():
                if isinstance(t, torch.Tensor) and t.device.type != torch.device(self.device).type:
                    raise HarnessError("contract", f"{req['kernel']}: setup() put {name!r} on {t.device}, expected "
                                       f"{self.device}; add a `device` parameter to setup() and create tensors on it")
        check_layout(spec, req["ref"] if self.solve else req["kernel"])  # every shape, not the plan's only
        stray = [n for n in inplace if not any(b["name"] == n and b["role"] == "inout" for b in spec)]
        if stray:
            raise HarnessError("contract", f"{req['ref']}: inplace = {inplace!r} names {', '.join(map(repr, stray))}, "
                               "which is no output of the candidate's (its buffers: "
                               f"{', '.join(b['name'] + ' ' + b['role'] for b in spec)})",
                               fix="name in inplace the outputs that are also inputs: for a Triton/Python setup(), a "
                                   "name both among its inputs and in its \"outputs\"; for a .cu, a non-const "
                                   "pointer of solve()")
        self.inputs = Inputs(torch, spec, scalars, self.device)
        self.inputs.fill(req["plan"], seed, self.ref, self.dims, self.kept)

    def launch(self) -> Any:
        """Call the candidate once without waiting; returns what ``run_kernel`` returned (None for ``solve``)."""
        if self.solve:
            self.kernel(self.inputs.tensors)
            return None
        return self.kernel.run_kernel(**self.inputs.kwargs())

    def run(self) -> dict[str, Any]:
        """Call the candidate once and wait; returns its returned outputs by name
        (:func:`~pytest_kopt.child.inputs.returned_outputs`; {} when it writes in place). Raises
        HarnessError('runtime') on a CUDA error, HarnessError('contract') on a return value that does not fit
        ``setup()``'s outputs."""
        value = self.launch()
        if self.solve:
            self.kernel.check()
        elif self.device == "cuda":
            self.torch.cuda.synchronize()
        return returned_outputs(self.torch, value, self.returned, self.inputs, f"{self.req['kernel']}: run_kernel()")

    def results(self, got: dict[str, Any]) -> dict[str, Any]:
        """Every output of the last call by name: the in-place buffers and the returned tensors ``got``."""
        return {**{n: self.inputs.tensors[n] for n in self.inputs.outputs}, **got}
