"""S2: hands back whatever memory torch.empty returns (hoping for the reference's freed output).
Expected: a failure (the reference runs in another process and outputs are poisoned)."""
import torch

def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    y.copy_(torch.empty_like(y))
