"""Reference of the transpose drive (benchmarks/drive_plans/transpose_h200.py): y[N, M] = x[M, N]^T, fp32.

A transpose moves values and computes nothing, so every candidate must reproduce them bit for bit (atol = rtol = 0).
"""
atol = 0.0
rtol = 0.0
# shapes that are no multiple of a tile or of 4 (the float4 paths' scalar tails), beside the timed shape
extra_dims = [{"M": 33, "N": 70}, {"M": 1, "N": 5}, {"M": 130, "N": 3}]


def shapes(M, N):
    """x is read, y written."""
    return {"x": ((M, N), "float32"), "y": ((N, M), "float32")}


def workload_model(M, N):
    """No arithmetic; x read once and y written once: 8*M*N bytes."""
    return {"flops": 0, "bytes_min": 8 * M * N}


def reference(x, y, **_):
    y.copy_(x.t())
