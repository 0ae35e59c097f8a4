"""ATTACK on the clock: an honest Triton row softmax whose module, at import and again on every call, rewraps the
harness's kernel-only timing and ``torch.cuda.Event.elapsed_time`` in its own process so every time it reports is a
64th of the truth. Its outputs are right. Caught as TAMPERED: its process finds the functions it measures with
replaced (child/sentinels.py); beyond that, ncu's own duration of the call contradicts the timing (gates/ncu.py)."""
import sys

import torch
import triton
import triton.language as tl

SHRINK = 64.0


@triton.jit
def softmax_kernel(out_ptr, in_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(in_ptr + row * n_cols + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * n_cols + offs, num / tl.sum(num, axis=0), mask=mask)


def _shrunk(fn):
    if getattr(fn, "_shrunk", False):
        return fn

    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        if isinstance(out, dict):  # kernel-only records: every span and summary a 64th
            out = {k: ([x / SHRINK for x in v] if k == "spans_us" and isinstance(v, list) else
                       v / SHRINK if k in ("median_us", "p10_us", "p90_us") and isinstance(v, float) else v)
                   for k, v in out.items()}
        elif isinstance(out, float):
            out = out / SHRINK
        return out

    wrapper._shrunk = True
    return wrapper


def _rewrap():
    torch.cuda.Event.elapsed_time = _shrunk(torch.cuda.Event.elapsed_time)
    for name in ("pytest_kopt.child.cupti", "pytest_kopt.child.timing"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "cupti_samples"):
            module.cupti_samples = _shrunk(module.cupti_samples)


_rewrap()


def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    _rewrap()
    softmax_kernel[(x.shape[0],)](y, x, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
