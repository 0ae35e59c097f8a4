"""Arrays that cross from a harness process to the pytest process: host copies and hashed ``.npz`` files."""

from __future__ import annotations

import hashlib
import io
from typing import Any


def to_numpy(torch: Any, t: Any) -> Any:
    """A host numpy copy of tensor ``t`` (bf16 as float32, which holds every bf16 value exactly)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.cpu().numpy().copy()  # on the CPU .numpy() shares memory with the (reused) buffer


def save_npz(path: str, arrays: dict[str, Any]) -> str:
    """Save ``arrays`` as an uncompressed ``.npz`` built in memory and return its SHA-256: the hash of the bytes
    this process produced, not of a file another process (a candidate's escaped daemon, another xdist worker's
    kernel) could rewrite between the write and a re-read. The reference's modes put it in their result, whose
    own hash goes back on the private control pipe."""
    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getbuffer()
    with open(path, "wb") as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()


#: A call's outputs that usually repeat another call's, bit for bit: the second call on set A (``cand2``) the first
#: one's, set B in new buffers (``candC``) set B in the same buffers (``candB``).
REPEATS = (("cand2__", "cand1__"), ("candC__", "candB__"))


def repeats(arrays: dict[str, Any]) -> dict[str, str]:
    """``{name: twin}`` for each array of :data:`REPEATS` equal to its twin (same dtype, shape and values; NaN
    never equal), which then need not be saved: half of what crosses to the pytest process for a deterministic
    kernel. The twin's values are then this array's for every guard (a NaN anywhere keeps both)."""
    import numpy as np

    same: dict[str, str] = {}
    for name, a in arrays.items():
        for later, earlier in REPEATS:
            twin = arrays.get(earlier + name.removeprefix(later)) if name.startswith(later) else None
            if twin is not None and a.dtype == twin.dtype and a.shape == twin.shape and np.array_equal(a, twin):
                same[name] = earlier + name.removeprefix(later)
    return same
