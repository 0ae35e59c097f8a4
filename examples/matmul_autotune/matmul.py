"""Triton matmul with @triton.autotune over four tile configs, returning C [M, N] (fp32) = A [M, K] @ B [K, N]
(fp16 inputs, fp32 accumulation). kopt lets Triton tune once in the compile gate (on a GPU) and runs that config in
every later gate; without a GPU every config is compiled ahead of time and the first is checked."""
import torch
import triton
import triton.language as tl

CONFIGS = [triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=w, num_stages=s)
           for bm, bn, bk, w, s in ((64, 64, 32, 4, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
                                    (128, 128, 64, 8, 3))]


@triton.autotune(configs=CONFIGS, key=["M", "N", "K"])
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * sam + (k0 + rk)[None, :] * sak,
                    mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k0 + rk)[:, None] * sbk + rn[None, :] * sbn,
                    mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def setup(M, N, K, seed, device="cuda"):
    """A [M, K] and B [K, N] fp16 (values drawn by the harness); C is returned by run_kernel."""
    a = torch.empty(M, K, device=device, dtype=torch.float16)
    b = torch.empty(K, N, device=device, dtype=torch.float16)
    return {"inputs": {"A": a, "B": b}, "outputs": ["C"]}


def run_kernel(A, B):
    """C = A @ B, one program per BM x BN tile of the config the autotuner picked."""
    M, K = A.shape
    N = B.shape[1]
    C = torch.empty(M, N, device=A.device, dtype=torch.float32)
    grid = lambda meta: (triton.cdiv(M, meta["BM"]), triton.cdiv(N, meta["BN"]))  # noqa: E731
    matmul_kernel[grid](A, B, C, M, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1), C.stride(0),
                        C.stride(1))
    return C
