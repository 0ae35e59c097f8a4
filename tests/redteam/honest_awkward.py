"""HONEST, awkward: registers a torch.library operator at import (importing the file twice in one process would
fail), removes the log its stdout goes to, and forks a child that idles. Must pass, and leave no process behind."""
import os
import time

import torch

lib = torch.library.Library("kopt_redteam_awkward", "DEF")
lib.define("softmax_(Tensor x, Tensor(a!) y) -> ()")


def _impl(x, y):
    y.copy_(torch.softmax(x, dim=-1))


lib.impl("softmax_", _impl, "CompositeExplicitAutograd")

if os.fork() == 0:  # kopt_redteam_idler
    time.sleep(300)
    os._exit(0)


def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    torch.ops.kopt_redteam_awkward.softmax_(x, y)
    target = os.readlink("/proc/self/fd/1")
    if target.endswith(".log") and os.path.exists(target):
        os.unlink(target)
