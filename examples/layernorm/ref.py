"""Reference for examples/layernorm/layernorm.cu: layer norm over the last dim of x[M, N], in float64."""
import torch

# A plain fp32 kernel sums each row of N=4096 in sequence: on small-integer rows the variance's rounding errors
# add up in one direction, to ~1e-4 relative (measured on an H200: 3.0e-4 abs on outputs of ~15), so the tolerance
# is 2e-3 abs + 1e-3 rel. bf16 arithmetic errs by ~4e-3 relative (~6e-2 on such outputs) and is still caught.
atol = 2e-3
rtol = 1e-3


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
