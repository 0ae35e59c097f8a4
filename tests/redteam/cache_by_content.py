"""S1 by content: right output every time (a timing attack only). Correctness must PASS; the timing
gate defeats it by giving every timed call fresh values."""
import torch

def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


_cache = {}


def run_kernel(x, y):
    key = hash(x.cpu().numpy().tobytes())
    if key not in _cache:
        _cache[key] = torch.softmax(x, dim=-1).clone()
    y.copy_(_cache[key])
