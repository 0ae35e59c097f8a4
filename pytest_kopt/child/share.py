"""Device arrays that cross from one harness process to another without a copy to the host: CUDA IPC handles of
dedicated allocations, through the driver API (``libcuda``, ctypes).

The exporting process (a candidate's) copies each array into an allocation of its own (``cuMemAlloc``, so the
handle covers exactly that array), keeps it until :func:`release`, and reports a descriptor: the handle, the byte
count, the dtype and the shape. The importing process (the judge, in the reference's process) maps the handle,
checks that the mapping is as large as the descriptor says, copies the bytes into its own memory and unmaps at
once. A descriptor is data, never code (no pickle): a process that forges one can make the import fail or hand
over other bytes, as it could write another ``.npz``, and nothing more.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

#: Bytes of a ``CUipcMemHandle`` (cuda.h: ``CU_IPC_HANDLE_SIZE``).
HANDLE_BYTES = 64
#: dtypes a descriptor may name (torch's names without ``torch.``), with their element sizes in bytes.
DTYPES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex64": 8, "complex128": 16,
          "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "uint16": 2, "uint32": 4,
          "uint64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1}


class ShareError(RuntimeError):
    """CUDA IPC is unavailable here, or a descriptor does not describe a mapping this process can read."""


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * HANDLE_BYTES)]


_LIB: list[Any] = []
#: Allocations this process exported and keeps until :func:`release` (device pointers).
_EXPORTED: list[int] = []


def _lib() -> Any:
    if not _LIB:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise ShareError(f"no CUDA driver library: {exc}") from exc
        _LIB.append(lib)
    return _LIB[0]


def _fn(name: str) -> Any:
    lib = _lib()
    for n in (f"{name}_v2", name):
        f = getattr(lib, n, None)
        if f is not None:
            f.restype = ctypes.c_int
            return f
    raise ShareError(f"the CUDA driver has no {name}")


def _check(code: int, what: str) -> None:
    if code:
        text = ctypes.c_char_p()
        _fn("cuGetErrorString")(code, ctypes.byref(text))
        raise ShareError(f"{what}: CUDA driver error {code} ({(text.value or b'?').decode()})")


def _view(torch: Any, ptr: int, nbytes: int) -> Any:
    """A uint8 tensor over ``nbytes`` of device memory at ``ptr``, not owning it (CUDA array interface)."""

    class _Mem:
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 2}

    return torch.as_tensor(_Mem(), device="cuda")


def export(torch: Any, t: Any) -> tuple[dict[str, Any], Any]:
    """Copy CUDA tensor ``t`` (any shape and layout, a dtype of :data:`DTYPES`) into an allocation of its own and
    return (its descriptor ``{"handle": hex, "nbytes", "dtype", "shape"}``, a tensor over that allocation with
    ``t``'s dtype and shape, valid until :func:`release`). Raises ShareError when the driver refuses (no IPC in
    this environment) or the dtype is not in :data:`DTYPES`."""
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype not in DTYPES:
        raise ShareError(f"dtype {dtype} cannot be shared")
    nbytes = t.numel() * DTYPES[dtype]
    desc: dict[str, Any] = {"handle": "", "nbytes": nbytes, "dtype": dtype, "shape": [int(d) for d in t.shape]}
    if nbytes == 0:
        return desc, t.detach().clone()
    torch.cuda.synchronize()
    ptr = ctypes.c_uint64()
    _check(_fn("cuMemAlloc")(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), "cuMemAlloc")
    _EXPORTED.append(ptr.value)
    raw = _view(torch, ptr.value, nbytes)
    raw.copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
    handle = _Handle()
    _check(_fn("cuIpcGetMemHandle")(ctypes.byref(handle), ctypes.c_uint64(ptr.value)), "cuIpcGetMemHandle")
    torch.cuda.synchronize()  # the copy is complete before the descriptor leaves this process
    desc["handle"] = ctypes.string_at(ctypes.addressof(handle), HANDLE_BYTES).hex()
    return desc, raw.view(t.dtype).reshape(t.shape)


def release() -> None:
    """Free every allocation this process exported (the importer has copied and unmapped them by then: the
    parent sends the next request only after the judge's answer)."""
    while _EXPORTED:
        ptr = _EXPORTED.pop()
        try:
            _fn("cuMemFree")(ctypes.c_uint64(ptr))
        except ShareError:
            pass


def check_descriptor(desc: Any) -> tuple[bytes, int, str, list[int]]:
    """(handle bytes, byte count, dtype, shape) of a descriptor from another process. Raises ShareError unless it
    has a 64-byte hex handle (or none, for an empty array), a known dtype, a shape of non-negative ints and the
    byte count that shape and dtype make."""
    if not isinstance(desc, dict) or not isinstance(desc.get("shape"), list):
        raise ShareError("a malformed array descriptor (not a mapping with a list shape)")
    try:
        handle = bytes.fromhex(desc["handle"])
        nbytes, dtype, shape = int(desc["nbytes"]), str(desc["dtype"]), [int(d) for d in desc["shape"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ShareError(f"a malformed array descriptor ({type(exc).__name__})") from None
    if dtype not in DTYPES or any(d < 0 for d in shape) or nbytes != math.prod(shape) * DTYPES[dtype]:
        raise ShareError(f"an array descriptor that does not add up: {dtype} {shape}, {nbytes} bytes")
    if len(handle) != (HANDLE_BYTES if nbytes else 0):
        raise ShareError(f"an IPC handle of {len(handle)} bytes")
    return handle, nbytes, dtype, shape


def import_copy(torch: Any, desc: Any) -> Any:
    """A tensor of this process's own holding the bytes a descriptor of another process describes (dtype and shape
    as described). Maps the handle, checks the mapping holds ``nbytes`` (``cuMemGetAddressRange``), copies, and
    unmaps before returning. Raises ShareError (a malformed descriptor, a handle the driver refuses, a mapping
    smaller than described)."""
    handle, nbytes, dtype, shape = check_descriptor(desc)
    out = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    if nbytes:
        torch.cuda.synchronize()
        ptr = ctypes.c_uint64()
        h = _Handle()
        ctypes.memmove(ctypes.addressof(h), handle, HANDLE_BYTES)
        _check(_fn("cuIpcOpenMemHandle")(ctypes.byref(ptr), h, ctypes.c_uint(1)), "cuIpcOpenMemHandle")
        try:
            base, size = ctypes.c_uint64(), ctypes.c_size_t()
            _check(_fn("cuMemGetAddressRange")(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr.value)),
                   "cuMemGetAddressRange")
            if base.value + size.value < ptr.value + nbytes:
                raise ShareError(f"the mapping holds {base.value + size.value - ptr.value} bytes, the descriptor "
                                 f"says {nbytes}")
            out.copy_(_view(torch, ptr.value, nbytes))
            torch.cuda.synchronize()
        finally:
            _fn("cuIpcCloseMemHandle")(ctypes.c_uint64(ptr.value))
    return out.view(getattr(torch, dtype)).reshape(shape)
