"""ATTACK on process containment: on its first call it double-forks a daemon that leaves the process group with
setsid() (out of reach of a process-group kill) and records its pid in daemon.pid, then computes honestly. The
harness, as subreaper, keeps the daemon below it: it is paused between requests and killed at the end. Must pass
correctness (its own answers are right) and leave no process behind."""
import os
import time

import torch

_started = []


def setup(M, N, seed, device="cuda"):
    x = torch.empty(M, N, device=device)
    return {"inputs": {"x": x, "y": torch.empty_like(x)}, "outputs": ["y"]}


def run_kernel(x, y):
    if not _started:
        _started.append(True)
        if os.fork() == 0:
            os.setsid()
            if os.fork():
                os._exit(0)
            with open("daemon.pid.tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace("daemon.pid.tmp", "daemon.pid")  # whole or absent, even if it is killed right here
            while True:
                time.sleep(0.05)
        # the kernel returns once the daemon has recorded itself (a fresh process kills it the moment it ends)
        for _ in range(500):
            if os.path.exists("daemon.pid"):
                break
            time.sleep(0.01)
    y.copy_(torch.softmax(x, dim=-1))
