"""Arrays that cross from a harness process to another on the host: numpy copies for an ``.npz`` (on the CPU, or
where CUDA IPC is refused; on a GPU arrays cross by :mod:`pytest_kopt.child.share`)."""

from __future__ import annotations

from typing import Any


def to_numpy(torch: Any, t: Any) -> Any:
    """A host numpy copy of tensor ``t`` (bf16 and fp8 as float32, which holds each of their values exactly)."""
    t = t.detach()
    if t.dtype in (torch.bfloat16, getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)):
        t = t.float()
    return t.cpu().numpy().copy()  # on the CPU .numpy() shares memory with the (reused) buffer


#: A call's outputs that usually repeat another call's, bit for bit: the second call on set A (``cand2``) the first
#: one's, set B in new buffers (``candC``) set B in the same buffers (``candB``). The candidate's process keeps
#: only the first of an equal pair and names it in ``same_as``; the judge honours no other pair.
REPEATS = (("cand2__", "cand1__"), ("candC__", "candB__"))
