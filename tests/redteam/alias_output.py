"""Output aliasing: re-points the output at a new tensor instead of writing it. Expected: OUTPUT_REPLACED."""
import torch

def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    y.set_(torch.softmax(x, dim=-1))
