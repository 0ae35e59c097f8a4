"""Row softmax in Triton, ROWS rows per program as one [ROWS, BLOCK] tile (the whole row in registers, N <= 64K),
WARPS warps per program, the exponential as exp or as exp2 of x * log2(e) (EXP2). ROWS, WARPS and EXP2 are set by the
script that writes the branches (benchmarks/throughput.py --problem softmax)."""
import torch
import triton
import triton.language as tl

ROWS = 1
WARPS = 4
EXP2 = False


@triton.jit
def softmax_rows_kernel(out_ptr, in_ptr, in_stride, out_stride, n_rows, n_cols, ROWS: tl.constexpr,
                        BLOCK: tl.constexpr, EXP2: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(in_ptr + rows[:, None] * in_stride + cols[None, :], mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=1)[:, None]
    num = tl.exp2(x * 1.4426950408889634) if EXP2 else tl.exp(x)
    den = tl.sum(num, axis=1)[:, None]
    tl.store(out_ptr + rows[:, None] * out_stride + cols[None, :], num / den, mask=mask)


def setup(M, N, seed, device="cuda"):
    """x of shape [M, N] fp32 (the harness fills its values) and y, the output, of the same shape."""
    x = torch.empty(M, N, device=device, dtype=torch.float32)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    """One program per ROWS rows."""
    M, N = x.shape
    softmax_rows_kernel[(triton.cdiv(M, ROWS),)](y, x, x.stride(0), y.stride(0), M, N, ROWS=ROWS,
                                                  BLOCK=triton.next_power_of_2(N), EXP2=EXP2,
                                                  num_warps=WARPS)
