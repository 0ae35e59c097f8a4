"""A field problem's code that asks for CUDA on a machine without it (GPU MODE's ``device="cuda"``, a KernelBench
``.cuda()``): one clear ``needs_gpu`` error, which the pytest process turns into a skip, never a failure."""

from __future__ import annotations

from . import HarnessError

#: Substrings of the errors torch raises when code asks for CUDA where there is none.
NO_CUDA = ("Found no NVIDIA driver", "Torch not compiled with CUDA", "No CUDA GPUs are available",
           "CUDA driver initialization failed", "no kernel image", "cudaGetDeviceCount")


def gpu_only(exc: BaseException, what: str, short: str | None = None) -> HarnessError:
    """``needs_gpu`` when ``exc`` is code asking for CUDA on a machine without it, else a contract error naming
    ``what`` (the call that raised, e.g. ``/path/problem.py: get_inputs()``). The ``needs_gpu`` message is one short
    line, the same for every case (``short``, e.g. ``reference.py: generate_input()``; default ``what``): it is the
    skip reason of every GPU item, and the error itself (torch's text, the call's arguments) is in the traceback
    the request's result carries."""
    import torch

    text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if not torch.cuda.is_available() and (any(s in text for s in NO_CUDA) or "cuda" in text.lower()):
        return HarnessError("needs_gpu", f"{short or what} asks for CUDA (device=\"cuda\" in the problem's code)")
    return HarnessError("contract", f"{what} raised {text[:500]}")
