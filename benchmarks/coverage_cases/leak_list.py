"""y = 2 x in Triton through a fresh tensor per call that run_kernel() keeps in a module-level list (a debugging
history left in): 4 n bytes more held after every call (2 MiB at n = 524288). Right output, honest timing; the
timing gate's LEAK check reads the growth (issue #39)."""
import torch
import triton
import triton.language as tl

_HISTORY = []  # every call's result, never emptied: the leak


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=mask), mask=mask)


def setup(n, seed, device="cuda"):
    """The buffers: x, n fp32 values (the harness fills them), and y, the output."""
    x = torch.empty(n, device=device, dtype=torch.float32)
    y = torch.empty_like(x)
    return {"inputs": {"x": x, "y": y}, "outputs": ["y"]}


def run_kernel(x, y):
    """Scale into a new tensor, copy it to y, and keep it."""
    n = x.numel()
    out = torch.empty_like(x)
    scale_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
    y.copy_(out)
    _HISTORY.append(out)
