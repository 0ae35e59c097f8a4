"""S1/T12: caches the result by input pointer. Expected: STALE_OUTPUT (new values, same buffers)."""
import torch

def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


_cache = {}


def run_kernel(x, y):
    key = x.data_ptr()
    if key not in _cache:
        _cache[key] = torch.softmax(x, dim=-1).clone()
    y.copy_(_cache[key])
