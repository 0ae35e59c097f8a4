"""T3: turns the output into a tensor subclass (a lazy proxy could compute when read). Expected: NOT_A_TENSOR."""
import torch

def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


class Lazy(torch.Tensor):
    pass


def run_kernel(x, y):
    y.copy_(torch.softmax(x, dim=-1))
    y.__class__ = Lazy
