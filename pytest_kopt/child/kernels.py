"""The candidate side of a harness process: a ``.cu`` ``solve`` through ctypes, or a Triton/Python file's
``setup``/``run_kernel``, with the harness-owned inputs it is called on."""

from __future__ import annotations

import ctypes
import inspect
from typing import Any

from . import HarnessError
from .inputs import Inputs, spec_from_params, spec_from_setup
from .loader import load_module


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
        self.ref = load_module(req["ref"], "kopt_reference")
        self.kept: dict[str, Any] = {}
        seed = int(req["seed"])
        made: dict[str, Any] = {}
        if callable(getattr(self.ref, "make_inputs", None)):
            try:
                made = dict(self.ref.make_inputs(seed=seed, **self.dims))
            except Exception as exc:
                raise HarnessError("contract", f"{req['ref']}: make_inputs() raised {type(exc).__name__}: "
                                   f"{exc}") from exc
        if req["kind"] == "cuda":
            self.kernel: Any = CudaKernel(req["library"], req["params"], self.dims)
            spec = spec_from_params(self.ref, req["ref"], req["params"], self.dims, made)
            scalars: dict[str, Any] = {}
        else:
            self.kernel = load_module(req["kernel"], "kopt_candidate")
            kwargs = dict(self.dims)
            kwargs["seed"] = seed
            sig = inspect.signature(self.kernel.setup)
            if "device" in sig.parameters or any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
                kwargs["device"] = self.device
            try:
                result = self.kernel.setup(**kwargs)
            except Exception as exc:
                raise HarnessError("contract", f"{req['kernel']}: setup() raised {type(exc).__name__}: "
                                   f"{exc}") from exc
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
