"""Reference for examples/layernorm/layernorm.cu: layer norm over the last dim of x[M, N], in float64."""
import torch

# fp32 sums over N=4096 values of N(0,1) data err by ~1e-6 relative in the mean and variance; rsqrtf errs by
# ~2 ulp. fp16/bf16 arithmetic errs by ~1e-3, so these tolerances reject a lower-precision shortcut.
atol = 1e-4
rtol = 1e-4


def shapes(M, N, eps):
    """Buffer shapes and dtypes by solve() parameter name."""
    return {"x": ((M, N), "float32"), "w": ((N,), "float32"), "b": ((N,), "float32"), "y": ((M, N), "float32")}


def workload_model(M, N, eps):
    """About 8 FLOP per element (sum, subtract, square, add, and the output's subtract, two multiplies and an
    add); bytes_min reads x once and writes y once (fp32), plus w and b."""
    return {"flops": 8 * M * N, "bytes_min": 8 * M * N + 8 * N}


def reference(x, w, b, y, eps, **_):
    """Write the normalised, scaled and shifted x into y in place."""
    xd = x.double()
    mean = xd.mean(dim=-1, keepdim=True)
    var = xd.var(dim=-1, unbiased=False, keepdim=True)
    y.copy_(((xd - mean) / torch.sqrt(var + eps) * w.double() + b.double()).float())
