"""Reference for examples/gemm/gemm.cu: C = A @ B in float64, rounded to float32."""
import torch

# fp32 accumulation over K=4096 of N(0,1) products errs by ~1e-3 at worst; TF32 or fp16 arithmetic errs by
# ~1e-2 or more, so these tolerances accept honest fp32 and reject a lower-precision shortcut.
atol = 5e-3
rtol = 1e-4
# reg_tiled.cuh launches N/128 x M/128 blocks of 128x128 tiles with no bounds checks and steps K by 8 with 128-bit
# loads: it handles only these sizes, so kopt's edge shapes (M=4097, N=37, ...) that break them are excluded
constraints = {"M": {"multiple_of": 128}, "N": {"multiple_of": 128}, "K": {"multiple_of": 8}}


def shapes(M, N, K):
    """Buffer shapes and dtypes by solve() parameter name."""
    return {"A": ((M, K), "float32"), "B": ((K, N), "float32"), "C": ((M, N), "float32")}


def workload_model(M, N, K):
    """2*M*N*K FLOP; bytes_min reads A and B once and writes C once (fp32)."""
    return {"flops": 2 * M * N * K, "bytes_min": 4 * (M * K + K * N + M * N)}


def reference(A, B, C, M, N, K, **_):
    """Write A @ B into C in place."""
    C.copy_((A.view(M, K).double() @ B.view(K, N).double()).float().view_as(C))
