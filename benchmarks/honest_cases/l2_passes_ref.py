"""Reference for l2_passes.cu: y[i] = sum over p < P of x[(i + 4099 p) mod N], accumulated in float64."""
import torch

# P float32 additions of terms of magnitude ~1: an error of about P * 6e-8 times the sum's magnitude (sqrt(P)).
atol = 1e-3
rtol = 1e-4


def shapes(N, P):
    """Buffer shapes and dtypes by solve() parameter name."""
    return {"x": ((N,), "float32"), "y": ((N,), "float32")}


def workload_model(N, P):
    """One addition per term read; bytes_min reads x and writes y once (the P passes hit the L2)."""
    return {"flops": N * P, "bytes_min": 8 * N}


def reference(x, y, N, P, **_):
    """Write the P-pass gather of x into y."""
    idx = torch.arange(N, device=x.device, dtype=torch.int64)
    acc = torch.zeros(N, device=x.device, dtype=torch.float64)
    xd = x.double()
    for p in range(P):
        acc += xd[(idx + 4099 * p) % N]
    y.copy_(acc.float())
