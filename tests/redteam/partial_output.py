"""S9/partial: skips the last row. Expected: UNWRITTEN (the poison is still there after two calls)."""
import torch

def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    y[:-1].copy_(torch.softmax(x[:-1], dim=-1))
