"""Crash: the process aborts (as after a device-side assert). Expected: RUNTIME_ERROR, session survives."""
import torch

def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    import os
    os.abort()
