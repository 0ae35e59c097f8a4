"""A problem in GPU MODE's format: out = 2 * tril(a) for a square fp32 matrix. generate_input builds the data on
the GPU, as GPU MODE problems do; the data tuple carries the output buffer, which the kernel writes and returns."""
import torch


def generate_input(size: int, seed: int):
    """(a [size, size] fp32 drawn from N(0, 1), out [size, size] fp32 to be written), on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(size, size, generator=gen, device="cuda")
    return a, torch.empty(size, size, device="cuda")


def ref_kernel(data):
    """Write 2 * tril(a) into out and return it."""
    a, out = data
    out.copy_(2 * torch.tril(a))
    return out
