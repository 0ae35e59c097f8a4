"""A problem in GPU MODE's format: out = the sum of each row of a [rows, cols] fp32 matrix. generate_input builds the
data on the GPU where there is one (on the CPU otherwise, so its correctness runs there too)."""
import torch


def generate_input(rows: int, cols: int, seed: int):
    """a [rows, cols] fp32 drawn from N(0, 1)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(rows, cols, generator=gen, device=device)


def ref_kernel(data):
    """The row sums, accumulated in float64, as fp32."""
    return data.double().sum(1).float()
