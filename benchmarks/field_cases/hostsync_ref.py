"""Reference for benchmarks/field_cases/hostsync.cu: softmax over the last dim of x[M, N], in float64."""
import torch

atol = 1e-6
rtol = 1e-4


def shapes(M, N):
    """Buffer shapes and dtypes by solve() parameter name."""
    return {"x": ((M, N), "float32"), "y": ((M, N), "float32")}


def workload_model(M, N):
    """About 5 FLOP per element; bytes_min reads x once and writes y once (fp32)."""
    return {"flops": 5 * M * N, "bytes_min": 8 * M * N}


def reference(x, y, **_):
    """Write softmax(x) into y in place."""
    y.copy_(torch.softmax(x.double(), dim=-1).float())
