"""ATTACK on the warm harness process: writes an early "done" on the control pipe it finds in argv, then computes
honestly. Must fail (RUNTIME_ERROR: the harness broke its protocol), never shift the answers of later requests."""
import builtins
import os
import sys

import torch


def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    if len(sys.argv) > 2 and sys.argv[1] == "--serve" and not getattr(builtins, "_kopt_done", False):
        builtins._kopt_done = True
        os.write(int(sys.argv[2]), b"done 1 0\n")
    y.copy_(torch.softmax(x, dim=-1))
