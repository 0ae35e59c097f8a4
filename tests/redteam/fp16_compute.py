"""S7: computes an fp32 task from fp16-rounded inputs. Expected: INCORRECT_NUMERICAL at ref_softmax's tolerance."""
import torch

def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    y.copy_(torch.softmax(x.half().float(), dim=-1))
