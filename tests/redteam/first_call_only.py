"""T9: computes once, then replays that answer for every later call. Expected: INPUT_INDEPENDENT."""
import torch

def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


_answer = []


def run_kernel(x, y):
    if not _answer:
        _answer.append(torch.softmax(x, dim=-1).clone())
    y.copy_(_answer[0].to(y.device))
