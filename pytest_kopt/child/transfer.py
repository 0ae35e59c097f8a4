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
