"""ATTACK on --kopt-timing graph: does its work except while a CUDA graph is being captured, so the timed graph holds
only the L2 flushes and the kernel looks free. Expected: the timing gate's output check (run on the graph's own
results) fails INCORRECT_NUMERICAL. Correct in eager calls, so correctness passes."""
import torch


def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    y.copy_(torch.softmax(x, dim=-1))
