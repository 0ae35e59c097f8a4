"""The request ncu wraps: one candidate call inside the NVTX range that ncu profiles, and nothing else."""

from __future__ import annotations

import os
import time
from typing import Any

from .kernels import Candidate

#: The NVTX range ncu is told to profile (``--nvtx-include kopt_target/``).
NVTX_RANGE = "kopt_target"


def mode_profile(req: dict[str, Any]) -> dict[str, Any]:
    """Under ncu: warm up (module load, JIT, torch's setup kernels stay outside the range), then one candidate
    call inside the NVTX range :data:`NVTX_RANGE` (the only one profiled), then one more call outside it.
    Returns ``at``: wall-clock stamps (``time.time()``, s) of the steps, for the gate's ``phase_s``.

    A profile started ahead (``req["go"]``: a file path) first creates its CUDA context (torch's, with one
    allocation: no kernel runs, so a measurement another process makes meanwhile is not disturbed), then waits for
    that file, which the gate creates once it holds the GPU lock (:func:`wait_for_go`)."""
    at = {"enter": time.time()}
    if req.get("go"):
        import torch

        torch.empty(1, device="cuda")  # the CUDA context, under ncu, before the wait: no kernel runs
        wait_for_go(req["go"], int(req.get("owner") or 0), req.get("go_sha", ""))
        at["go"] = time.time()
    cand = Candidate(req)
    torch = cand.torch
    at["inputs"] = time.time()
    cand.run()
    at["warmup"] = time.time()
    torch.cuda.nvtx.range_push(NVTX_RANGE)
    cand.launch()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    at["range"] = time.time()
    cand.run()
    at["exit"] = time.time()
    return {"at": at}


#: How often a profile started ahead looks for its go file, and for its owner (s).
GO_POLL_S = 0.002
OWNER_POLL_S = 1.0
#: The longest a profile started ahead waits for its go file (s); then it ends without a report.
GO_TIMEOUT_S = 3600.0


def _has_token(go: str, sha: str) -> bool:
    """True when the file ``go`` holds the token whose SHA-256 is ``sha``."""
    import hashlib

    try:
        with open(go, "rb") as f:
            return hashlib.sha256(f.read(256)).hexdigest() == sha
    except OSError:
        return False


def wait_for_go(go: str, owner: int, sha: str, timeout_s: float = GO_TIMEOUT_S) -> None:
    """Wait until the file ``go`` holds the token whose SHA-256 is ``sha`` (the request carries only the hash; the
    gate writes the token once it holds the GPU lock), looking every :data:`GO_POLL_S`: a go file anything else
    writes (the kernel's own processes work in the same folder and can read the request) lets nothing run. Raises
    HarnessError('runtime') when ``owner`` (the pytest process that started it; 0: not checked) has ended, or after
    ``timeout_s``."""
    from . import HarnessError

    start = last = time.monotonic()
    while not _has_token(go, sha):
        now = time.monotonic()
        if now - start > timeout_s:
            raise HarnessError("runtime", f"the profile started ahead waited {timeout_s:g} s for its turn")
        if owner and now - last > OWNER_POLL_S:
            last = now
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                raise HarnessError("runtime", "the pytest process that started this profile ended") from None
        time.sleep(GO_POLL_S)
