"""ATTACK (for Python/Triton candidates): setup() builds a smaller problem than the dims describe (x is M x 1, so
softmax is all ones and trivially fast). Expected: CONTRACT_ERROR from the reference's shapes() check."""
import torch


def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, 1, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    y.fill_(1.0)
