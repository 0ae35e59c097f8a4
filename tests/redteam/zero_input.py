"""S3: right answer, then zeroes its input. Expected: INPUT_MUTATED."""
import torch

def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    y.copy_(torch.softmax(x, dim=-1))
    x.zero_()
