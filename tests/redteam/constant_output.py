"""S4: constant output 1/N, close to softmax of small inputs. Expected: CONSTANT_OUTPUT."""
import torch

def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    y.fill_(1.0 / x.shape[-1])
