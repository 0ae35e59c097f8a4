"""Row softmax in Triton: one program per row, the whole row in registers (N <= 64K)."""
import torch
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(in_ptr + row * in_stride + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    den = tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_stride + offs, num / den, mask=mask)


def setup(M, N, seed, device="cuda"):
    """The buffers: x of shape [M, N] fp32 and y, the output, of the same shape (the harness fills x's values)."""
    x = torch.empty(M, N, device=device, dtype=torch.float32)
    y = torch.empty_like(x)
    return {"inputs": {"x": x, "y": y}, "outputs": ["y"]}


def run_kernel(x, y):
    """Launch one program per row."""
    M, N = x.shape
    BLOCK = triton.next_power_of_2(N)
    softmax_kernel[(M,)](y, x, x.stride(0), y.stride(0), N, BLOCK=BLOCK, num_warps=4 if BLOCK <= 2048 else 8)
